"""The CNN / RNN / self-attention comparison, measured: time against n, sequential steps, path length.

The textbook table (Vaswani et al. 2017, Table 1; the lecture's comparison) says, per layer of
width d over n positions:

=================  ==============  ===================  ==================
layer              cost            sequential steps     max path length
=================  ==============  ===================  ==================
self-attention     O(n^2 d)        O(1)                 O(1)
RNN                O(n d^2)        O(n)                 O(n)
CNN (kernel k)     O(k n d^2)      O(1)                 O(n / k)
=================  ==============  ===================  ==================

Here each column is measured on attnlab's layers (:mod:`attnlab.recurrent.layers`; the CNN is
causal with kernel 3, looking back like the recurrent layers, so a signal moves k - 1 positions
per layer):

* **time**: median forward seconds (no gradient, B = 1, fp32) at each n, each layer timed alone
  in a fresh process that keeps the memory it frees (:func:`attnlab.profiling.allocator_env`),
  its lengths swept ``rounds`` times one after another (the median of the rounds is kept: a
  slow spell of the machine falls on every n; in one shared process the attention-RNNs' n^2
  allocations would slow the layers timed after them). The exponent: a least-squares fit of log
  time against log n over the lengths where the layer's leading term dominates (:data:`FIT_SIZES`,
  stated beside each exponent);
* **sequential steps**: the longest chain of dependent ATen operations in one forward pass,
  traced with a ``TorchDispatchMode``: every operation's depth is one more than the deepest
  tensor it reads (views cost nothing; an in-place write deepens the whole storage). A loop
  over positions shows up as a chain growing with n; a layer whose work runs in parallel
  over positions has a chain of constant length;
* **path length**: how many layers (stacks: ``cnn``, ``self_attention``) or recurrent
  hand-overs (``rnn``, ``lstm``, ``attention_rnn``, ``lstmn``) a signal from input position 0
  must cross to reach output position n - 1: the smallest depth (layers) or truncation
  (``truncate=s``: gradients cross only the last s hand-overs) at which
  ``d out_{n-1} / d x_0`` is non-zero, found by bisection, in float64.
"""

from __future__ import annotations

import json
import statistics
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ..profiling import allocator_env, loglog_slope, measure_in_child, round_robin
from ..recurrent import layers as layer_registry
from .records import StudyRecord

__all__ = [
    "LAYERS",
    "TEXTBOOK",
    "ComplexityRecord",
    "FIT_SIZES",
    "fit_ranges",
    "sequential_steps",
    "path_length",
    "run",
    "exponents",
]

LAYERS = ("cnn", "rnn", "lstm", "self_attention", "attention_rnn", "lstmn")
"""The layer types compared, by :func:`attnlab.recurrent.create` name."""

TEXTBOOK: dict[str, tuple[str, str, str]] = {
    "cnn": ("O(k n d^2)", "O(1)", "O(n/k)"),
    "rnn": ("O(n d^2)", "O(n)", "O(n)"),
    "lstm": ("O(n d^2)", "O(n)", "O(n)"),
    "self_attention": ("O(n^2 d)", "O(1)", "O(1)"),
    "attention_rnn": ("O(n^2 d + n d^2)", "O(n)", "O(1)"),
    "lstmn": ("O(n^2 d + n d^2)", "O(n)", "O(1)"),
}
"""(cost, sequential steps, path length) per layer: the textbook's for CNN, RNN and self-attention
(LSTM as RNN); for the attention-RNNs, what their equations imply (n steps, each attending
over up to n earlier states, which puts every earlier state one hand-over away)."""

KERNEL = 3

FIT_SIZES: dict[str, tuple[int, ...]] = {
    "cnn": (8192, 16384, 32768, 65536, 131072, 262144),
    "rnn": (1024, 2048, 4096, 8192),
    "lstm": (1024, 2048, 4096, 8192),
    "self_attention": (4096, 8192, 16384, 32768),
    "attention_rnn": (1024, 2048, 4096, 8192),
    "lstmn": (1024, 2048, 4096, 8192),
}
"""Per layer, the lengths its time exponent is fitted over: where its leading term dominates.
The CNN's fixed cost per call (its time at n = 64) is under 5% of its time from 8K positions
(d = 64; the times: ``benchmarks/results/complexity-*``); the recurrent layers pay a fixed cost
per step from the start; self-attention's O(n^2 d) outweighs its block's O(n d^2) work
(projections and feed-forward) several times from n = 4096. ``attnlab complexity`` times each
layer at these lengths too (``--no-fit``: only ``--sizes``)."""


@dataclass
class ComplexityRecord(StudyRecord):
    """One (layer, n): median forward seconds, sequential steps, path length (None where not measured)."""

    layer: str
    n: int
    seconds: float | None
    sequential_steps: int | None
    path_length: int | None


def _layer(name: str, embed_dim: int, depth: int = 1, dtype=torch.float32):
    torch.manual_seed(0)
    opts = {"num_layers": depth} if name in ("cnn", "self_attention") else {}
    if name == "cnn":
        opts.update(kernel_size=KERNEL, causal=True)
    return layer_registry.create(name, embed_dim, **opts).to(dtype).eval()


class _DepthTracer(TorchDispatchMode):
    """Depth of every storage written during a forward pass (see the module docstring)."""

    def __init__(self):
        super().__init__()
        self.depth: dict[int, int] = {}
        self.deepest = 0

    @staticmethod
    def _key(t: torch.Tensor):
        try:
            return t.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError):  # pragma: no cover - storage-less tensors
            return None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        in_keys = {self._key(t) for t in inputs}
        d_in = max((self.depth.get(self._key(t), 0) for t in inputs), default=0)
        out = func(*args, **kwargs)
        schema = func._schema
        aliasing = any(r.alias_info is not None for r in schema.returns)
        writes = any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
        view_only = aliasing and not writes
        d = d_in if view_only else d_in + 1
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                key = self._key(t)
                if key is None:
                    continue
                # a fresh tensor takes its depth; a view or an in-place result deepens its storage
                self.depth[key] = max(self.depth.get(key, 0), d) if key in in_keys else d
        self.deepest = max(self.deepest, d)
        return out


def sequential_steps(layer: torch.nn.Module, x: torch.Tensor) -> int:
    """The longest chain of dependent ATen operations in ``layer(x)`` (no gradient)."""
    tracer = _DepthTracer()
    # without oneDNN, fused recurrent kernels (nn.LSTM) run as their per-step operations
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the flags context warns about Intel GPUs
        with torch.no_grad(), torch.backends.mkldnn.flags(enabled=False), tracer:
            layer(x)
    return tracer.deepest


def _reaches(name: str, n: int, embed_dim: int, depth: int, truncate: int | None) -> bool:
    """Is ``d out_{n-1} / d x_0`` non-zero (float64) for this depth / truncation?"""
    layer = _layer(name, embed_dim, depth, torch.float64)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, n, embed_dim, generator=g, dtype=torch.float64, requires_grad=True)
    out = layer(x, truncate=truncate) if truncate is not None else layer(x)
    probe = torch.randn(embed_dim, generator=g, dtype=torch.float64)
    (grad,) = torch.autograd.grad(out[0, n - 1] @ probe, x, allow_unused=True)
    return grad is not None and bool(grad[0, 0].abs().max() > 0)


def _first_true(pred: Callable[[int], bool], lo: int, hi: int) -> int | None:
    """Smallest v in [lo, hi] with pred(v), pred monotone (False ... True); None if none."""
    if not pred(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if pred(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def path_length(name: str, n: int, embed_dim: int = 64) -> int | None:
    """Layers (stacks) or recurrent hand-overs between input 0 and output n - 1, measured."""
    layer = _layer(name, embed_dim)
    if getattr(layer, "recurrent", False):
        return _first_true(lambda s: _reaches(name, n, embed_dim, 1, s), 0, max(n - 1, 0))
    if getattr(layer, "stacked", False):
        return _first_true(lambda depth: _reaches(name, n, embed_dim, depth, None), 1, max(n, 1))
    raise ValueError(f"layer {name!r} is neither recurrent nor a stack")


def run(
    sizes: list[int],
    layers: tuple[str, ...] | list[str] = LAYERS,
    *,
    embed_dim: int = 64,
    path_sizes: tuple[int, ...] = (16, 64, 256),
    min_repeats: int = 3,
    target_seconds: float = 1.0,
    fit_sizes: dict[str, tuple[int, ...]] | None = None,
    rounds: int = 3,
    device: str | torch.device = "cpu",
    on_record: Callable[[ComplexityRecord], None] | None = None,
    on_timed: Callable[[str], None] | None = None,
) -> list[ComplexityRecord]:
    """Measure every layer at every n of ``sizes`` (and of ``path_sizes``); see the module docstring.

    ``fit_sizes``: per layer, more lengths to time that layer at (e.g. :data:`FIT_SIZES`, the
    range its exponent is fitted over); the others are not timed there. ``rounds``: sweeps over
    a layer's lengths in its timing process. ``on_timed(layer)``: after each timing process.
    ``device``: where the layers are timed (between synchronisations on a GPU); the sequential
    steps and path lengths are properties of the computation, traced on the CPU (a GPU's fused
    recurrent kernel would hide its steps).
    """
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    extra = {name: set((fit_sizes or {}).get(name, ())) for name in layers}
    all_sizes = sorted(set(sizes) | set(path_sizes) | set().union(*extra.values()))
    times: dict[tuple[str, int], float] = {}
    for name in layers:
        own = sorted(set(sizes) | extra[name])
        spec = {"layer": name, "sizes": own, "embed_dim": embed_dim, "min_repeats": min_repeats,
                "target_seconds": target_seconds, "rounds": rounds, "device": str(torch.device(device))}
        for n, seconds in measure_in_child("attnlab.studies.complexity", spec, name, env=allocator_env("keep")).items():
            times[(name, int(n))] = seconds
        if on_timed is not None:
            on_timed(name)
    records = []
    modules = {name: _layer(name, embed_dim) for name in layers}
    for n in all_sizes:
        x = torch.randn(1, n, embed_dim, generator=torch.Generator().manual_seed(n))
        for name in layers:
            if (name, n) not in times and n not in path_sizes:
                continue
            rec = ComplexityRecord(
                layer=name,
                n=n,
                seconds=times.get((name, n)),
                sequential_steps=sequential_steps(modules[name], x),
                path_length=path_length(name, n, embed_dim) if n in path_sizes else None,
            )
            records.append(rec)
            if on_record is not None:
                on_record(rec)
    return records


def _time_here(name: str, sizes: list[int], embed_dim: int, *, min_repeats: int, target_seconds: float, rounds: int,
               device: str = "cpu") -> dict[str, float]:
    """In this (fresh) process: the layer's forward on ``device`` at every n, swept ``rounds``
    times; per n the median of the rounds' medians (keys are n as strings, for JSON)."""
    layer = _layer(name, embed_dim).to(device)
    inputs = {n: torch.randn(1, n, embed_dim, generator=torch.Generator().manual_seed(n)).to(device) for n in sizes}
    medians: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(rounds):
        for n in sizes:

            def call(x=inputs[n]):
                with torch.no_grad():
                    layer(x)

            ts = round_robin({name: call}, min_repeats, target_seconds, device=device)[name]
            medians[n].append(statistics.median(ts[1:] or ts))
    return {str(n): statistics.median(m) for n, m in medians.items()}


def _fit_points(rows: list[dict], name: str, fit_from: int | None) -> list[tuple[int, float]]:
    """The (n, seconds) a layer's exponent is fitted over (see :func:`exponents`)."""
    timed = [(r["n"], r["seconds"]) for r in rows if r["layer"] == name and r["seconds"]]
    if fit_from is None:
        own = FIT_SIZES.get(name, ())
        inside = [p for p in timed if own and own[0] <= p[0] <= own[-1]]
        if len(inside) >= 2:
            return inside
        fit_from = 1024
    return [p for p in timed if p[0] >= fit_from]


def exponents(records: list[ComplexityRecord] | list[dict], fit_from: int | None = None) -> dict[str, float | None]:
    """Per layer: the slope of log seconds against log n over its :data:`FIT_SIZES` range
    (over n >= 1024 where fewer than two lengths of that range were timed), or over
    n >= ``fit_from`` when given."""
    rows = [r if isinstance(r, dict) else r.to_dict() for r in records]
    out = {}
    for name in dict.fromkeys(r["layer"] for r in rows):
        pts = _fit_points(rows, name, fit_from)
        out[name] = loglog_slope(pts) if len(pts) >= 2 else None
    return out


def fit_ranges(records: list[ComplexityRecord] | list[dict],
               fit_from: int | None = None) -> dict[str, tuple[int, int] | None]:
    """Per layer: the smallest and largest n that :func:`exponents` fitted over (None: no fit)."""
    rows = [r if isinstance(r, dict) else r.to_dict() for r in records]
    out = {}
    for name in dict.fromkeys(r["layer"] for r in rows):
        pts = _fit_points(rows, name, fit_from)
        out[name] = (min(n for n, _ in pts), max(n for n, _ in pts)) if len(pts) >= 2 else None
    return out


if __name__ == "__main__":  # worker: one layer's times; spec as JSON on stdin
    _spec = json.loads(sys.stdin.read())
    print(json.dumps(_time_here(_spec["layer"], _spec["sizes"], _spec["embed_dim"], min_repeats=_spec["min_repeats"],
                                target_seconds=_spec["target_seconds"], rounds=_spec["rounds"],
                                device=_spec.get("device", "cpu"))))
