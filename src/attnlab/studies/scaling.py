"""How every attention variant scales with N: time and peak memory, forward + backward, side by side.

The Long Range Arena measurement (Tay et al. 2021, Table 2: speed and memory relative to the
vanilla Transformer at each length), made here on the attention step itself: for each N,
q, k, v of shape ``(B, H, N, D)`` (B = 1, H = 4, D = 64, fp32) go through each variant's
attention step (the layer's :attr:`~attnlab.MultiHeadAttention.step`, the projections left out
because they cost the same for every variant) and the sum of the output is backpropagated to
q, k, v. Each N is timed in a fresh child process, the variants round-robin inside it (machine
noise hits every variant alike), and the sweep over N is repeated (``rounds``, 3 by default),
so that a slow spell of the machine falls on every N rather than bending one end of the fit; a
record keeps the median of its rounds, the fastest and the slowest round, and the minor page
faults of one step. Peak memory (tensor bytes alive at once above
the inputs, from PyTorch's profiler) is measured in a fresh child process per (variant, N).
``dense`` is exact attention on PyTorch's fused ``scaled_dot_product_attention``. A sequence
mixer (declared ``mixer``: the gated linear-attention family, DeltaProduct, FoX) computes its
gates from the layer's input, so its whole layer is timed, projections, gates,
convolution and output norm included (against the others' attention step alone), in its
bidirectional form (two scans, as the others attend non-causally).

The timing processes reuse freed memory (``allocator="keep"``, :func:`attnlab.profiling.allocator_env`).
With glibc's defaults (``"system"``) every block above its mmap threshold (at most 32 MiB) is
unmapped when freed and faulted in again, zeroed, on the next step; at 16K-32K the block-sparse
and LSH paths' temporaries cross that threshold, so their page faults per step grow faster than
N (reformer: about 115 K, 470 K and 1.0 M faults per step at 8K, 16K and 32K, against none when
memory is kept) and so did their times: the slope then measures the allocator, not the method.

Slopes are least-squares fits of log(time) and log(memory) against log(N) over N >= 4096: 1
means linear, 2 quadratic.

On a GPU (:func:`run`'s ``device``; the child processes get it in their spec) each step is timed
between synchronisations and the peak read from the CUDA allocator; the inputs and weights are
drawn on the CPU first, so every device measures the same numbers.
"""

from __future__ import annotations

import gc
import json
import statistics
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import torch

from .. import efficient
from ..profiling import (
    allocator_env,
    loglog_slope,
    measure_in_child,
    minor_faults,
    peak_bytes,
    quiet_stderr,
    round_robin,
)
from ..registry import RegistryView
from .records import StudyRecord, timed

__all__ = ["SETTINGS", "Record", "run", "slopes", "relative", "flex_local_forward"]

HEADS, HEAD_DIM = 4, 64

SETTINGS: Mapping[str, dict] = RegistryView(efficient.VARIANTS, lambda name: _long(efficient.budget(name)))
"""Each variant's budget in this benchmark, a live view of every registered variant's
:attr:`attnlab.efficient.Budget.long` (linformer's ``max_len`` is set to the largest N; a variant
whose ``long`` is None is left out), in the order of registration: the benchmark's variants."""


def _long(b: efficient.Budget) -> dict | None:
    return None if b.long is None else dict(b.long)


@timed
class _Cell(StudyRecord):
    variant: str
    n: int
    mode: str


@dataclass
class Record(_Cell):
    """One (variant, N): median forward+backward seconds and peak tensor bytes (None with a
    ``note`` where not measured). ``mode`` is ``"fwd_bwd"``, or ``"fwd"`` for the forward-only
    comparison with FlexAttention. ``seconds`` is the median over :func:`run`'s rounds of each
    round's median; ``seconds_min`` / ``seconds_max``: the fastest and slowest round (the spread;
    for ``"fwd"``, the fastest and slowest step); ``faults``: minor page faults of one step (median); ``allocator``:
    how the timing process treated freed memory (:func:`attnlab.profiling.allocator_env`)."""

    seconds_min: float | None = None
    seconds_max: float | None = None
    faults: float | None = None
    allocator: str = "keep"


def _module(variant: str, max_n: int, device: str = "cpu"):
    options = efficient.budget(variant).long_options(max_n)
    torch.manual_seed(0)
    # drawn on the CPU
    return efficient.create(variant, embed_dim=HEADS * HEAD_DIM, num_heads=HEADS, **options).to(device)


def _inputs(n: int, grad: bool, device: str = "cpu") -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(n)  # drawn on the CPU: the same numbers on every device
    return [torch.randn(1, HEADS, n, HEAD_DIM, generator=g).to(device).requires_grad_(grad) for _ in range(3)]


def _call(module, qkv) -> Callable[[], None]:
    if module.capabilities.mixer:  # a mixer computes its gates from the layer's input: the whole layer is timed
        x = qkv[0].detach().transpose(1, 2).reshape(1, -1, HEADS * HEAD_DIM).requires_grad_(True)

        def layer_call():
            x.grad = None
            module(x).output.sum().backward()

        return layer_call

    def call():
        for t in qkv:
            t.grad = None
        module.step(*qkv).output.sum().backward()

    return call


def _time_here(n: int, variants: list[str], max_n: int, min_repeats: int, target_seconds: float,
               device: str = "cpu") -> dict:
    """In this (fresh) process: every variant at N on ``device``, round-robin; per variant the
    warm-up and timed seconds and the median minor page faults of a timed step."""
    modules = {v: _module(v, max_n, device) for v in variants}
    qkv = _inputs(n, True, device)
    faults: dict[str, list[int]] = {v: [] for v in variants}

    def counted(v: str, call: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            before = minor_faults()
            call()
            if before is not None:
                faults[v].append(minor_faults() - before)

        return run

    times = round_robin({v: counted(v, _call(m, qkv)) for v, m in modules.items()}, min_repeats,
                        target_seconds, device=device)
    return {v: {"seconds": times[v], "faults": statistics.median(faults[v][1:] or faults[v]) if faults[v] else None}
            for v in variants}


def _time_in_child(n: int, variants: list[str], max_n: int, *, min_repeats: int, target_seconds: float, allocator: str,
                   device: str = "cpu") -> dict:
    spec = {"job": "time", "n": n, "variants": variants, "max_n": max_n, "min_repeats": min_repeats,
            "target_seconds": target_seconds, "device": device}
    return measure_in_child("attnlab.studies.scaling", spec, f"N={n}", env=allocator_env(allocator))


def _peak_in_child(variant: str, n: int, max_n: int, device: str = "cpu") -> int | None:
    """Peak tensor bytes of one forward+backward in a fresh process (:func:`attnlab.profiling.measure_in_child`)."""
    spec = {"job": "peak", "variant": variant, "n": n, "max_n": max_n, "device": device}
    return measure_in_child("attnlab.studies.scaling", spec, f"{variant} N={n}")


def _peak_here(variant: str, n: int, max_n: int, device: str = "cpu") -> int | None:
    module = _module(variant, max_n, device)
    qkv = _inputs(n, True, device)
    call = _call(module, qkv)
    call()  # warm-up: lazy initialisation stays out of the measurement
    for t in qkv:
        t.grad = None
    gc.collect()
    return peak_bytes(call, device)


def run(
    sizes: Iterable[int] = (1024, 2048, 4096, 8192, 16384, 32768),
    variants: Iterable[str] | None = None,
    *,
    min_repeats: int = 3,
    target_seconds: float = 3.0,
    memory: bool = True,
    flex: bool = True,
    allocator: str = "keep",
    rounds: int = 3,
    device: str | torch.device = "cpu",
    on_record: Callable[[Record], None] | None = None,
    on_timed: Callable[[int, int], None] | None = None,
) -> list[Record]:
    """Measure every variant at every N (and, at N = 16384, local vs FlexAttention forward).

    Args:
        sizes: sequence lengths N.
        variants: names from :data:`SETTINGS` (default: all, read when called).
        min_repeats: timed repetitions at least (more while a round fits ``target_seconds``).
        memory: also measure peak memory (a child process per cell).
        allocator: ``"keep"`` (freed memory reused) or ``"system"`` (glibc's defaults) in the
            timing processes (:func:`attnlab.profiling.allocator_env`).
        rounds: sweeps over every N, one after the other (a fresh process per N in each), so
            a slow spell of the machine falls on every N alike rather than on one; a record's
            ``seconds`` is the median of its rounds' medians, ``seconds_min`` / ``seconds_max``
            the fastest and slowest of them, ``repeats`` its timed steps over all rounds.
        on_timed: called with ``(n, round)`` after each timing process.
        flex: at N = 16384, time the forward pass of ``local`` and of compiled FlexAttention
            with the same sliding-window block mask.
        device: where the variants run (the child processes too): on a GPU each step is timed
            between synchronisations and the peak read from its allocator
            (:func:`attnlab.profiling.peak_bytes`).
        on_record: called with each :class:`Record` as soon as it is measured.
    """
    device = str(torch.device(device))
    sizes = sorted(set(sizes))
    variants = list(SETTINGS) if variants is None else list(variants)
    for v in variants:
        if v not in SETTINGS:
            raise ValueError(f"unknown variant {v!r}; expected some of {list(SETTINGS)}")
    allocator_env(allocator)  # an unknown allocator fails before any measurement
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    max_n = max(sizes)
    records: list[Record] = []

    def emit(rec: Record) -> None:
        records.append(rec)
        if on_record is not None:
            on_record(rec)

    cells: dict[tuple[str, int], list[dict]] = {}  # (variant, N) -> each round's median, steps and faults
    for r in range(rounds):
        for n in sizes:
            timed = _time_in_child(n, variants, max_n, min_repeats=min_repeats, target_seconds=target_seconds,
                                   allocator=allocator, device=device)
            for v, got in timed.items():
                ts = got["seconds"][1:] or got["seconds"]
                cells.setdefault((v, n), []).append({"median": statistics.median(ts), "steps": len(ts),
                                                     "faults": got["faults"]})
            if on_timed is not None:
                on_timed(n, r)
    for n in sizes:
        for v in variants:
            peak, note = None, None
            if memory:
                try:
                    peak = _peak_in_child(v, n, max_n, device)
                except RuntimeError as e:
                    note = str(e)
            done = cells[(v, n)]
            medians = [c["median"] for c in done]
            faults = [c["faults"] for c in done if c["faults"] is not None]
            emit(Record(v, n, "fwd_bwd", statistics.median(medians), peak, sum(c["steps"] for c in done), note,
                        seconds_min=min(medians), seconds_max=max(medians),
                        faults=statistics.median(faults) if faults else None, allocator=allocator))
        if flex and n == 16384 and "local" in variants:
            for rec in flex_local_forward(n, efficient.budget("local").long["window"],
                                          min_repeats=min_repeats, device=device):
                emit(rec)
    return records


def flex_local_forward(n: int, window: int, *, min_repeats: int = 3,
                       device: str | torch.device = "cpu") -> list[Record]:
    """Forward time of attnlab's ``local`` and of ``torch.compile``-d FlexAttention with the same
    sliding-window block mask, built on ``device`` (FlexAttention has no CPU backward, so forward
    only, on every device alike)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    device = str(torch.device(device))
    module = _module("local", n, device)
    q, k, v = _inputs(n, False, device)

    def sliding(b, h, qi, kj):
        return (qi - kj <= window) & (kj - qi <= window)

    with quiet_stderr():
        block_mask = create_block_mask(sliding, None, None, n, n, device=device)
        compiled = torch.compile(flex_attention)

    def ours():
        with torch.no_grad():
            module.step(q, k, v)

    def flex():
        with torch.no_grad():
            compiled(q, k, v, block_mask=block_mask)

    with quiet_stderr():
        flex()  # compile
    times = round_robin({"local": ours, "flex_local": flex}, min_repeats, 3.0, device=device)
    return [Record(name, n, "fwd", statistics.median(ts[1:]), None, len(ts) - 1, seconds_min=min(ts[1:]),
                   seconds_max=max(ts[1:]), allocator="in-process") for name, ts in times.items()]


def slopes(records: list[Record], min_n: int = 4096) -> dict[str, dict[str, float | None]]:
    """Per variant: the least-squares slope of log(time) and of log(memory) against log(N), over
    N >= ``min_n`` (over every N measured when fewer than two lengths reach ``min_n``)."""
    out: dict[str, dict[str, float | None]] = {}
    by_variant: dict[str, list[Record]] = {}
    long_enough = len({r.n for r in records if r.n >= min_n}) >= 2
    for r in records:
        if r.mode == "fwd_bwd" and (r.n >= min_n or not long_enough):
            by_variant.setdefault(r.variant, []).append(r)
    for v, rs in by_variant.items():
        out[v] = {
            "time_slope": loglog_slope([(r.n, r.seconds) for r in rs]),
            "memory_slope": loglog_slope([(r.n, r.peak_bytes) for r in rs]),
        }
    return out


def relative(records: list[Record]) -> list[dict]:
    """Long Range Arena's Table 2: each variant's speed-up over dense (dense time / its time)
    and memory relative to dense (its peak / dense peak) at every N."""
    dense = {r.n: r for r in records if r.variant == "dense" and r.mode == "fwd_bwd"}
    out = []
    for r in records:
        d = dense.get(r.n)
        if r.mode != "fwd_bwd" or r.variant == "dense" or d is None or not r.seconds:
            continue
        out.append(
            {
                "variant": r.variant,
                "n": r.n,
                "speedup": d.seconds / r.seconds if d.seconds else None,
                "memory_ratio": r.peak_bytes / d.peak_bytes if r.peak_bytes and d.peak_bytes else None,
            }
        )
    return out


if __name__ == "__main__":  # worker: one N's times, or one cell's peak memory; spec as JSON on stdin
    _spec = json.loads(sys.stdin.read())
    _device = _spec.get("device", "cpu")
    if _spec["job"] == "time":
        print(json.dumps(_time_here(_spec["n"], _spec["variants"], _spec["max_n"], _spec["min_repeats"],
                                    _spec["target_seconds"], _device)))
    else:
        print(json.dumps(_peak_here(_spec["variant"], _spec["n"], _spec["max_n"], _device)))
