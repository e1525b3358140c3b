"""Benchmark of ``attend`` against PyTorch's fused kernel and a naive materialised implementation.

For every configuration (score + normaliser), every sequence length N and both modes (``fwd``:
forward only, under ``torch.no_grad``; ``fwd_bwd``: forward and backward to q, k, v), each
implementation is timed **round-robin in one process**, so machine noise hits them alike, and
its peak memory is read once from PyTorch's profiler, in a fresh child process per cell: the
largest total of tensor bytes alive at once during the call, on top of the inputs (every
allocation of PyTorch's CPU allocator counts, kernels' scratch buffers included).

Implementations:

* ``attend`` — :func:`attnlab.attend` with its automatic dispatch (``backend`` says which path ran);
* ``attend_chunked`` — :func:`attnlab.attend` forced onto the chunked path;
* ``sdpa`` — :func:`torch.nn.functional.scaled_dot_product_attention` (scaled dot + softmax only);
* ``naive`` — the full ``(B, H, N, M)`` score matrix built, normalised and multiplied by V.

A naive run whose score tensors would not fit in memory is skipped and says so.
"""

from __future__ import annotations

import gc
import json
import math
import statistics
import sys
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from ..core.attend import attend, backend_for
from ..core.scores import Additive
from ..profiling import measure_in_child, peak_bytes, round_robin
from .records import StudyRecord, timed

__all__ = ["CONFIGS", "Record", "run", "peak_bytes", "naive_attention"]

CONFIGS: dict[str, dict] = {
    "scaled_dot+softmax": {"score": "scaled_dot", "normalize": "softmax",
                           "impls": ["attend", "sdpa", "naive", "attend_chunked"]},
    "cosine+softmax": {"score": "cosine", "normalize": "softmax", "impls": ["attend", "attend_chunked", "naive"]},
    "scaled_dot+relu": {"score": "scaled_dot", "normalize": "relu", "impls": ["attend", "naive"]},
    "additive+softmax": {"score": "additive", "normalize": "softmax", "impls": ["attend", "naive"]},
}
"""Score + normaliser configurations and the implementations measured for each."""


@timed
class Record(StudyRecord):
    """One measurement: ``seconds`` is the median over the timed repetitions (after a warm-up
    call); ``peak_bytes`` the profiler's peak of live tensor bytes during one call. Where either
    is None, ``note`` says why."""

    impl: str
    path: str
    backend: str
    n: int
    mode: str


def naive_attention(q, k, v, score, normalize: str) -> torch.Tensor:
    """The textbook computation with every ``(B, H, N, M)`` tensor materialised (plain torch ops)."""
    if isinstance(score, Additive):
        qa, ka = q @ score.w_q, k @ score.w_k  # (B, H, N, A), (B, H, M, A)
        s = (torch.tanh(qa.unsqueeze(-2) + ka.unsqueeze(-3)) @ score.v.unsqueeze(-3)).squeeze(-1)
    elif score == "cosine":
        s = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1) / 0.1
    else:
        s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if normalize == "softmax":
        w = torch.softmax(s, dim=-1)
    elif normalize == "relu":
        w = torch.relu(s) / s.shape[-1]
    else:
        raise ValueError(f"naive_attention knows softmax and relu, got {normalize!r}")
    return w @ v


def _estimate_naive_bytes(b, h, n, pair_cost, itemsize, mode) -> int:
    tensors = 3 if mode == "fwd" else 6  # scores, weights (+ their gradients and saved copies)
    return b * h * n * n * pair_cost * itemsize * tensors


def _available_bytes(device: str | torch.device = "cpu") -> int:
    """Memory free for the naive implementation's tensors: the device's free memory on CUDA, else
    the machine's available memory (8 GiB where ``/proc/meminfo`` does not say)."""
    if torch.device(device).type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


@dataclass(frozen=True)
class _Case:
    """One (configuration, size, mode) cell of the benchmark grid."""

    config: str
    n: int
    mode: str
    batch: int
    num_heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device
    seed: int
    memory_budget: int


def _build(case: _Case):
    """The calls to measure for one cell: ``(calls, backends, skipped, inputs)``.

    Built the same way (same seeds) in the timing process and in the memory process.
    """
    cfg = CONFIGS[case.config]
    torch.manual_seed(case.seed)
    is_additive = cfg["score"] == "additive"
    score = (Additive(case.head_dim, num_heads=case.num_heads).to(case.device, case.dtype) if is_additive
             else cfg["score"])
    norm = cfg["normalize"]
    g = torch.Generator(device="cpu").manual_seed(case.seed + case.n)
    grad = case.mode == "fwd_bwd"
    shape = (case.batch, case.num_heads, case.n, case.head_dim)
    qkv = [torch.randn(*shape, generator=g, dtype=case.dtype).to(case.device).requires_grad_(grad) for _ in range(3)]
    q, k, v = qkv

    def make(fwd: Callable[[], torch.Tensor]) -> Callable[[], object]:
        def call():
            if grad:
                for t in qkv:
                    t.grad = None
                fwd().sum().backward()
            else:
                with torch.no_grad():
                    fwd()

        return call

    calls: dict[str, Callable[[], object]] = {}
    backends: dict[str, str] = {}
    skipped: dict[str, str] = {}
    for impl in cfg["impls"]:
        if impl == "attend":
            calls[impl] = make(lambda: attend(q, k, v, score=score, normalize=norm).output)
            backends[impl] = backend_for(score, norm, head_dim=case.head_dim)
        elif impl == "attend_chunked":
            calls[impl] = make(lambda: attend(q, k, v, score=score, normalize=norm, backend="chunked").output)
            backends[impl] = "chunked"
        elif impl == "sdpa":
            calls[impl] = make(lambda: F.scaled_dot_product_attention(q, k, v))
            backends[impl] = "sdpa"
        else:
            backends[impl] = "naive"
            pair_cost = case.head_dim if is_additive else 1
            need = _estimate_naive_bytes(case.batch, case.num_heads, case.n, pair_cost, q.element_size(), case.mode)
            if need > case.memory_budget:
                skipped[impl] = f"skipped: would need about {need / 2**30:.0f} GiB, over half the available memory"
            else:
                calls[impl] = make(lambda: naive_attention(q, k, v, score, norm))
    return calls, backends, skipped, qkv


def _measure_peaks(case: _Case, warmup: bool = True) -> dict[str, int | None]:
    """Peak tensor bytes of each call of one cell (after a warm-up call if ``warmup``)."""
    calls, _, _, qkv = _build(case)
    peaks = {}
    for impl, call in calls.items():
        if warmup:
            call()  # lazy initialisation stays out of the measurement
        for t in qkv:
            t.grad = None  # freed before profiling, so it sees only this call's tensors
        gc.collect()
        peaks[impl] = peak_bytes(call, case.device)
    return peaks


def run(
    sizes: Iterable[int] = (1024, 4096, 8192),
    configs: Iterable[str] | None = None,
    modes: Iterable[str] = ("fwd", "fwd_bwd"),
    *,
    batch: int = 1,
    num_heads: int = 4,
    head_dim: int = 64,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    min_repeats: int = 3,
    target_seconds: float = 2.0,
    seed: int = 0,
    memory_in_subprocess: bool = True,
    on_record: Callable[[Record], None] | None = None,
) -> list[Record]:
    """Measure every implementation of every configuration at every size and mode.

    Times are taken round-robin in this process; peak memory is read with the profiler in a
    fresh child process per cell (``memory_in_subprocess=False`` reads it here instead). On a
    CUDA ``device`` each call is timed between synchronisations and its peak read from the
    device's allocator (:func:`attnlab.profiling.peak_bytes`).

    Args:
        sizes: sequence lengths N (= M).
        configs: keys of :data:`CONFIGS` (default: all).
        modes: ``"fwd"`` and/or ``"fwd_bwd"``.
        min_repeats: timed repetitions at least; more (up to 20) while they fit ``target_seconds``.
        on_record: called with each :class:`Record` as soon as it is measured (progress display).
    """
    configs = list(CONFIGS) if configs is None else list(configs)
    for c in configs:
        if c not in CONFIGS:
            raise ValueError(f"unknown benchmark configuration {c!r}; expected some of {list(CONFIGS)}")
    for mode in modes:
        if mode not in ("fwd", "fwd_bwd"):
            raise ValueError(f"mode must be 'fwd' or 'fwd_bwd', got {mode!r}")
    device = torch.device(device)
    records: list[Record] = []
    budget = _available_bytes(device) // 2
    for cfg_name in configs:
        for n in sizes:
            for mode in modes:
                case = _Case(cfg_name, n, mode, batch, num_heads, head_dim, dtype, device, seed, budget)
                calls, backends, skipped, _ = _build(case)
                times, repeats = _time_calls(calls, min_repeats, target_seconds, device)
                del calls
                gc.collect()
                if device.type == "cuda":  # the memory process gets the memory this one cached
                    torch.cuda.empty_cache()
                warmup = max((t[0] for t in times.values()), default=0.0) < 1.0
                try:
                    peaks = (_measure_peaks_in_child(case, warmup) if memory_in_subprocess
                             else _measure_peaks(case, warmup))
                except RuntimeError as e:  # recorded, not fatal: the timings stand
                    peaks, note = {}, f"memory not measured: {str(e).splitlines()[0]}"
                else:
                    note = None
                for impl in CONFIGS[case.config]["impls"]:
                    if impl in skipped:
                        rec = Record(impl, case.config, backends[impl], case.n, case.mode, None, None, 0, skipped[impl])
                    else:
                        median = statistics.median(times[impl][1:] or times[impl])
                        rec = Record(
                            impl, case.config, backends[impl], case.n, case.mode, median, peaks.get(impl), repeats, note
                        )
                    records.append(rec)
                    if on_record is not None:
                        on_record(rec)
    return records


def _time_calls(calls, min_repeats, target_seconds, device=None) -> tuple[dict[str, list[float]], int]:
    """Per implementation: the warm-up time first, then ``repeats`` round-robin timings (one
    timed round after the warm-up for a cell whose round takes over 30 s), on ``device``."""
    times = round_robin(calls, min_repeats, target_seconds, max_repeats=20, slow_seconds=30.0,
                        collect=True, device=device)
    return times, len(next(iter(times.values()))) - 1


def _measure_peaks_in_child(case: _Case, warmup: bool) -> dict[str, int | None]:
    """:func:`_measure_peaks` in a fresh ``python -m attnlab.studies.attention`` process
    (:func:`attnlab.profiling.measure_in_child`: no timing there, glibc's heap kept unfragmented)."""
    spec = {**asdict(case), "dtype": str(case.dtype).removeprefix("torch."),
            "device": str(case.device), "warmup": warmup}
    return measure_in_child("attnlab.studies.attention", spec, f"{case.config} N={case.n} {case.mode}")


def ratios(records: list[Record]) -> list[dict]:
    """For each (path, n, mode): each implementation's time and peak memory relative to the
    reference implementation of that path (``sdpa`` where measured, else ``naive``)."""
    out = []
    keyed: dict[tuple, dict[str, Record]] = {}
    for r in records:
        keyed.setdefault((r.path, r.n, r.mode), {})[r.impl] = r
    for (path, n, mode), group in keyed.items():
        for base_name in ("sdpa", "naive"):
            base = group.get(base_name)
            if base is None or base.seconds is None:
                continue
            for impl, r in group.items():
                if impl == base_name or r.seconds is None:
                    continue
                out.append(
                    {
                        "path": path,
                        "n": n,
                        "mode": mode,
                        "impl": impl,
                        "vs": base_name,
                        "time_ratio": r.seconds / base.seconds,
                        "memory_ratio": (r.peak_bytes / base.peak_bytes)
                        if r.peak_bytes is not None and base.peak_bytes
                        else None,
                    }
                )
    return out


if __name__ == "__main__":  # worker: one cell's memory, case as JSON on stdin, peaks as JSON on stdout
    _spec = json.loads(sys.stdin.read())
    _spec["dtype"] = getattr(torch, _spec["dtype"])
    _spec["device"] = torch.device(_spec["device"])
    _warmup = _spec.pop("warmup")
    print(json.dumps(_measure_peaks(_Case(**_spec), _warmup)))
