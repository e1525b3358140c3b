"""What the studies, the benchmarks and the arena measure with: peak tensor memory, round-robin
timing, log-log slopes, and a measurement in a fresh child process.

Timing is round-robin in one process (every implementation runs once per round, so machine
noise hits them alike); memory is the profiler's peak of tensor bytes alive at once.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import inspect
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["ALLOCATORS", "PEAK_BUDGET", "PEAK_MAX_SIZE", "PEAK_MAX_SIZE_GPU", "PEAK_TARGET", "CallPath", "Peak",
           "allocator_env", "call_path", "count_flops", "flop_counter", "loglog_slope", "measure_calls",
           "measure_in_child", "measure_peak", "minor_faults", "peak_bytes", "peak_flops", "quiet_stderr",
           "round_robin"]

ALLOCATORS = ("keep", "system")
"""How a timing process's C allocator treats freed memory (:func:`allocator_env`)."""


def allocator_env(allocator: str) -> dict[str, str]:
    """Environment variables that set glibc's allocator for a child process.

    ``"system"``: glibc's defaults. A block above its mmap threshold (which adapts up to 32 MiB)
    is mapped on allocation and unmapped when freed, so the next step's tensor of that size
    touches fresh pages, each a minor page fault that the kernel zeroes; past the threshold the
    faults of a step grow with its large temporaries. ``"keep"``: no mmap and no trimming
    (``GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=64 GiB``), so freed
    blocks are reused from the heap, as a long-running training process reuses them (and as
    PyTorch's caching allocator does on GPUs); the process keeps its peak resident size.
    Other C libraries ignore the variable.
    """
    if allocator not in ALLOCATORS:
        raise ValueError(f"unknown allocator {allocator!r}; expected one of {', '.join(ALLOCATORS)}")
    if allocator == "system":
        return {}
    keep = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736"
    old = os.environ.get("GLIBC_TUNABLES")
    return {"GLIBC_TUNABLES": f"{old}:{keep}" if old else keep}


def minor_faults() -> int | None:
    """This process's minor page faults so far (None where ``resource`` is missing, e.g. Windows)."""
    try:
        import resource
    except ImportError:
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def peak_bytes(fn: Callable[[], object], device=None) -> int | None:
    """Peak of tensor bytes alive at once while ``fn()`` runs, above what was alive before.

    On the CPU (``device`` None or a CPU), read from :mod:`torch.profiler`'s allocation events
    (``profile_memory=True``; None if this PyTorch does not expose them); on a CUDA device, from
    its caching allocator's peak; None on another device (MPS: neither counts its tensors).
    """
    from torch.profiler import ProfilerActivity, profile

    from .devices import peak_memory, reset_peak_memory, synchronize

    if device is not None and str(device).startswith("cuda"):
        import torch

        synchronize(device)
        before = torch.cuda.memory_allocated(device)
        reset_peak_memory(device)
        fn()
        synchronize(device)
        return max(0, (peak_memory(device) or 0) - before)
    if device is not None and str(device).split(":")[0] != "cpu":
        return None

    try:
        with quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            fn()
        nodes, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
        while stack:
            node = stack.pop()
            stack.extend(node.children)
            if "Allocation" in str(node.tag):
                nodes.append(node)
    except (AttributeError, RuntimeError):  # pragma: no cover - depends on the torch build
        return None
    nodes.sort(key=lambda nd: nd.start_time_ns)
    live = peak = 0
    for nd in nodes:
        live += nd.extra_fields.alloc_size
        peak = max(peak, live)
    return peak


PEAK_TARGET = 0.1
"""Seconds one product of :func:`measure_peak` should take: the product grows until it does."""

PEAK_MAX_SIZE = 2048
"""The largest side :func:`measure_peak` grows the product to on a CPU (a 2-core CPU reaches its
float32 peak well below it)."""

PEAK_MAX_SIZE_GPU = 16384
"""The largest side :func:`measure_peak` grows the product to on a GPU (CUDA, MPS), whose peak
needs far larger products than a CPU's to fill it."""

PEAK_BUDGET = 1.5
"""Seconds of timed repetitions :func:`measure_peak` spends at its final size, at most."""

_PEAK_DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16"}


@dataclass(frozen=True)
class Peak:
    """What :func:`measure_peak` measured: the best time of one ``size``-cubed matrix product in
    ``dtype`` on ``device`` over ``repeats`` timed products, and the whole measurement's seconds.

    Attributes:
        dtype: ``"float32"`` or ``"bfloat16"``.
        device: where it ran.
        size: the side of the square matrices multiplied.
        seconds: the best time of one product.
        repeats: timed products at ``size`` (after the growth and a warm-up).
        total_seconds: the whole measurement, growing the product included.
    """

    dtype: str
    device: str
    size: int
    seconds: float
    repeats: int
    total_seconds: float

    @property
    def flops(self) -> float:
        """FLOP/s: ``2 size^3`` per product (one multiply and one add per term)."""
        return 2 * self.size**3 / self.seconds

    def describe(self) -> str:
        """One line: the rate and how it was measured."""
        return (f"{self.dtype} {self.flops / 1e9:.3g} GFLOP/s: best of {self.repeats} {self.size}^3 products "
                f"({self.seconds:.3g} s each), measured in {self.total_seconds:.1f} s")


def peak_flops(dtype: str = "float32", device: str = "cpu") -> float:
    """This machine's peak FLOP/s of a matrix product in ``dtype`` (``"float32"`` / ``"fp32"`` or
    ``"bfloat16"`` / ``"bf16"``) on ``device``: :func:`measure_peak`'s ``flops``."""
    return measure_peak(dtype, device).flops


def measure_peak(dtype: str = "float32", device: str = "cpu") -> Peak:
    """Time square matrix products in ``dtype`` on ``device`` with every thread torch uses,
    growing the side from 128 (doubling) until one product (after a warm-up one at that side)
    takes :data:`PEAK_TARGET` seconds or
    the side reaches :data:`PEAK_MAX_SIZE` (:data:`PEAK_MAX_SIZE_GPU` on a GPU), then repeating that product for up to
    :data:`PEAK_BUDGET` seconds (at least twice, at most five times) and keeping the best.

    The time is bounded whatever the CPU: a product that takes longer than the target stops the
    growth (the one before took under the target, so the last one under 8 times it), and the
    repetitions stop at the budget. On a CPU that multiplies bfloat16 natively the products grow
    to the largest side; where bfloat16 is emulated (an AVX2-only CPU), orders of magnitude slower,
    they stop at a few hundred. On a GPU each product is timed between two
    synchronisations (:func:`attnlab.devices.synchronize`). Measured once per process (cached)."""
    key = _PEAK_DTYPES.get(str(dtype).removeprefix("torch."))
    if key is None:
        raise ValueError("peak_flops measures float32 (fp32) or bfloat16 (bf16), the precisions a run trains in, got "
                         f"{dtype!r}")
    return _measure_peak(key, str(device))


@functools.cache
def _measure_peak(dtype: str, device: str) -> Peak:
    import torch

    dt = getattr(torch, dtype)
    on_cpu = torch.device(device).type == "cpu"
    gen = torch.Generator().manual_seed(0)
    t_start = time.perf_counter()

    def draw(n: int) -> torch.Tensor:  # a GPU draws its own (the CPU would take seconds at its largest sides)
        return (torch.randn(n, n, generator=gen).to(device=device, dtype=dt) if on_cpu
                else torch.randn(n, n, device=device, dtype=dt))

    def product(n: int) -> tuple[float, Callable[[], object]]:
        a, b = draw(n), draw(n)

        def once() -> float:
            _sync(device)
            t0 = time.perf_counter()
            a @ b
            _sync(device)
            return time.perf_counter() - t0

        once()  # the warm-up at this size (thread pools, kernel set-up): not timed
        return once(), once

    largest = PEAK_MAX_SIZE if on_cpu else PEAK_MAX_SIZE_GPU
    n = 128
    first, once = product(n)
    while first < PEAK_TARGET and n < largest:
        n *= 2
        first, once = product(n)
    times: list[float] = []
    spent = 0.0
    while len(times) < 5 and (len(times) < 2 or spent < PEAK_BUDGET):
        times.append(once())
        spent += times[-1]
    return Peak(dtype, device, n, min(times), len(times), time.perf_counter() - t_start)


def _sync(device: str) -> None:
    from .devices import synchronize

    synchronize(device)


def count_flops(fn: Callable[[], object]) -> int:
    """Floating-point operations of ``fn()`` as :func:`flop_counter` counts them."""
    with flop_counter() as counter:
        fn()
    return int(counter.get_total_flops())


def flop_counter():
    """PyTorch's :class:`~torch.utils.flop_counter.FlopCounterMode` (matrix products, convolutions and
    fused attention, forward and backward: 2 per multiply-add; elementwise work is not counted), with
    PyTorch's CPU flash-attention kernel, which its counter leaves out, counted by PyTorch's own
    formulas for fused attention: the full N x M product, as PyTorch counts it, so a causal kernel
    (which skips the blocks above the diagonal) is counted at about twice its attention work. Use it
    as a context manager; ``get_total_flops()`` afterwards."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

    aten = torch.ops.aten
    cpu_attention = {
        aten._scaled_dot_product_flash_attention_for_cpu: lambda q, k, v, *_, **__: sdpa_flop_count(q, k, v),
        aten._scaled_dot_product_flash_attention_for_cpu_backward:
            lambda g, q, k, v, *_, **__: sdpa_backward_flop_count(g, q, k, v),
    }
    return FlopCounterMode(display=False, custom_mapping=cpu_attention)


@contextlib.contextmanager
def quiet_stderr():
    """Silence the profiler's C++ log lines (written to file descriptor 2) while it runs."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real file descriptor (e.g. captured by a test runner)
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def round_robin(
    calls: dict[str, Callable[[], object]], min_repeats: int, target_seconds: float, *, max_repeats: int = 10,
    slow_seconds: float = 60.0, collect: bool = False, device=None,
) -> dict[str, list[float]]:
    """Per key: the warm-up time first, then the timings of the round-robin repetitions.

    The warm-up round sets the repetitions: ``target_seconds / (one round's time)``, between
    ``min_repeats`` and ``max_repeats``; one timed round only when a round takes over
    ``slow_seconds``. ``collect`` runs the garbage collector before each warm-up call.
    ``device``: where the calls run; on a GPU each call is timed between two synchronisations
    (:func:`attnlab.devices.synchronize`: the GPU runs behind the host).
    """
    sync = _syncer(device)
    times: dict[str, list[float]] = {k: [] for k in calls}

    def timed(call: Callable[[], object]) -> float:
        sync()
        t0 = time.perf_counter()
        call()
        sync()
        return time.perf_counter() - t0

    for k, call in calls.items():  # warm-up (first entry), which also sets the repetitions
        if collect:
            gc.collect()
        times[k].append(timed(call))
    round_trip = sum(t[0] for t in times.values())
    repeats = (1 if round_trip > slow_seconds
               else max(min_repeats, min(max_repeats, int(target_seconds / max(round_trip, 1e-9)))))
    for _ in range(repeats):
        for k, call in calls.items():  # round-robin: noise hits every implementation alike
            times[k].append(timed(call))
    return times


def _syncer(device) -> Callable[[], None]:
    """What waits for ``device``'s queued work before the clock is read: nothing on the CPU (or None)."""
    if device is None or str(device).split(":")[0] == "cpu":
        return lambda: None
    return functools.partial(_sync, device)


def measure_calls(calls: dict, min_repeats: int = 3, *, memory: bool = True, device=None) -> dict:
    """For callables timed side by side (:func:`round_robin`): ``{key: (median seconds after
    the warm-up call, peak tensor bytes of one call or None, timed repeats)}``. ``device``:
    where the calls run (timed between synchronisations, memory from its allocator on CUDA:
    :func:`peak_bytes`)."""
    times = round_robin(calls, min_repeats, 3.0, device=device)
    out = {}
    for key, call in calls.items():
        peak = None
        if memory:
            gc.collect()
            peak = peak_bytes(call, device)
        ts = times[key]
        out[key] = (statistics.median(ts[1:] or ts), peak, len(ts) - 1)
    return out


def loglog_slope(points: list[tuple[int, float | None]]) -> float | None:
    """Least-squares slope of ``log(y)`` against ``log(n)`` over the points with a ``y``
    (1: linear, 2: quadratic); None with fewer than two such points."""
    pts = [(math.log(n), math.log(y)) for n, y in points if y]
    if len(pts) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    den = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / den if den else None


def measure_in_child(module: str, spec: dict, what: str, env: dict[str, str] | None = None):
    """Run ``python -m module`` with ``spec`` as JSON on stdin and return the JSON of its last
    stdout line; a failure raises ``RuntimeError`` naming ``what``.

    ``env``: variables for the child (e.g. :func:`allocator_env`). Without it the child is a
    peak-memory cell: the profiler's small records, interleaved with thousands of large block
    tensors, fragment glibc's heap, so the child runs with glibc's mmap threshold fixed at
    128 KiB (every large tensor mapped and returned on its own; no counted tensor byte changes).
    """
    extra = {"MALLOC_MMAP_THRESHOLD_": str(128 * 1024)} if env is None else env
    proc = subprocess.run([sys.executable, "-m", module], input=json.dumps(spec), capture_output=True, text=True,
                          env={**os.environ, **extra})
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
        raise RuntimeError(f"the {'memory' if env is None else 'timing'} process of {what} failed ({tail[0]})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


@dataclass(frozen=True)
class CallPath:
    """The attnlab functions one call ran through (:func:`call_path`).

    Attributes:
        functions: calls per function, keyed ``"module.py:qualified_name"`` (paths under ``attnlab/``).
        depth: per target function name, the attnlab frames on the stack at its first call.
    """

    functions: dict[str, int]
    depth: dict[str, int]

    @property
    def files(self) -> set[str]:
        """The distinct source files of :attr:`functions`."""
        return {f.split(":", 1)[0] for f in self.functions}

    @property
    def calls(self) -> int:
        """All calls of attnlab functions, summed."""
        return sum(self.functions.values())


# comprehension frames: their own code objects up to Python 3.11, inlined from 3.12 (PEP 709),
# so they are counted as part of the function that holds them
_INLINED = ("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>")


def call_path(fn: Callable[[], object], targets: tuple[str, ...] = ()) -> CallPath:
    """Run ``fn()`` under :func:`sys.setprofile` and record every attnlab function it called
    (lambdas and closures included, comprehensions counted with their function), and the number of
    attnlab frames on the stack when a function named in ``targets`` is first called. A profiler set
    before (a coverage tool's) is set again after."""
    import attnlab

    if not callable(fn):
        raise TypeError(f"call_path takes a function of no arguments, got {type(fn).__name__}")
    if isinstance(targets, str) or not all(isinstance(t, str) for t in targets):
        raise TypeError(f"targets must be a tuple of function names, got {targets!r}")

    root = os.path.dirname(attnlab.__file__) + os.sep
    functions: dict[str, int] = {}
    depth: dict[str, int] = {}

    def ours(code) -> bool:
        return code.co_filename.startswith(root) and code.co_name not in _INLINED

    def profile(frame, event, _arg) -> None:
        code = frame.f_code
        if event != "call" or not ours(code):
            return
        key = f"{code.co_filename[len(root):]}:{code.co_qualname}"
        functions[key] = functions.get(key, 0) + 1
        if code.co_name in targets and code.co_name not in depth:
            below, up = 0, frame.f_back
            while up is not None and up is not here:  # the frames below this function's own
                below += ours(up.f_code)
                up = up.f_back
            depth[code.co_name] = below

    here, before = inspect.currentframe(), sys.getprofile()
    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(before)
    return CallPath(functions, depth)
