"""``attnlab bench device``: a device check anyone can run (:mod:`attnlab.studies.device_check`):
parity of every variant against the float64 reference, speed against PyTorch's fused kernel, and
the default arena's lookup task against the CPU's stored scores, in one JSON file."""

from __future__ import annotations

import typer

from .common import emit_json, err, int_list, out, write_json
from .errors import device_or_fail
from .options import device_option, json_option, output_option
from .tables import fmt_x, table

__all__ = ["bench_device"]


def bench_device(
    device: str = device_option(),
    lengths: str | None = typer.Option(
        None, help="Comma-separated lengths of the speed section (default: 4096,16384,65536; the CPU: 512,1024)."),
    arena: bool = typer.Option(
        True, "--arena/--no-arena",
        help="Train the default arena's lookup task here and set its scores beside the CPU's stored ones."),
    speed: bool = typer.Option(
        True, "--speed/--no-speed", help="Time forward + backward of every variant at --lengths."),
    as_json: bool = json_option("Print the results as one JSON object instead of tables."),
    output: str | None = output_option("Write the results as JSON to this file (rewritten after each section)."),
) -> None:
    """Check this device: every variant against the float64 reference (fp32, bf16), its speed, the arena's lookup
    scores."""
    from ..studies.device_check import run

    where = device_or_fail(device)
    ns = None if lengths is None else int_list("--lengths", lengths, minimum=1, what="positive integers")

    def say(line: str) -> None:
        err.print(line, markup=False, highlight=False, soft_wrap=True)

    data = run(where, lengths=ns, arena=arena, speed_section=speed, say=say,
               on_update=(lambda d: write_json(output, d)) if output else None)
    if emit_json(data, as_json):
        return
    _tables(data)
    if output:
        out.print(f"results: {output}")
    else:
        err.print("no results file written: add -o FILE to keep the JSON (or --json to print it)", highlight=False)


def _tables(data: dict) -> None:
    env = data["environment"]
    libs = ", ".join(f"{k} {env[k] or 'absent'}" for k in ("triton", "fla") if k in env)
    out.print(f"device check on {env['device']} ({env['device_name']}): torch {env['torch']}, CUDA {env['cuda'] or '-'}"
              + (f", {libs}" if libs else "") + f"; {data['wall_seconds']:.0f} s", highlight=False)
    _parity_table(data["parity"], off_cpu=env["device"] != "cpu")
    if data["speed"] is not None:
        _speed_table(data["speed"], data["settings"])
    if data["arena"] is not None:
        _arena_table(data["arena"])


def _err(row: dict | None, prefix: str = "") -> str:
    if row is None:
        return ""
    if row.get("error"):
        return "failed"
    worst = max(row[f"{prefix}output_error"], row[f"{prefix}grad_error"], key=lambda e: (e != e, e))  # NaN is the worst
    return f"{worst:.1e}" + ("" if prefix or row["within"] else " !")


def _parity_table(rows: list[dict], off_cpu: bool) -> None:
    cols = ["variant", "form", "fp32", "bf16", *(["cpu bf16"] if off_cpu else []), "backend fp32", "backend bf16"]
    t = table("parity against float64 on the CPU: largest difference of output or input gradient, relative "
              "(! over the tolerance, fp32 5e-3, bf16 6e-2)", cols,
              left=("variant", "form", "backend fp32", "backend bf16"))
    keyed = {(r["variant"], r["causal"], r["precision"]): r for r in rows}
    for variant, causal in dict.fromkeys((r["variant"], r["causal"]) for r in rows):
        fp32, bf16 = keyed.get((variant, causal, "fp32")), keyed.get((variant, causal, "bf16"))
        t.add_row(variant, "causal" if causal else "bidirectional", _err(fp32), _err(bf16),
                  *([_err(bf16, "cpu_")] if off_cpu else []),
                  fp32["backend"] if fp32 else "", bf16["backend"] if bf16 else "")
    out.print(t)
    failed = [f"{r['variant']} {r['precision']}: {r['error']}" for r in rows if r["error"]]
    for line in failed:
        out.print(f"failed: {line}", highlight=False)


def _cell(r: dict | None) -> str:
    if r is None:
        return ""
    return f"{r['seconds'] * 1e3:.1f}" if r["status"] == "ok" else r["status"]


def _speed_table(rows: list[dict], settings: dict) -> None:
    t = table(f"forward + backward, B=1, {settings['speed_heads']} heads of {settings['speed_head_dim']} "
              "(ms: median; MiB: peak of one bf16 call; x sdpa: time over scaled_dot_product_attention's alone, "
              "causal, same precision)",
              ["variant", "N", "fp32 ms", "bf16 ms", "bf16 MiB", "fp32 x sdpa", "bf16 x sdpa"], no_wrap=True)
    keyed = {(r["variant"], r["n"], r["precision"]): r for r in rows}
    notes: dict[str, str] = {}
    for variant, n in dict.fromkeys((r["variant"], r["n"]) for r in rows):
        fp32, bf16 = keyed.get((variant, n, "fp32")), keyed.get((variant, n, "bf16"))
        if all(r is None or r["status"] == "skipped" for r in (fp32, bf16)):
            notes.setdefault(variant, f"N>={n} skipped: {(fp32 or bf16 or {}).get('note')}")
            continue
        mib = "" if bf16 is None or bf16.get("peak_bytes") is None else f"{bf16['peak_bytes'] / 2**20:.0f}"
        t.add_row(variant, str(n), _cell(fp32), _cell(bf16), mib, fmt_x(fp32 and fp32["vs_sdpa"]),
                  fmt_x(bf16 and bf16["vs_sdpa"]))
    out.print(t)
    for variant, note in notes.items():
        out.print(f"{variant}: {note}", highlight=False)


def _arena_table(a: dict) -> None:
    diff = lambda x: "" if x is None else f"{x:+.3f}"  # noqa: E731
    score = lambda x: "" if x is None else f"{x:.3f}"  # noqa: E731
    t = table(f"arena, task lookup (preset quick, {a['runs']} runs, {a['failed']} failed, {a['wall_seconds']:.0f} s "
              f"here): score here against the CPU's ({a['reference'] or 'no stored scores found'})",
              ["variant", "here", "cpu", "difference"])
    for v in a["variants"]:
        t.add_row(v["variant"], score(v["device"]), score(v["cpu"]), diff(v["difference"]))
    out.print(t)
    out.print(a["note"], highlight=False)
