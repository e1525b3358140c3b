"""The device check's speed section (:mod:`attnlab.studies.device_check`): forward + backward of each variant's layer
(B=1; 16 heads of 64 off the CPU, 4 of 16 on it; each variant's settings for long sequences,
:attr:`attnlab.efficient.Budget.long`) at each length, float32 and bf16 autocast, beside
:func:`torch.nn.functional.scaled_dot_product_attention` alone, causal, on the same shapes: median seconds of a few
calls after a warm-up, synchronised, and the peak memory of one call. A variant out of memory (or failing) at a length
skips its longer lengths, and so does one whose time, scaled linearly to the next length, passes ``cell_seconds``;
past the section's deadline every cell left is recorded as skipped."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F

from .. import efficient
from ..devices import peak_memory, reset_peak_memory, resolve, synchronize
from ..profiling import peak_bytes
from .device_common import PRECISIONS, Say, first_line, free, out_of_memory, quiet

__all__ = ["CELL_SECONDS", "CPU_LENGTHS", "CUDA_LENGTHS", "SPEED_SECONDS", "speed", "speed_shape"]

CUDA_LENGTHS = (4096, 16384, 65536)
"""The speed section's sequence lengths off the CPU."""

CPU_LENGTHS = (512, 1024)
"""The speed section's sequence lengths on the CPU."""

CELL_SECONDS = 10.0
"""A variant whose time at a length, scaled linearly to the next, passes this skips its longer lengths."""

SPEED_SECONDS = 360.0
"""The speed section's deadline, after its start: the cells left then are recorded as skipped."""


def speed_shape(device: torch.device) -> tuple[int, int]:
    """The speed section's heads and head width on ``device``: 4 of 16 on the CPU, else 16 of 64."""
    return (4, 16) if torch.device(device).type == "cpu" else (16, 64)


def _speed_options(name: str, max_len: int) -> dict:
    b = efficient.budget(name)
    opts = b.long_options(max_len) if b.long is not None else {**b.short, **({"max_len": max_len} if b.max_len else {})}
    if efficient.capabilities(name).causal is not None:
        opts["causal"] = True
    return opts


def _layer_call(name: str, n: int, *, max_len: int, heads: int, head_dim: int, device: torch.device, precision: str):
    torch.manual_seed(0)
    layer = efficient.create(name, embed_dim=heads * head_dim, num_heads=heads,
                             **_speed_options(name, max_len)).to(device)
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
    q, k, v = qkv = [torch.randn(1, heads, n, head_dim, device=device, dtype=dtype, requires_grad=True)
                     for _ in range(3)]

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
                _layer_call(name, n, max_len=ctx["max_len"], heads=ctx["heads"], head_dim=ctx["head_dim"],
                            device=device, precision=precision))
        row.update(_measure(call, device, ctx["repeats"], ctx["cell_seconds"]))
    except Exception as e:  # out of memory, or a failure on this device: recorded, the longer lengths skipped
        row["status"] = "out of memory" if out_of_memory(e) else "error"
        row["note"] = first_line(e)
    call = None  # the layer and its input go before the next cell (a failed call's, with the traceback, too)
    free(device, collect=row["status"] != "ok")
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
          deadline: float | None = None, say: Say = quiet) -> list[dict]:
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
