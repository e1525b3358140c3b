"""The mask protocol: a mask is a function of positions, ``mask(b, h, q_idx, kv_idx) -> bool``.

FlexAttention's ``mask_mod`` signature (``torch.nn.attention.flex_attention``): ``True`` = this query may attend to this
key. attnlab calls it with broadcasting index tensors (``b`` of shape ``(B, 1, 1, 1)``, ``h`` ``(1, H, 1, 1)``,
``q_idx`` ``(…, n, 1)``, ``kv_idx`` ``(…, 1, m)``), so any function built from elementwise torch operations and tensor
indexing runs unchanged on both (attention-gym's mask_mods included); the shape of its result tells whether it depends
on the batch row or the head.

A :class:`Mask` is such a function that also knows its structure: which tiles of a grid are :data:`EMPTY`, :data:`FULL`
or :data:`PARTIAL`, without evaluating a pair (:meth:`Mask.tiles`), so that :func:`attnlab.core.blockmap.block_map` maps
a long mask without its N x M pairs (a plain callable's tiles are evaluated a batch of tiles at a time). Masks compose
with ``&``, ``|``, ``~``. Here: the protocol, the combinators, the adapters (a bool tensor, a plain callable);
:mod:`attnlab.core.positioned` evaluates a mask at given positions, :mod:`attnlab.core.masks` is the library.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch

from ..validate import ArgumentTypeError
from .tiles import EMPTY, FULL, PARTIAL, UNKNOWN, Grid, broadcast_shape, combine_and, combine_or

__all__ = ["EMPTY", "PARTIAL", "FULL", "UNKNOWN", "Grid", "Mask", "TensorMask", "FunctionMask", "And", "Or", "Not",
           "Everything", "as_mask", "and_masks", "or_masks", "broadcast_shape", "combine_and", "combine_or"]

class Mask:
    """Base class of masks: a callable ``(b, h, q_idx, kv_idx) -> bool tensor`` that knows its structure.

    Subclasses implement :meth:`__call__` and, where they can, :meth:`tiles`. Attributes:

    * ``batch``: the batch rows the mask is defined for (key padding, documents), or None;
    * ``key_only``: the mask depends on the batch row and the key alone (padding): efficient
      variants that take key padding take it;
    * ``shift_invariant``: the mask depends on ``kv_idx - q_idx`` alone (windows, causal), so
      every tile row of a band has the same pattern: the engine evaluates it once.
    """

    batch: int | None = None
    key_only: bool = False
    shift_invariant: bool = False

    def __call__(self, b, h, q_idx, kv_idx) -> torch.Tensor:
        raise NotImplementedError

    def tiles(self, grid: Grid) -> torch.Tensor | None:
        """The state of every tile of ``grid``, a uint8 tensor broadcastable to ``(B, H, I, J)``
        with values :data:`EMPTY`, :data:`PARTIAL`, :data:`FULL` or :data:`UNKNOWN`; None when
        the structure says nothing (every tile is evaluated)."""
        return None

    def bind(self, n: int, m: int) -> Mask:
        """This mask for ``n`` queries and ``m`` keys (masks aligned to the last key resolve
        their offset here; random patterns are drawn for the size). Default: itself."""
        return self

    def to(self, device) -> Mask:
        """This mask with the tensors it reads (and those of the masks it holds) on ``device``: a
        copy, or itself when nothing moves. FlexAttention compiles the mask function for its
        device, where a copy made inside it is a buffer that Triton's lowering refuses."""
        moved = {key: new for key, old in vars(self).items() if (new := _moved(old, device)) is not old}
        out = copy.copy(self) if moved else self
        vars(out).update(moved)
        return out

    def hidden_keys(self, m: int, device=None) -> torch.Tensor | None:
        """``(B or 1, m)`` bool, True for keys no query may see (padding), as far as the structure tells, else None."""
        return None

    def positions(self, n: int, device=None) -> torch.Tensor | None:
        """The positions a positional encoding should see for ``n`` tokens (packed documents
        restart at 0 in every document: ``(B, n)``), or None for the usual ``0 .. n-1``."""
        return None

    def is_causal(self, n: int, m: int) -> bool:
        """Whether this is exactly ``kv <= q`` on an ``n x m`` grid (PyTorch's fused causal path)."""
        return False

    def dense(self, n: int, m: int | None = None, *, batch: int | None = None, heads: int | None = None,
              device=None) -> torch.Tensor:
        """The mask as a bool tensor: ``(n, m)``, or ``(B, 1|H, n, m)`` / ``(B, 1, 1, m)`` when it
        depends on the batch row (leading dimensions of size 1 dropped down to 2-D)."""
        for name, size in (("n", n), ("m", m)):
            if size is not None and (not isinstance(size, int) or isinstance(size, bool)):
                raise ArgumentTypeError(f"{name} must be an int, got {type(size).__name__}")
            if size is not None and size < 0:
                raise ValueError(f"{name} must be >= 0, got {size}")
        m = n if m is None else m
        bound = self.bind(n, m)
        b = torch.arange(batch or self.batch or 1, device=device)[:, None, None, None]
        h = torch.arange(heads or 1, device=device)[None, :, None, None]
        q = torch.arange(n, device=device)[:, None]
        kv = torch.arange(m, device=device)[None, :]
        out = torch.as_tensor(bound(b, h, q, kv), device=device)
        if self.key_only:  # key padding keeps the (B, 1, 1, M) shape that layers and torch expect
            return out.reshape((1,) * (4 - out.dim()) + tuple(out.shape)).expand(-1, -1, 1, m).to(torch.bool)
        out = out.reshape((1,) * max(0, 2 - out.dim()) + tuple(out.shape))
        out = out.expand(*out.shape[:-2], n, m)
        while out.dim() > 2 and out.shape[0] == 1 and all(s == 1 for s in out.shape[:-2]):
            out = out[0]
        return out.to(torch.bool)

    def __and__(self, other):
        return NotImplemented if (other := _maybe_mask(other)) is None else And(self, other)

    def __rand__(self, other):
        return NotImplemented if (other := _maybe_mask(other)) is None else And(other, self)

    def __or__(self, other):
        return NotImplemented if (other := _maybe_mask(other)) is None else Or(self, other)

    def __ror__(self, other):
        return NotImplemented if (other := _maybe_mask(other)) is None else Or(other, self)

    def __invert__(self):
        return Not(self)


def _moved(value, device):
    """``value`` on ``device`` when it is a tensor, a mask or a tuple of masks (the parts); else itself."""
    if isinstance(value, tuple) and value and all(isinstance(v, Mask) for v in value):
        parts = tuple(v.to(device) for v in value)
        return value if all(a is b for a, b in zip(parts, value)) else parts
    return value.to(device) if isinstance(value, (torch.Tensor, Mask)) else value


class TensorMask(Mask):
    """A bool tensor broadcastable to ``(B, H, N, M)`` used as a mask function (indexed by position)."""

    def __init__(self, tensor: torch.Tensor):
        if not isinstance(tensor, torch.Tensor):
            raise ArgumentTypeError("a mask must be a torch.Tensor, a callable or an attnlab mask, got "
                                    f"{type(tensor).__name__}")
        if tensor.dtype != torch.bool:
            raise ArgumentTypeError("a mask tensor must have dtype torch.bool (True = this query may attend to this "
                                    f"key), got {tensor.dtype}")
        if not 1 <= tensor.dim() <= 4:
            raise ValueError("a mask tensor must have 1 to 4 dimensions, broadcastable to (B, H, N, M); got shape "
                             f"{tuple(tensor.shape)}")
        self.tensor = tensor.reshape((1,) * (4 - tensor.dim()) + tuple(tensor.shape))  # (B|1, H|1, N|1, M|1)
        self.batch = self.tensor.shape[0] if self.tensor.shape[0] > 1 else None
        self.key_only = self.tensor.shape[1] == 1 and self.tensor.shape[2] == 1

    def __call__(self, b, h, q_idx, kv_idx):
        t = self.tensor
        zero = torch.zeros((), dtype=torch.long, device=t.device)  # a size-1 axis: read at 0, broadcast nothing
        idx = [x if size > 1 else zero for x, size in zip((b, h, q_idx, kv_idx), t.shape)]
        return t[idx[0], idx[1], idx[2], idx[3]]

    def tiles(self, grid):
        if grid.uniform is None:
            return None
        bq, bk, q0, q1, m = grid.uniform
        t = self.tensor
        if t.shape[3] not in (1, m) or (t.shape[2] != 1 and t.shape[2] < q1):
            raise ValueError(f"a mask of shape {tuple(t.shape)} does not broadcast to a grid of {q1} queries x {m} "
                             "keys")
        if t.shape[2] > 1:
            t = t[:, :, q0:q1]
        full = _reduce_blocks(t, bq, bk, all_=True)
        some = _reduce_blocks(t, bq, bk, all_=False)
        return torch.where(full, FULL, torch.where(some, PARTIAL, EMPTY)).to(torch.uint8)

    def hidden_keys(self, m, device=None):
        seen = self.tensor.any(2).any(1)  # (B|1, M|1)
        return ~seen.expand(seen.shape[0], m)


def _reduce_blocks(t: torch.Tensor, bq: int, bk: int, *, all_: bool) -> torch.Tensor:
    """All / any of ``t`` ``(B, H, N|1, M|1)`` over each ``bq x bk`` tile (a size-1 axis stays 1);
    a ragged last tile reduces over its real entries only."""
    fill = all_
    n, m = t.shape[2], t.shape[3]
    if n > 1 and n % bq:
        t = torch.cat([t, t.new_full((*t.shape[:2], bq - n % bq, t.shape[3]), fill)], 2)
    if m > 1 and m % bk:
        t = torch.cat([t, t.new_full((*t.shape[:3], bk - m % bk), fill)], 3)
    b, h, n2, m2 = t.shape
    qb, kb = (bq, n2 // bq) if n2 > 1 else (1, 1), (bk, m2 // bk) if m2 > 1 else (1, 1)
    v = t.view(b, h, qb[1], qb[0], kb[1], kb[0])
    return v.all(5).all(3) if all_ else v.any(5).any(3)


class FunctionMask(Mask):
    """A plain callable ``(b, h, q_idx, kv_idx) -> bool`` (FlexAttention's mask_mod): no structure known.

    Evaluated as FlexAttention evaluates it: under ``torch.vmap``, one scalar ``(b, h, q, kv)`` at a time (so indexing a
    table with ``q_idx`` gives a scalar, whatever the table's shape), a million pairs per batch. Whether it depends on
    the batch row or the head is read off a probe of 4096 pairs at every ``b`` and ``h`` the first time it is called
    with several (``batch`` / ``heads`` True or False say it instead).
    """

    PAIRS = 1 << 18

    def __init__(self, fn: Callable, *, batch: bool | None = None, heads: bool | None = None):
        self.fn = fn
        self.uses_b, self.uses_h = batch, heads
        self._vmapped = torch.vmap(fn)

    def _probe(self, b, h, q_idx, kv_idx) -> None:
        """Decide ``uses_b`` / ``uses_h``: evaluate a sample of pairs at every b and h given."""
        bs, hs = torch.unique(torch.as_tensor(b)), torch.unique(torch.as_tensor(h))
        shape = broadcast_shape(q_idx.shape, kv_idx.shape)
        q, kv = q_idx.expand(shape).reshape(-1), kv_idx.expand(shape).reshape(-1)
        take = torch.randperm(q.numel(), generator=torch.Generator().manual_seed(0))[:4096].to(q.device)
        q, kv = q[take], kv[take]
        grid = torch.stack([torch.stack([self._flat(bb.expand_as(q), hh.expand_as(q), q, kv) for hh in hs])
                            for bb in bs])
        if self.uses_b is None:
            self.uses_b = bool(bs.numel() > 1 and (grid != grid[:1]).any())
        if self.uses_h is None:
            self.uses_h = bool(hs.numel() > 1 and (grid != grid[:, :1]).any())

    def _flat(self, b, h, q, kv) -> torch.Tensor:
        return self._checked(self._run(self._vmapped, b, h, q, kv))

    def _run(self, fn, *args):
        """``fn(*args)``, a vmapped mask function; Python control flow on its position tensors (an
        ``if``, ``and`` / ``or``, ``bool()``, ``.item()``), which vmap cannot decide, is answered
        with how to write it instead of PyTorch's message."""
        try:
            return fn(*args)
        except RuntimeError as e:
            if "data-dependent control flow" not in str(e) and ".item()" not in str(e):
                raise
            name = getattr(self.fn, "__name__", type(self.fn).__name__)
            raise ValueError(
                f"the mask function {name} decides with Python control flow on its positions (an if, and / or / not, "
                "bool() or item()): it runs on tensors of positions (under torch.vmap, as FlexAttention runs it), "
                "where that cannot be decided; write the rule as one tensor expression: comparisons (q_idx >= kv_idx) "
                "combined with & | ~, and torch.where(cond, a, b) for a choice") from None

    def _checked(self, out) -> torch.Tensor:
        """The function's result, refused unless bool: an int 0 / 1 or a float is no mask (one dtype look per call)."""
        out = torch.as_tensor(out)
        if out.dtype != torch.bool:
            name = getattr(self.fn, "__name__", type(self.fn).__name__)
            raise ArgumentTypeError("a mask function must return bool (True = this query may attend to this key); "
                                    f"{name} returned {out.dtype}: return the comparison itself, e.g. q_idx >= kv_idx, "
                                    "not (q_idx >= kv_idx).int()")
        return out

    def __call__(self, b, h, q_idx, kv_idx):
        b, h = torch.as_tensor(b, device=q_idx.device), torch.as_tensor(h, device=q_idx.device)
        if (self.uses_b is None and b.numel() > 1) or (self.uses_h is None and h.numel() > 1):
            self._probe(b, h, q_idx, kv_idx)
        b = b if self.uses_b else torch.zeros((), dtype=b.dtype, device=b.device)
        h = h if self.uses_h else torch.zeros((), dtype=h.dtype, device=h.device)
        shape = broadcast_shape(b.shape, h.shape, q_idx.shape, kv_idx.shape)
        args = [x.reshape((1,) * (len(shape) - x.dim()) + tuple(x.shape)) for x in (b, h, q_idx, kv_idx)]
        levels = [d for d in range(len(shape)) if shape[d] > 1]
        if not levels:
            return self._flat(*(a.reshape(1) for a in args)).reshape(shape)
        # one vmap per dimension of the grid, each argument batched only where it varies: no index grid is built
        first = levels[0]
        step = max(1, self.PAIRS // max(1, torch.Size(shape).numel() // shape[first]))
        out = torch.empty(shape, dtype=torch.bool, device=q_idx.device)
        for a in range(0, shape[first], step):
            part = [x.narrow(first, a, min(step, shape[first] - a)) if x.shape[first] > 1 else x for x in args]
            sub = list(shape)
            sub[first] = min(step, shape[first] - a)
            out.narrow(first, a, sub[first]).copy_(self._grid(part, sub, levels))
        return out

    def _grid(self, args: list, shape: list, levels: list) -> torch.Tensor:
        kept = [[a.shape[d] > 1 for d in levels] for a in args]
        squeezed = [a.reshape([a.shape[d] for d in levels if a.shape[d] > 1]) for a in args]
        fn = self.fn
        for i in reversed(range(len(levels))):
            fn = torch.vmap(fn, in_dims=tuple(0 if k[i] else None for k in kept))
        return self._checked(self._run(fn, *squeezed)).reshape(shape)

    def __repr__(self):
        return f"FunctionMask({getattr(self.fn, '__name__', self.fn)!r})"


class _Combination(Mask):
    def __init__(self, *parts):
        self.parts = tuple(as_mask(p) for p in parts)
        rows = {p.batch for p in self.parts if p.batch is not None}
        if len(rows - {1}) > 1:  # one row broadcasts over any batch
            raise ValueError(f"masks defined for different batch sizes cannot be combined: {sorted(rows)}")
        self.batch = max(rows) if rows else None
        self.key_only = all(p.key_only for p in self.parts)
        self.shift_invariant = all(p.shift_invariant for p in self.parts)

    def bind(self, n, m):
        return type(self)(*(p.bind(n, m) for p in self.parts))

    def positions(self, n, device=None):
        for p in self.parts:
            pos = p.positions(n, device)
            if pos is not None:
                return pos
        return None

    def __repr__(self):
        return f"{type(self).__name__}({', '.join(map(repr, self.parts))})"


class And(_Combination):
    """Pairs every part allows (``a & b``)."""

    def __call__(self, b, h, q_idx, kv_idx):
        out = None
        for p in self.parts:
            r = p(b, h, q_idx, kv_idx)
            out = r if out is None else out & r
        return out

    def tiles(self, grid):
        return combine_and([p.tiles(grid) for p in self.parts])

    def hidden_keys(self, m, device=None):
        known = [k for k in (p.hidden_keys(m, device) for p in self.parts) if k is not None]
        if not known:
            return None
        out = known[0]
        for k in known[1:]:
            out = out | k
        return out

    def is_causal(self, n, m):
        causal = [p for p in self.parts if p.is_causal(n, m)]
        return bool(causal) and all(p.is_causal(n, m) or isinstance(p, Everything) for p in self.parts)


class Or(_Combination):
    """Pairs some part allows (``a | b``)."""

    def __call__(self, b, h, q_idx, kv_idx):
        out = None
        for p in self.parts:
            r = p(b, h, q_idx, kv_idx)
            out = r if out is None else out | r
        return out

    def tiles(self, grid):
        return combine_or([p.tiles(grid) for p in self.parts])

    def hidden_keys(self, m, device=None):
        known = [p.hidden_keys(m, device) for p in self.parts]
        if any(k is None for k in known):
            return None
        out = known[0]
        for k in known[1:]:
            out = out & k
        return out


class Not(Mask):
    """Pairs ``inner`` forbids (``~mask``)."""

    def __init__(self, inner):
        self.inner = inner = as_mask(inner)
        self.batch, self.key_only, self.shift_invariant = inner.batch, inner.key_only, inner.shift_invariant

    def __call__(self, b, h, q_idx, kv_idx):
        return ~self.inner(b, h, q_idx, kv_idx)

    def tiles(self, grid):
        s = self.inner.tiles(grid)
        if s is None:
            return None
        return torch.where(s == EMPTY, FULL, torch.where(s == FULL, EMPTY, s)).to(torch.uint8)

    def bind(self, n, m):
        return Not(self.inner.bind(n, m))

    def __repr__(self):
        return f"~{self.inner!r}"


class Everything(Mask):
    """Every pair (the neutral element of ``&``)."""

    shift_invariant = True

    def __call__(self, b, h, q_idx, kv_idx):
        return torch.ones((), dtype=torch.bool, device=q_idx.device).expand(broadcast_shape(q_idx.shape, kv_idx.shape))

    def tiles(self, grid):
        return torch.full((), FULL, dtype=torch.uint8, device=grid.q_lo.device)

    def hidden_keys(self, m, device=None):
        return torch.zeros(1, m, dtype=torch.bool, device=device)

    def __repr__(self):
        return "full()"


def _maybe_mask(x) -> Mask | None:
    if isinstance(x, Mask):
        return x
    if isinstance(x, torch.Tensor) or (callable(x) and not isinstance(x, type)):
        return as_mask(x)
    return None


def as_mask(x) -> Mask:
    """A :class:`Mask` from a mask, a bool tensor broadcastable to ``(B, H, N, M)`` or a
    callable ``(b, h, q_idx, kv_idx) -> bool`` (FlexAttention's mask_mod)."""
    if isinstance(x, Mask):
        return x
    if isinstance(x, torch.Tensor):
        return TensorMask(x)
    if callable(x) and not isinstance(x, type):
        return FunctionMask(x)
    raise ArgumentTypeError("a mask must be a bool torch.Tensor, a callable (b, h, q_idx, kv_idx) -> bool or an "
                            f"attnlab mask, got {type(x).__name__}")


def and_masks(*masks):
    """Pairs every mask allows; ``None`` arguments (no constraint) are skipped (all None: None).
    Bool tensors alone combine into a bool tensor; anything else into a :class:`Mask`."""
    present = [m for m in masks if m is not None]
    wrapped = [as_mask(m) for m in present]
    _check_tensor_shapes(wrapped, "and_masks")
    if present and all(isinstance(m, torch.Tensor) for m in present):
        return _tensor_fold(present, torch.logical_and)
    return None if not present else wrapped[0] if len(wrapped) == 1 else And(*wrapped)


def or_masks(*masks):
    """Pairs some mask allows; a ``None`` argument means "every pair", so it makes the union None.
    Bool tensors alone combine into a bool tensor; anything else into a :class:`Mask`."""
    wrapped = [as_mask(m) for m in masks if m is not None]
    if any(m is None for m in masks):
        return None
    _check_tensor_shapes(wrapped, "or_masks")
    if masks and all(isinstance(m, torch.Tensor) for m in masks):
        return _tensor_fold(list(masks), torch.logical_or)
    return None if not wrapped else wrapped[0] if len(wrapped) == 1 else Or(*wrapped)


def _tensor_fold(tensors: list, op) -> torch.Tensor:
    out = tensors[0]
    for t in tensors[1:]:
        out = op(out, t)
    return out


def _check_tensor_shapes(present: list[Mask], name: str) -> None:
    shapes = [p.tensor.shape for p in present if isinstance(p, TensorMask)]
    try:
        broadcast_shape(*shapes)
    except ValueError as e:
        raise ValueError(f"{name}: masks of shapes {', '.join(str(tuple(s)) for s in shapes)} do not broadcast") from e
