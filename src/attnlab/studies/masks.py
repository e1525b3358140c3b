"""Masks that scale: the same mask as a dense tensor, as a function computed block-sparse, on
PyTorch's own kernel where it has one, and on compiled FlexAttention, against N.

For every pattern (:data:`PATTERNS`: causal, a sliding window, packed documents, prefix-LM, a
dilated window, a window with global tokens, BigBird's window + global + random blocks) and
length N, with q, k, v of shape ``(1, 4, N, 64)`` in fp32, forward + backward:

* ``dense mask`` — ``attend`` with the mask made dense (``mask.dense(N)``, an N x N bool tensor
  built once, outside the timing): PyTorch's fused kernel reads every pair (up to ``dense_up_to``);
* ``block-sparse`` — ``attend`` with the mask function (``backend="chunked"``): the block map
  built inside every call, as a user's code does, and only its tiles computed;
* ``pytorch causal`` — for the causal pattern, PyTorch's fused kernel with ``is_causal=True``
  (what ``attend`` itself runs for the plain causal mask);
* ``flex`` — forward only (FlexAttention has no backward on CPU): compiled ``flex_attention``
  with a block mask from the same mask function, timed round-robin with the block-sparse forward
  in one process (up to ``flex_up_to``).

Each cell runs in its own plain process (glibc's default allocator: what a user's process gets;
the scaling study's ``allocator=keep`` would hide it): seconds are the median of the timed steps
after a warm-up, and memory is the peak resident size above the process's size before the first
step (the kernel's VmHWM, reset once the inputs and the dense mask are built: everything the steps
needed, the allocator's slack included). The patterns
whose allowed pairs grow as N^2 (causal, prefix-LM) stop at ``quadratic_up_to``. ``layer_step``:
one training step (forward, backward, SGD) of a :class:`attnlab.MultiHeadAttention` (E = 256,
4 heads) under the sliding window at that N.

On a CUDA device (:func:`run`'s ``device``, carried into every cell's process) the steps are
timed between synchronisations, the block masks are built there, and a cell's memory is the
allocator's peak above the inputs (``peak_bytes``) instead of the resident size.
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from ..core import masks
from ..core.attend import attend
from ..profiling import loglog_slope, measure_in_child, quiet_stderr, round_robin
from .records import StudyRecord, timed

__all__ = ["PATTERNS", "METHODS", "Record", "pattern_mask", "run", "slopes", "flex_ratios"]

HEADS, HEAD_DIM, WINDOW = 4, 64, 256

PATTERNS: dict[str, tuple[str, bool]] = {
    "causal": ("j <= i", True),
    "window": (f"|i - j| <= {WINDOW}", False),
    "documents": ("packed documents of 256-2048 tokens, causal inside", False),
    "prefix_lm": ("the first N/4 keys for all, causal after", True),
    "dilated": (f"|i - j| <= {2 * WINDOW}, even offsets", False),
    "global+window": (f"|i - j| <= {WINDOW}, 16 global tokens", False),
    "bigbird": ("|i - j| <= 64, 2 global tokens, 3 random blocks of 64", False),
}
"""Each pattern: what it allows, and whether its allowed pairs grow as N^2."""

METHODS = ("dense mask", "block-sparse", "pytorch causal", "flex")


def pattern_mask(name: str, n: int) -> masks.Mask:
    """The mask of pattern ``name`` at length ``n`` (documents drawn from a seeded generator)."""
    if name == "causal":
        return masks.causal()
    if name == "window":
        return masks.window(WINDOW)
    if name == "documents":
        g = torch.Generator().manual_seed(n)
        lengths, left = [], n
        while left:
            lengths.append(min(left, int(torch.randint(256, 2049, (1,), generator=g))))
            left -= lengths[-1]
        return masks.Documents(lengths, causal=True)
    if name == "prefix_lm":
        return masks.prefix_lm(n // 4)
    if name == "dilated":
        return masks.dilated_window(2 * WINDOW, 2)
    if name == "global+window":
        return masks.window(WINDOW) | masks.global_tokens(16)
    if name == "bigbird":
        return (masks.window(64) | masks.global_tokens(2) | masks.random_blocks(3, 64, seed=0)).bind(n, n)
    raise ValueError(f"unknown pattern {name!r}; expected one of {', '.join(PATTERNS)}")


@timed
class _Cell(StudyRecord):
    pattern: str
    n: int
    method: str
    mode: str


@dataclass
class Record(_Cell):
    """One (pattern, N, method): ``mode`` ``"fwd_bwd"`` (or ``"fwd"`` for the FlexAttention
    comparison, with ``ours_seconds``: the block-sparse forward timed beside it, or
    ``"layer_step"``); ``rss_bytes``: peak resident bytes above the process's size before the
    first step; ``map_bytes`` / ``dense_bytes``: the block map's bytes and a dense bool mask's;
    ``density``: the fraction of tiles computed."""

    rss_bytes: int | None = None
    map_bytes: int | None = None
    dense_bytes: int | None = None
    density: float | None = None
    ours_seconds: float | None = None


def _rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _reset_peak() -> bool:
    """Start the kernel's peak-resident counter (VmHWM) afresh, so what building the inputs (a
    dense mask) held and freed is not counted as the step's; False where Linux does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss(reset: bool) -> int:
    """Peak resident bytes since :func:`_reset_peak` (or, without it, over the process's life)."""
    if reset:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _inputs(n: int, grad: bool, device: str = "cpu") -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(n)  # drawn on the CPU: the same numbers on every device
    return [torch.randn(1, HEADS, n, HEAD_DIM, generator=g).to(device).requires_grad_(grad) for _ in range(3)]


def _step(pattern: str, n: int, method: str, device: str = "cpu") -> Callable[[], None]:
    """One forward + backward of ``method`` (or the layer's training step) on ``device``."""
    mask = pattern_mask(pattern, n)
    if method == "layer_step":
        from ..layers.multihead import MultiHeadAttention

        torch.manual_seed(0)
        layer = MultiHeadAttention(HEADS * HEAD_DIM, HEADS).to(device)
        opt = torch.optim.SGD(layer.parameters(), lr=1e-3)
        x = torch.randn(1, n, HEADS * HEAD_DIM).to(device)

        def train():
            opt.zero_grad(set_to_none=True)
            layer(x, mask=mask).output.square().mean().backward()
            opt.step()

        return train
    q, k, v = _inputs(n, True, device)
    if method == "dense mask":
        dense = mask.dense(n, device=device)
        call = lambda: attend(q, k, v, mask=dense)  # noqa: E731
    elif method == "block-sparse":
        call = lambda: attend(q, k, v, mask=mask, backend="chunked")  # noqa: E731
    elif method == "pytorch causal":
        call = lambda: attend(q, k, v, mask=masks.causal())  # noqa: E731  (the fused is_causal kernel)
    else:
        raise ValueError(f"unknown method {method!r}")

    def fwd_bwd():
        for t in (q, k, v):
            t.grad = None
        call().output.sum().backward()

    return fwd_bwd


def _time_here(pattern: str, n: int, method: str, min_repeats: int, target_seconds: float, device: str = "cpu") -> dict:
    """In this (fresh) process: the warm-up and timed steps of one cell on ``device``, and its peak
    memory: resident bytes on the CPU (``rss``), the CUDA allocator's peak above the inputs on a
    CUDA device (``peak``)."""
    if method == "flex":
        return _flex_here(pattern, n, min_repeats, target_seconds, device)
    step = _step(pattern, n, method, device)
    if torch.device(device).type == "cuda":
        from ..devices import peak_memory, reset_peak_memory, synchronize

        synchronize(device)
        held = torch.cuda.memory_allocated(device)
        reset_peak_memory(device)
        times = round_robin({"x": step}, min_repeats, target_seconds, max_repeats=5,
                            slow_seconds=20.0, device=device)["x"]
        return {"seconds": times, "rss": None, "peak": max(0, (peak_memory(device) or 0) - held)}
    before, reset = _rss_now(), _reset_peak()
    times = round_robin({"x": step}, min_repeats, target_seconds, max_repeats=5, slow_seconds=20.0, device=device)["x"]
    return {"seconds": times, "rss": _peak_rss(reset) - before}


def _flex_here(pattern: str, n: int, min_repeats: int, target_seconds: float, device: str = "cpu") -> dict:
    """Forward only, side by side: compiled FlexAttention and the block-sparse attend."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    mask = pattern_mask(pattern, n)
    q, k, v = _inputs(n, False, device)
    with quiet_stderr():
        block_mask = create_block_mask(mask, None, None, n, n, device=device, _compile=True)
        compiled = torch.compile(flex_attention)
        compiled(q, k, v, block_mask=block_mask)  # compile

    def flex():
        compiled(q, k, v, block_mask=block_mask)

    def ours():
        with torch.no_grad():
            attend(q, k, v, mask=mask, backend="chunked")

    with quiet_stderr():
        times = round_robin({"flex": flex, "ours": ours}, min_repeats, target_seconds, max_repeats=10, device=device)
    return {"seconds": times["flex"], "ours": times["ours"], "rss": None}


def _cell(pattern: str, n: int, method: str, min_repeats: int, target_seconds: float, device: str = "cpu") -> dict:
    spec = {"pattern": pattern, "n": n, "method": method, "min_repeats": min_repeats,
            "target_seconds": target_seconds, "device": device}
    return measure_in_child("attnlab.studies.masks", spec, f"{pattern} N={n} {method}", env={})  # glibc's defaults


def run(
    sizes: Iterable[int] = (4096, 8192, 16384, 32768, 65536, 131072),
    patterns: Iterable[str] | None = None,
    methods: Iterable[str] = METHODS,
    *,
    min_repeats: int = 3,
    target_seconds: float = 4.0,
    dense_up_to: int = 16384,
    flex_up_to: int = 16384,
    quadratic_up_to: int = 32768,
    layer_step: int | None = 131072,
    device: str | torch.device = "cpu",
    on_record: Callable[[Record], None] | None = None,
) -> list[Record]:
    """Measure every (pattern, N, method) in its own process (module docstring) on ``device``;
    returns the records. On a CUDA device the steps are timed between synchronisations and a
    record's memory is ``peak_bytes`` (the allocator's peak above the inputs), not ``rss_bytes``."""
    device = str(torch.device(device))
    sizes = sorted(set(sizes))
    patterns = list(PATTERNS) if patterns is None else list(patterns)
    methods = list(methods)
    for p in patterns:
        if p not in PATTERNS:
            raise ValueError(f"unknown pattern {p!r}; expected some of {list(PATTERNS)}")
    for m in methods:
        if m not in METHODS:
            raise ValueError(f"unknown method {m!r}; expected some of {list(METHODS)}")
    records: list[Record] = []

    def emit(rec: Record) -> None:
        records.append(rec)
        if on_record is not None:
            on_record(rec)

    for p in patterns:
        quadratic = PATTERNS[p][1]
        for n in sizes:
            if quadratic and n > quadratic_up_to:
                continue
            bm = masks.block_map(pattern_mask(p, n), n)
            geometry = {"map_bytes": bm.nbytes(), "dense_bytes": n * n, "density": bm.density()}
            for m in methods:
                if ((m == "dense mask" and n > dense_up_to) or (m == "flex" and n > flex_up_to)
                        or (m == "pytorch causal" and p != "causal")):
                    continue
                got = _cell(p, n, m, min_repeats, target_seconds, device)
                ts = got["seconds"][1:] or got["seconds"]
                ours = None if "ours" not in got else statistics.median(got["ours"][1:] or got["ours"])
                emit(Record(p, n, m, "fwd" if m == "flex" else "fwd_bwd", statistics.median(ts), got.get("peak"),
                            len(ts), rss_bytes=got["rss"], ours_seconds=ours, **geometry))
    if layer_step:
        got = _cell("window", layer_step, "layer_step", 1, 0.0, device)
        ts = got["seconds"][1:] or got["seconds"]
        emit(Record("window", layer_step, "layer_step", "layer_step", statistics.median(ts), got.get("peak"), len(ts),
                    rss_bytes=got["rss"]))
    return records


def slopes(records: list[Record] | list[dict], lo: int = 4096, hi: int = 32768) -> dict[str, float | None]:
    """Per pattern: the log-log slope of the block-sparse forward + backward time against N over ``lo .. hi``."""
    rows = [r if isinstance(r, dict) else r.to_dict() for r in records]
    out = {}
    for p in dict.fromkeys(r["pattern"] for r in rows):
        pts = [(r["n"], r["seconds"]) for r in rows if r["pattern"] == p and r["method"] == "block-sparse"
               and lo <= r["n"] <= hi]
        out[p] = loglog_slope(pts)
    return out


def flex_ratios(records: list[Record] | list[dict]) -> list[dict]:
    """The forward comparisons: block-sparse seconds / compiled FlexAttention seconds (< 1: faster)."""
    rows = [r if isinstance(r, dict) else r.to_dict() for r in records]
    return [{"pattern": r["pattern"], "n": r["n"], "ours": r["ours_seconds"], "flex": r["seconds"],
             "ratio": r["ours_seconds"] / r["seconds"]}
            for r in rows if r["method"] == "flex" and r["seconds"] and r["ours_seconds"]]


if __name__ == "__main__":  # worker: one cell; spec as JSON on stdin
    _spec = json.loads(sys.stdin.read())
    print(json.dumps(_time_here(_spec["pattern"], _spec["n"], _spec["method"], _spec["min_repeats"],
                                _spec["target_seconds"], _spec.get("device", "cpu"))))
