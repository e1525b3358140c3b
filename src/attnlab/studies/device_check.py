"""A device check anyone can run (``attnlab bench device``): what this device computes, how close it is to the float64
reference, how fast, and whether the arena scores as on the CPU. Four sections, one results dict:

* ``environment``: torch, CUDA, the device in words (:func:`attnlab.devices.describe`), and on CUDA the versions of
  Triton and fla where they import.
* ``parity``: every registered variant as a small layer (E=64, 4 heads, the arena's options,
  :data:`attnlab.arena.presets.VARIANT_OPTIONS`) run in float64 on the CPU as the reference, then with the same weights
  on the device in float32, and in float32 under bfloat16 autocast; B=2, N=128, bidirectional and, where the variant has
  one, causal. A row holds the largest difference of the output and of the input's gradient (against a random cotangent)
  over the reference's largest magnitude, and the backend serving the variant in that dtype
  (:func:`attnlab.efficient.serving.serving`). Off the CPU the CPU's differences stand beside them
  (``cpu_output_error``, ``cpu_grad_error``): a bfloat16 error as large there (reformer: a query rounded to bfloat16 can
  hash to another bucket) is not the device's fault.
* ``speed``: forward + backward of each variant's layer (B=1; 16 heads of 64 off the CPU, 4 of 16 on it; each variant's
  settings for long sequences, :attr:`attnlab.efficient.Budget.long`) at each length, float32 and bf16 autocast, beside
  :func:`torch.nn.functional.scaled_dot_product_attention` alone, causal, on the same shapes: median seconds of a few
  calls after a warm-up, synchronised, and the peak memory of one call. A variant out of memory (or failing) at a length
  skips its longer lengths, and so does one whose time, scaled linearly to the next length, passes ``cell_seconds``;
  past the section's deadline every cell left is recorded as skipped.
* ``arena``: the default arena's ``lookup`` task (:func:`attnlab.arena.plan`, preset ``quick``) trained on the device
  into a temporary folder, each variant's score beside the CPU's stored in ``benchmarks/results/arena-repro-*.json``.
  The runs are budgeted in steps, so the scores are comparable across devices, but not bitwise equal: another device
  sums in another order."""

from __future__ import annotations

import copy
import gc
import json
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
import torch.nn.functional as F

from .. import efficient
from ..devices import describe, peak_memory, reset_peak_memory, resolve, synchronize
from ..profiling import peak_bytes

__all__ = ["CELL_SECONDS", "CPU_LENGTHS", "CUDA_LENGTHS", "SPEED_SECONDS", "TOLERANCE", "TOTAL_SECONDS", "arena_check",
           "compare_with_cpu", "cpu_reference", "environment", "parity", "run", "speed", "speed_shape"]

CUDA_LENGTHS = (4096, 16384, 65536)
"""The speed section's sequence lengths off the CPU."""

CPU_LENGTHS = (512, 1024)
"""The speed section's sequence lengths on the CPU."""

CELL_SECONDS = 10.0
"""A variant whose time at a length, scaled linearly to the next, passes this skips its longer lengths."""

SPEED_SECONDS = 360.0
"""The speed section's deadline, after its start: the cells left then are recorded as skipped."""

TOTAL_SECONDS = 450.0
"""The whole check's deadline: the speed section (the last) ends by then, whatever its own."""

TOLERANCE = {"fp32": 5e-3, "bf16": 6e-2}
"""The difference a parity row stays within (relative to the reference's largest magnitude):
:data:`attnlab.core.kernels.TOLERANCE` of the dtype (float32 allows TF32 products)."""

PRECISIONS = ("fp32", "bf16")
_PARITY = {"batch": 2, "length": 128, "embed_dim": 64, "num_heads": 4}
Say = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")


def _out_of_memory(e: BaseException) -> bool:
    return isinstance(e, (torch.OutOfMemoryError, MemoryError)) or (isinstance(e, RuntimeError) and "out of memory" in str(e))


def _free(device: torch.device, collect: bool = True) -> None:
    """Give the device's cached memory back (after ``collect``: what a failed call left in cycles)."""
    if collect:
        gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def environment(device: torch.device) -> dict:
    """Versions and the device: torch, CUDA, Python, attnlab, and on CUDA its properties and the
    versions of Triton and fla (None where they do not import; imported only on CUDA)."""
    from .. import __version__

    env = {"device": str(device), "device_name": describe(device), "torch": torch.__version__, "cuda": torch.version.cuda,
           "python": platform.python_version(), "platform": platform.platform(), "attnlab": __version__,
           "threads": torch.get_num_threads(), "float32_matmul_precision": torch.get_float32_matmul_precision()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(capability=f"sm_{props.major}{props.minor}", memory_bytes=int(props.total_memory),
                   cudnn=torch.backends.cudnn.version())
        for lib in ("triton", "fla"):
            try:
                env[lib] = str(getattr(__import__(lib), "__version__", "unknown"))
            except Exception:  # not installed, or fails to import on this machine: recorded as absent
                env[lib] = None
    return env


def _relative(a: torch.Tensor, ref: torch.Tensor) -> float:
    ref = ref.detach().double().cpu()
    return float((a.detach().double().cpu() - ref).abs().max()) / max(float(ref.abs().max()), 1e-12)


def _parity_options(name: str, causal: bool) -> dict:
    from ..arena.presets import VARIANT_OPTIONS

    opts = dict(VARIANT_OPTIONS.get(name, {}))
    if name == "reformer":
        opts["seed"] = 0  # the same hash rotations in every run
    if efficient.budget(name).max_len:
        opts["max_len"] = _PARITY["length"]
    if causal:
        opts["causal"] = True
    return opts


def _errors(layer, x, cot, ref_out, ref_grad, device: torch.device, precision: str) -> tuple[float, float]:
    """Output and input-gradient differences of ``layer`` (a float32 copy) on ``device``."""
    m = copy.deepcopy(layer).float().to(device)
    xd = x.detach().float().to(device).requires_grad_(True)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
        out = m(xd).output
    (out.float() * cot.float().to(device)).sum().backward()
    synchronize(device)
    return _relative(out, ref_out), _relative(xd.grad, ref_grad)


def _parity_rows(name: str, causal: bool, device: torch.device, served: dict) -> list[dict]:
    """The fp32 and bf16 rows of one variant in one form (causal or not)."""
    p = _PARITY
    torch.manual_seed(0)
    ref = efficient.create(name, embed_dim=p["embed_dim"], num_heads=p["num_heads"],
                           **_parity_options(name, causal)).double()
    layer = copy.deepcopy(ref)  # before any call: a layer that counts its calls starts where the reference did
    g = torch.Generator().manual_seed(1)
    x = torch.randn(p["batch"], p["length"], p["embed_dim"], generator=g, dtype=torch.float64, requires_grad=True)
    ref_out = ref(x).output
    cot = torch.randn(ref_out.shape, generator=g, dtype=torch.float64)
    (ref_out * cot).sum().backward()
    rows = []
    for precision in PRECISIONS:
        s = served[precision]
        row = {"variant": name, "causal": causal, "precision": precision, "output_error": None, "grad_error": None,
               "tolerance": TOLERANCE[precision], "within": None, "backend": s.backend, "inference": s.inference,
               "why": s.why, "error": None}
        try:
            row["output_error"], row["grad_error"] = _errors(layer, x, cot, ref_out, x.grad, device, precision)
            # NaN: not within
            row["within"] = all(e <= TOLERANCE[precision] for e in (row["output_error"], row["grad_error"]))
        except Exception as e:  # the device refused or failed: recorded, the check goes on
            row["error"] = "out of memory" if _out_of_memory(e) else _first_line(e)
        if row["error"]:
            _free(device)
        if device.type != "cpu":
            row["cpu_output_error"], row["cpu_grad_error"] = _errors(layer, x, cot, ref_out, x.grad,
                                                                     torch.device("cpu"), precision)
        rows.append(row)
    return rows


def parity(device, variants: Iterable[str] | None = None, say: Say = _quiet) -> list[dict]:
    """The parity rows (module docstring) of ``variants`` (default: every registered one) on ``device``."""
    from ..efficient.serving import Serving, serving

    def served_by(name: str, precision: str) -> Serving:
        try:
            return serving(name, device, torch.float32 if precision == "fp32" else torch.bfloat16)
        except Exception as e:  # checking a kernel failed outside the check's own guard: recorded, the check goes on
            return Serving(name, "unknown", f"finding the backend raised {_first_line(e)}")

    device = resolve(device)
    rows: list[dict] = []
    for name in efficient.names() if variants is None else variants:
        served = {p: served_by(name, p) for p in PRECISIONS}
        forms = (False, True) if efficient.capabilities(name).causal is not None else (False,)
        for causal in forms:
            rows.extend(_parity_rows(name, causal, device, served))
        mine = rows[-len(PRECISIONS) * len(forms):]
        worst = {p: max(max(r["output_error"] or 0.0, r["grad_error"] or 0.0) for r in mine if r["precision"] == p)
                 for p in PRECISIONS}
        failed = sum(r["error"] is not None for r in mine)
        say(f"parity {name}: fp32 {worst['fp32']:.1e}, bf16 {worst['bf16']:.1e} ({served['fp32'].backend})"
            + (f", {failed} failed" if failed else ""))
    return rows


def speed_shape(device: torch.device) -> tuple[int, int]:
    """The speed section's heads and head width on ``device``: 4 of 16 on the CPU, else 16 of 64."""
    return (4, 16) if torch.device(device).type == "cpu" else (16, 64)


def _speed_options(name: str, max_len: int) -> dict:
    b = efficient.budget(name)
    opts = b.long_options(max_len) if b.long is not None else {**b.short, **({"max_len": max_len} if b.max_len else {})}
    if efficient.capabilities(name).causal is not None:
        opts["causal"] = True
    return opts


def _layer_call(name: str, n: int, max_len: int, heads: int, head_dim: int, device: torch.device, precision: str):
    torch.manual_seed(0)
    layer = efficient.create(name, embed_dim=heads * head_dim, num_heads=heads, **_speed_options(name, max_len)).to(device)
    x = torch.randn(1, n, heads * head_dim, device=device, requires_grad=True)

    def call() -> None:
        x.grad = None
        layer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            out = layer(x).output
        out.float().sum().backward()

    return call


def _sdpa_call(n: int, heads: int, head_dim: int, device: torch.device, precision: str):
    dtype = torch.float32 if precision == "fp32" else torch.bfloat16
    q, k, v = qkv = [torch.randn(1, heads, n, head_dim, device=device, dtype=dtype, requires_grad=True) for _ in range(3)]

    def call() -> None:
        for t in qkv:
            t.grad = None
        F.scaled_dot_product_attention(q, k, v, is_causal=True).float().sum().backward()

    return call


def _measure(call, device: torch.device, repeats: int, cell_seconds: float) -> dict:
    """A warm-up call (compilation, autotuning), then timed calls: ``repeats`` at most, one at
    least, no more once the next would pass ``cell_seconds`` in all; their median, and the peak
    memory of one call above what was alive before (the first timed call's on CUDA)."""
    synchronize(device)
    start = time.perf_counter()
    call()
    synchronize(device)
    warm = time.perf_counter() - start
    times: list[float] = []
    peak = before = None
    while not times or (len(times) < repeats and sum(times) + times[-1] <= cell_seconds):
        if device.type == "cuda" and not times:
            before = torch.cuda.memory_allocated(device)
            reset_peak_memory(device)
        start = time.perf_counter()
        call()
        synchronize(device)
        times.append(time.perf_counter() - start)
        if before is not None and len(times) == 1:
            peak = max(0, (peak_memory(device) or 0) - before)
    if device.type == "cpu" and times[0] <= cell_seconds:
        peak = peak_bytes(call)
    return {"seconds": statistics.median(times), "warmup_seconds": warm, "repeats": len(times), "peak_bytes": peak}


def _speed_cell(name: str, n: int, precision: str, ctx: dict) -> dict:
    row = {"variant": name, "n": n, "precision": precision,
           "causal": name == "sdpa" or efficient.capabilities(name).causal is not None, "status": "ok", "seconds": None,
           "warmup_seconds": None, "repeats": 0, "peak_bytes": None, "vs_sdpa": None, "note": None}
    device = ctx["device"]
    call: Callable[[], None] | None = None
    try:
        call = (_sdpa_call(n, ctx["heads"], ctx["head_dim"], device, precision) if name == "sdpa" else
                _layer_call(name, n, ctx["max_len"], ctx["heads"], ctx["head_dim"], device, precision))
        row.update(_measure(call, device, ctx["repeats"], ctx["cell_seconds"]))
    except Exception as e:  # out of memory, or a failure on this device: recorded, the longer lengths skipped
        row["status"] = "out of memory" if _out_of_memory(e) else "error"
        row["note"] = _first_line(e)
    call = None  # the layer and its input go before the next cell (a failed call's, with the traceback, too)
    _free(device, collect=row["status"] != "ok")
    return row


def _why_skip(last: tuple[int, float] | None, n: int, cell_seconds: float, deadline: float | None) -> str | None:
    """Why a cell at length ``n`` is not measured (None: it is): past the deadline, or its time
    at the last length, scaled linearly to ``n`` (a lower bound), over ``cell_seconds`` or past the deadline."""
    now = time.monotonic()
    if deadline is not None and now > deadline:
        return "the speed section's deadline passed"
    if last is None:
        return None
    n0, seconds = last
    projected = seconds * n / n0
    if projected > cell_seconds:
        return f"{seconds:.2f} s at N={n0}: at least {projected:.1f} s at N={n}, over {cell_seconds:g} s"
    if deadline is not None and now + 2 * projected > deadline:
        return f"{seconds:.2f} s at N={n0}: two calls at N={n} would pass the speed section's deadline"
    return None


def speed(device, lengths: Iterable[int], variants: Iterable[str] | None = None, *, heads: int | None = None,
          head_dim: int | None = None, repeats: int = 3, cell_seconds: float = CELL_SECONDS,
          deadline: float | None = None, say: Say = _quiet) -> list[dict]:
    """The speed rows (module docstring): every (length, variant or ``"sdpa"``, precision), shortest
    lengths first. ``deadline``: a :func:`time.monotonic` time after which cells are skipped."""
    device = resolve(device)
    lengths = sorted(lengths)
    shape = speed_shape(device)
    ctx = {"device": device, "heads": heads or shape[0], "head_dim": head_dim or shape[1],
           "max_len": max(lengths), "repeats": repeats, "cell_seconds": cell_seconds}
    names = ["sdpa", *(efficient.names() if variants is None else variants)]
    stopped: dict[tuple[str, str], str] = {}  # a failure: its longer lengths are skipped
    last: dict[tuple[str, str], tuple[int, float]] = {}  # the last length measured, and its seconds
    rows: list[dict] = []
    for n in lengths:
        for name in names:
            for precision in PRECISIONS:
                key = (name, precision)
                why = stopped.get(key) or _why_skip(last.get(key), n, cell_seconds, deadline)
                if why is not None:
                    rows.append({"variant": name, "n": n, "precision": precision, "status": "skipped", "seconds": None,
                                 "peak_bytes": None, "vs_sdpa": None, "note": why})
                    continue
                row = _speed_cell(name, n, precision, ctx)
                rows.append(row)
                if row["status"] != "ok":
                    stopped[key] = f"{row['status']} at N={n}"
                else:
                    last[key] = (n, row["seconds"])
                shown = f"{row['seconds'] * 1e3:.1f} ms" if row["status"] == "ok" else f"{row['status']}: {row['note']}"
                say(f"speed N={n} {name} {precision}: {shown}")
    base = {(r["n"], r["precision"]): r["seconds"] for r in rows if r["variant"] == "sdpa" and r["seconds"]}
    for r in rows:
        b = base.get((r["n"], r["precision"]))
        if r["seconds"] and b and r["variant"] != "sdpa":
            r["vs_sdpa"] = r["seconds"] / b
    return rows


def cpu_reference(path: str | Path | None = None) -> dict | None:
    """The CPU's stored ``lookup`` scores of the default arena: ``{"file", "scores": {variant:
    {"value", "levels": {level as sorted JSON: value}}}}`` from ``path``, else the newest
    ``benchmarks/results/arena-repro-*.json`` of the working folder or of this source tree; None without one."""
    if path is None:
        here = Path(__file__).resolve().parents[3]
        found = [f for root in (Path.cwd(), here) for f in (root / "benchmarks" / "results").glob("arena-repro-*.json")]
        if not found:
            return None
        path = max(found, key=lambda f: f.name)
    data = json.loads(Path(path).read_text())
    board = next(iter(data["commands"].values()))["leaderboard"]
    scores = {key.split(" / ", 1)[1]: {"value": e["value"], "levels": e.get("levels", {})}
              for key, e in board.items() if key.startswith("lookup / ")}
    return {"file": str(path), "scores": scores}


def compare_with_cpu(entries: list[dict], reference: dict | None) -> list[dict]:
    """Per leaderboard entry of ``lookup`` (:func:`attnlab.arena.leaderboard`): its score here
    (``device``), the CPU's (``cpu``, from :func:`cpu_reference`; None without it) and
    ``device - cpu``, overall and per difficulty level (``levels``)."""
    scores = (reference or {"scores": {}})["scores"]
    variants = []
    for e in entries:
        cpu = scores.get(e["variant"], {})
        levels = []
        for part in e.get("levels") or []:
            theirs = cpu.get("levels", {}).get(json.dumps(part["level"], sort_keys=True))
            levels.append({"level": part["level"], "device": part["value"], "cpu": theirs})
        variants.append({"variant": e["variant"], "device": e["value"], "cpu": cpu.get("value"), "levels": levels,
                         "error": e.get("error")})
    for item in (x for v in variants for x in (v, *v["levels"])):
        item["difference"] = None if item["device"] is None or item["cpu"] is None else item["device"] - item["cpu"]
    return variants


def arena_check(device, *, workers: int | None = None, reference: str | Path | None = None, say: Say = _quiet) -> dict:
    """The default arena's ``lookup`` task on ``device`` (module docstring): wall seconds, and per
    variant its score here, the CPU's (:func:`cpu_reference`) and their difference, level by level.
    ``workers``: runs at a time, each in its own process (default: one per torch thread, at most
    four off the CPU: small models leave a GPU idle between launches)."""
    from ..arena import Store, leaderboard, plan, run_grid

    device = resolve(device)
    specs = plan("quick", tasks=["lookup"], device=device.type)
    if workers is None:
        workers = max(1, min(torch.get_num_threads(), len(specs), *(() if device.type == "cpu" else (4,))))
    done = [0]

    def on_event(kind, spec, **info):
        if kind == "end":
            done[0] += 1
            row = info["row"]
            got = f"{row['value']:.3f}" if row["status"] == "done" else "failed"
            say(f"arena [{done[0]}/{len(specs)}] lookup {spec.variant} seed {spec.seed} {json.dumps(spec.level)}: {got}")

    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="attnlab-device-check-") as tmp:
        run_grid(specs, tmp, workers=workers, on_event=on_event)
        rows = Store(Path(tmp) / "results.sqlite").rows()
    wall = time.monotonic() - start
    ref = cpu_reference(reference)
    variants = compare_with_cpu(leaderboard(rows)["tasks"].get("lookup", []), ref)
    return {"task": "lookup", "preset": "quick", "runs": len(specs), "failed": sum(r["status"] != "done" for r in rows),
            "wall_seconds": wall, "workers": workers, "reference": None if ref is None else ref["file"],
            "variants": variants, "note": "step-budgeted runs: scores comparable across devices, not bitwise equal "
                                          "(another device sums in another order)"}


def run(device="auto", *, lengths: Iterable[int] | None = None, variants: Iterable[str] | None = None,
        arena: bool = True, speed_section: bool = True, repeats: int = 3, cell_seconds: float = CELL_SECONDS,
        speed_seconds: float = SPEED_SECONDS, total_seconds: float = TOTAL_SECONDS, say: Say = _quiet,
        on_update: Callable[[dict], None] | None = None) -> dict:
    """The device check (module docstring) on ``device``: ``{"device", "environment", "settings",
    "parity", "speed", "arena", "wall_seconds"}`` (``speed``, ``arena``: None when not run).

    Args:
        lengths: the speed section's (default :data:`CUDA_LENGTHS`, on the CPU :data:`CPU_LENGTHS`).
        variants: the variants checked (default: every registered one).
        arena / speed_section: run those sections; repeats: timed calls per speed cell, at most.
        cell_seconds, speed_seconds, total_seconds: :data:`CELL_SECONDS`, :data:`SPEED_SECONDS`, :data:`TOTAL_SECONDS`.
        say: a progress line; on_update: the results so far, after each section.
    """
    device = resolve(device)
    start = time.monotonic()
    lengths = sorted(lengths or (CPU_LENGTHS if device.type == "cpu" else CUDA_LENGTHS))
    names = list(efficient.names() if variants is None else variants)
    data: dict = {"device": str(device), "environment": environment(device),
                  "settings": {"lengths": lengths, "variants": names, "parity": dict(_PARITY), "repeats": repeats,
                               "speed_batch": 1, "speed_heads": speed_shape(device)[0],
                               "speed_head_dim": speed_shape(device)[1], "cell_seconds": cell_seconds,
                               "speed_seconds": speed_seconds, "total_seconds": total_seconds},
                  "parity": [], "speed": None, "arena": None, "wall_seconds": None}

    def update() -> None:
        data["wall_seconds"] = time.monotonic() - start
        if on_update is not None:
            on_update(data)

    update()
    say(f"device check on {device} ({data['environment']['device_name']})")
    data["parity"] = parity(device, names, say)
    update()
    if arena:
        data["arena"] = arena_check(device, say=say)
        update()
    if speed_section:
        deadline = min(time.monotonic() + speed_seconds, start + total_seconds)
        data["speed"] = speed(device, lengths, names, repeats=repeats, cell_seconds=cell_seconds, deadline=deadline, say=say)
    update()
    return data
