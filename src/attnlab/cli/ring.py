"""``attnlab bench ring``: sequence parallelism on this machine — peak memory per process and time
per training step against the sequence length, for 1, 2 and 4 processes (ring attention over
gloo), optionally under a memory cap per process."""

from __future__ import annotations

import typer

from .common import int_list, out, records_json, track
from .errors import cpu_device, usage_error
from .measured import measured
from .options import blocks_option, device_option, heads_option, width_option
from .tables import table

__all__ = ["bench_ring"]


def _bench_ring(
    *,
    lengths: str = typer.Option("2048,4096,8192,16384,32768", help="Comma-separated sequence lengths."),
    processes: str = typer.Option(
        "1,2,4", help="Comma-separated process counts P (1: the plain layer in one process)."),
    embed_dim: int = width_option(64),
    num_heads: int = heads_option(4),
    num_layers: int = blocks_option(2, "Encoder blocks."),
    causal: bool = typer.Option(
        False, "--causal/--bidirectional", help="Causal blocks (zig-zag layout) or not (contiguous)."),
    repeats: int = typer.Option(2, min=1, help="Timed steps per configuration (after a warm-up and a profiled step)."),
    memory_cap: float = typer.Option(
        160.0, "--memory-cap", min=0.0,
        help="MiB each process may allocate beyond its start-up (0: no cap)."),
    threads: int = typer.Option(1, min=1, help="torch threads per process."),
    device: str = device_option(help="cpu (auto: the CPU too); the processes talk over gloo, so a GPU is refused."),
    output: str | None = None,
) -> dict:
    """Ring attention: memory per process and step time against sequence length, P = 1, 2, 4 processes."""
    cpu_device(device, "bench ring spawns its processes on the CPU (ring attention over gloo, memory capped with "
                       "setrlimit)")
    ns = int_list("--lengths", lengths, minimum=1)
    ps = int_list("--processes", processes, minimum=1)
    if embed_dim % num_heads:
        usage_error(f"--embed-dim {embed_dim} must be divisible by --num-heads {num_heads}")
    from ..studies import ring

    with track("ring attention", len(ns) * len(ps), output, records_json) as tracker:
        ring.run(ns, ps, embed_dim=embed_dim, num_heads=num_heads, num_layers=num_layers, causal=causal,
                 repeats=repeats, memory_cap=int(memory_cap * 2**20), threads=threads,
                 on_record=tracker.on_record(lambda r: f"P={r.processes}, N={r.length}: {r.status}"))
    return records_json(tracker.records)


def _checked(data: dict) -> dict:
    for r in data["records"]:
        for f in ("processes", "length", "status", "seconds", "peak_bytes", "comm_share", "memory_cap", "dim",
                  "layers"):
            if f not in r:
                raise KeyError(f)
    return data


def _speed(ratio: float) -> str:
    return f"{ratio:.2f}x faster" if ratio >= 1 else f"{1 / ratio:.2f}x slower"


def _report(recs: list[dict]) -> None:
    if not recs:
        return
    r0 = recs[0]
    cap = f", each process capped at {r0['memory_cap'] / 2**20:.0f} MiB" if r0["memory_cap"] else ""
    t = table(f"Encoder d={r0['dim']}, {r0['layers']} layers, {r0['heads']} heads, "
              f"{'causal' if r0['causal'] else 'bidirectional'}, one sequence, forward + backward{cap} "
              f"(median of {r0['repeats']} steps)",
              ["length", "processes", "status", "s per step", "vs P=1", "peak MiB per process", "vs P=1",
               "communication share"])
    for n in dict.fromkeys(r["length"] for r in recs):
        rows = [r for r in recs if r["length"] == n]
        one = next((r for r in rows if r["processes"] == 1 and r["status"] == "ok"), None)
        for r in rows:
            ok = r["status"] == "ok"
            speed = _speed(one["seconds"] / r["seconds"]) if ok and one and r is not one else "-"
            mem = (f"{r['peak_bytes'] / one['peak_bytes']:.2f}x"
                   if ok and one and r is not one and r["peak_bytes"] and one["peak_bytes"] else "-")
            status = "skipped *" if r["status"] == "skipped" else r["status"]
            t.add_row(f"{n:,}", str(r["processes"]), status, f"{r['seconds']:.2f}" if ok else "-", speed,
                      f"{r['peak_bytes'] / 2**20:.1f}" if ok and r["peak_bytes"] else "-", mem,
                      f"{r['comm_share']:.1%}" if ok and r["processes"] > 1 else "-")
    out.print(t)
    if any(r["status"] == "skipped" for r in recs):
        out.print("* not run: out of memory at a shorter length")


bench_ring = measured(
    "bench ring", draw="ring.plot_ring", show=lambda data: _report(data["records"]), checked=_checked,
    plot_help="Also draw memory per process and time per step against the length to this PNG.")(_bench_ring)
