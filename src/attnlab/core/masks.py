"""The library's masks, as functions of positions: ``mask(b, h, q_idx, kv_idx) -> bool``, True = may attend.

One convention everywhere in attnlab, the one of :func:`torch.nn.functional.scaled_dot_product_attention`
and FlexAttention's ``mask_mod``. Every builder here returns a :class:`attnlab.core.maskfn.Mask`:
a callable with FlexAttention's signature (so ``create_block_mask(masks.causal(), ...)`` works)
that also knows its tile structure, so :func:`attnlab.attend` computes only the tiles it allows
and never builds an ``N x M`` tensor. Compose with ``&``, ``|``, ``~`` (or :func:`and_masks`,
:func:`or_masks`); ``mask.dense(n, m)`` gives the bool tensor when one is wanted. A bool tensor
broadcastable to ``(B, H, N, M)`` and any plain callable are accepted wherever a mask is.

Alignment when the number of queries ``n`` differs from the number of keys ``m``: the masks
that relate positions (:func:`causal`, :func:`window`, :func:`no_self`, :func:`dilated_window`,
:func:`prefix_lm`) align the *last* query with the *last* key by default ("bottom-right", as in
FlashAttention >= 2.1 and KV-cache decoding): query ``i`` sits at key position ``i + (m - n)``.
``align="top_left"`` gives ``scaled_dot_product_attention(is_causal=True)``'s (query ``i`` at
key position ``i``). Called bare (outside attnlab, with no sizes known), indices are positions.

A query row with no allowed key is legal: :func:`attnlab.attend` returns zeros (and zero
gradients) for it.
"""

from __future__ import annotations

from typing import cast

import torch

from ..registry import Registry
from ..validate import ArgumentTypeError, is_int
from .band import Align, Band
from .maskfn import (
    EMPTY,
    FULL,
    PARTIAL,
    And,
    Everything,
    Grid,
    Mask,
    Not,
    Or,
    TensorMask,
    and_masks,
    as_mask,
    broadcast_shape,
    or_masks,
)

__all__ = ["Mask", "as_mask", "and_masks", "or_masks", "valid_key_flags", "padding_tensor_hint"]

LIBRARY: Registry = Registry("mask")
"""Every mask builder of the library by name (what the property tests and ``attnlab bench masks``
iterate): a builder joins it, and this module's exports, with :func:`builder`."""


def builder(fn):
    """Make ``fn`` (a function or class returning a :class:`Mask`) a builder of the library: in
    :data:`LIBRARY` under its own name, and exported. Nothing else lists the builders."""
    LIBRARY.add(fn.__name__, fn)
    __all__.append(fn.__name__)
    return fn

def _check_size(name: str, value: object) -> int:
    if not is_int(value):
        raise ArgumentTypeError(f"{name} must be an int, got {type(value).__name__}")
    value = cast(int, value)  # is_int checked it
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


@builder
def full() -> Mask:
    """Every query may attend to every key."""
    return Everything()


@builder
def causal(*, align: Align = "bottom_right") -> Mask:
    """Causal: query ``i`` attends to keys ``j <= i`` (``j <= i + (m - n)`` bottom-right aligned:
    the last query on the last key, decoding with a cache of ``m - n`` earlier keys). With
    ``n > m`` bottom-right, the first ``n - m`` queries see no key (their output is zero)."""
    return Band(None, 0, align=align, name="causal")


@builder
def window(w: int, *, causal: bool = False, align: Align = "bottom_right") -> Mask:
    """Truncated (sliding-window) attention: ``|i - j| <= w`` (two-sided, the truncated
    self-attention of speech models), or ``0 <= i - j <= w`` with ``causal=True`` (one-sided,
    streaming: look back ``w`` steps). ``w = 0``: each query sees its own position only."""
    w = _check_size("w (window half-width)", w)
    return Band(-w, 0 if causal else w, align=align, name="window")


@builder
def dilated_window(w: int, dilation: int, *, causal: bool = False, align: Align = "bottom_right") -> Mask:
    """A dilated sliding window (Longformer, section 3.1): keys within ``w`` positions whose offset
    ``j - i`` is a multiple of ``dilation`` (``0 <= i - j <= w`` with ``causal=True``)."""
    w = _check_size("w (window half-width)", w)
    if not is_int(dilation) or dilation < 1:
        raise ValueError(f"dilation must be an int >= 1, got {dilation!r}")
    return Band(-w, 0 if causal else w, dilation=dilation, align=align, name="dilated_window")


@builder
def no_self(*, align: Align = "bottom_right") -> Mask:
    """Forbids each query to attend to its own position (in the lecture, attention of a vector
    to itself is optional); combine with other masks by ``&``."""
    return Not(Band(0, 0, align=align, name="self"))


def _lengths(lengths, name: str) -> torch.Tensor:
    if isinstance(lengths, torch.Tensor):
        t = lengths
    else:
        try:
            t = torch.as_tensor(list(lengths), dtype=torch.long)
        except (TypeError, ValueError) as e:
            raise ArgumentTypeError(f"{name} must be a 1-D integer tensor or a sequence of ints, got "
                                    f"{lengths!r}") from e
    if t.dtype.is_floating_point or t.dtype == torch.bool or t.is_complex():
        raise ArgumentTypeError(f"{name} must have an integer dtype, got {t.dtype}")
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D of shape (B,), got shape {tuple(t.shape)}")
    if t.numel() and int(t.min()) < 0:
        raise ValueError(f"{name} must be >= 0, got a minimum of {int(t.min())}")
    return t.long()


class KeyBefore(Mask):
    """``kv < limit[b]``: the first ``limit[b]`` keys of row ``b`` (key padding; a prefix)."""

    key_only = True

    def __init__(self, limit: torch.Tensor, name: str = "padding"):
        self.limit, self.name = limit, name
        self.batch = limit.shape[0]

    def _limit(self, like: torch.Tensor) -> torch.Tensor:
        return self.limit.to(like.device)

    def __call__(self, b, h, q_idx, kv_idx):
        lim = self._limit(kv_idx)
        return kv_idx < (lim[b] if lim.shape[0] > 1 else lim[0])

    def tiles(self, grid):
        lim = self._limit(grid.kv_lo)[:, None, None, None]  # (B, 1, 1, 1)
        return torch.where(grid.kv_hi < lim, FULL, torch.where(grid.kv_lo >= lim, EMPTY, PARTIAL)).to(torch.uint8)

    def hidden_keys(self, m, device=None):
        return torch.arange(m, device=device)[None, :] >= self.limit.to(device)[:, None]

    def bind(self, n, m):
        if self.name == "padding" and self.limit.numel() and int(self.limit.max()) > m:
            raise ValueError(f"lengths must lie in [0, m={m}], got min {int(self.limit.min())} and max "
                             f"{int(self.limit.max())}")
        return self

    def __repr__(self):
        return f"{self.name}({self.limit.tolist()})"


@builder
def padding(lengths) -> Mask:
    """Key padding from the true lengths of a padded batch: row ``b`` attends to its first
    ``lengths[b]`` keys. Combine with causal or window masks by ``&``.

    Args:
        lengths: ``(B,)`` integer tensor or sequence of ints, each >= 0.
    """
    return KeyBefore(_lengths(lengths, "lengths"))


def _prefix_counts(flags: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """How many of ``flags[..., lo..hi]`` are True (positions outside ``flags`` count as False),
    and how many positions the range holds."""
    size = flags.shape[-1]
    cs = torch.nn.functional.pad(flags.long().cumsum(-1), (1, 0))  # (…, size + 1)
    a, z = lo.clamp(0, size), (hi + 1).clamp(0, size)
    shape = broadcast_shape(a.shape, z.shape)
    a, z = a.expand(shape), z.expand(shape)
    lead = cs.shape[:-1]
    take = lambda idx: cs[..., idx.reshape(-1)].reshape(*lead, *shape)  # noqa: E731
    return take(z) - take(a), (hi - lo + 1).expand(shape)


class KeyFlags(Mask):
    """``flags[b, kv]``: a per-row bool flag for every key (False: padding)."""

    key_only = True

    def __init__(self, flags: torch.Tensor):
        if not isinstance(flags, torch.Tensor) or flags.dtype != torch.bool or flags.dim() != 2:
            got = f"{tuple(flags.shape)} {flags.dtype}" if isinstance(flags, torch.Tensor) else type(flags).__name__
            raise ArgumentTypeError(f"valid_keys takes a bool tensor (B, M), True = a real key; got {got}")
        self.flags = flags
        self.batch = flags.shape[0]

    def __call__(self, b, h, q_idx, kv_idx):
        f = self.flags.to(kv_idx.device)
        b = b if f.shape[0] > 1 else 0
        return f[b, kv_idx.clamp(0, f.shape[1] - 1)] & (kv_idx < f.shape[1])

    def tiles(self, grid):
        count, size = _prefix_counts(self.flags.to(grid.kv_lo.device), grid.kv_lo, grid.kv_hi)  # (B, 1, J)
        count, size = count[:, None], size
        return torch.where(count == size, FULL, torch.where(count == 0, EMPTY, PARTIAL)).to(torch.uint8)

    def hidden_keys(self, m, device=None):
        f = self.flags.to(device)
        if f.shape[1] != m:
            raise ValueError(f"valid_keys holds flags for {f.shape[1]} keys, the attention has {m}")
        return ~f


@builder
def valid_keys(flags: torch.Tensor) -> Mask:
    """Key padding from per-key flags: ``flags`` ``(B, M)`` bool, True = a real key."""
    return KeyFlags(flags)


@builder
def prefix_lm(prefix, *, align: Align = "bottom_right") -> Mask:
    """Prefix-LM (T5, UniLM): every query sees the first ``prefix`` keys (bidirectional) and is
    causal after them. ``prefix``: an int, or one length per batch row."""
    if is_int(prefix):
        return Or(SharedPrefix(_check_size("prefix", prefix)), causal(align=align))
    return Or(KeyBefore(_lengths(prefix, "prefix"), name="prefix"), causal(align=align))


class SharedPrefix(KeyBefore):
    """``kv < prefix`` for every row."""

    def __init__(self, prefix: int):
        super().__init__(torch.tensor([prefix]), name="prefix")
        self.batch = None
        self.prefix = int(prefix)  # a Python int: no tensor read under torch.compile (FlexAttention's mask_mod)

    def __call__(self, b, h, q_idx, kv_idx):
        return kv_idx < self.prefix

    def tiles(self, grid):
        return super().tiles(grid)[0]

    def hidden_keys(self, m, device=None):
        return super().hidden_keys(m, device)


class PositionSet(Mask):
    """The query (``side="q"``) or the key (``side="kv"``) is one of the positions in ``members``."""

    def __init__(self, members: torch.Tensor, side: str):
        self.members, self.side = members, side  # (P,) bool over positions 0 .. P-1

    def __call__(self, b, h, q_idx, kv_idx):
        idx = q_idx if self.side == "q" else kv_idx
        mem = self.members.to(idx.device)
        return (mem[idx.clamp(0, max(mem.shape[0] - 1, 0))] & (idx < mem.shape[0]) if mem.numel()
                else torch.zeros_like(idx, dtype=torch.bool))

    def tiles(self, grid):
        lo, hi = (grid.q_lo, grid.q_hi) if self.side == "q" else (grid.kv_lo, grid.kv_hi)
        count, size = _prefix_counts(self.members.to(lo.device), lo, hi)
        return torch.where(count == size, FULL, torch.where(count == 0, EMPTY, PARTIAL)).to(torch.uint8)

    def __repr__(self):
        return f"{self.side}_in({self.members.nonzero().flatten().tolist()})"


@builder
def global_tokens(tokens) -> Mask:
    """Global tokens (Longformer, Beltagy et al. 2020): a global token attends to every key and
    every query attends to it. ``tokens``: a count g (the first g positions, a CLS token) or a
    list of positions. Combine with a window by ``|``: ``window(w) | global_tokens(g)``."""
    if isinstance(tokens, bool):
        raise ArgumentTypeError("tokens must be a count or a list of positions, got a bool")
    if is_int(tokens):
        idx = torch.arange(_check_size("tokens", tokens))
    else:
        try:
            idx = torch.as_tensor(sorted({int(i) for i in tokens}), dtype=torch.long)
        except TypeError:
            raise ArgumentTypeError("tokens must be a count or a list of positions, got "
                                    f"{type(tokens).__name__}") from None
        if idx.numel() and int(idx[0]) < 0:
            raise ValueError(f"global token positions must be >= 0, got {int(idx[0])}")
    members = torch.zeros(int(idx.max()) + 1 if idx.numel() else 0, dtype=torch.bool)
    members[idx] = True
    return Or(PositionSet(members, "q"), PositionSet(members, "kv"))


class BlockTable(Mask):
    """``table[q // block, kv // block]``: a pattern of whole ``block x block`` squares (BigBird's
    random blocks); ``draw(n, m)``, when given, makes the table for a size at :meth:`bind`."""

    def __init__(self, table: torch.Tensor | None, block: int, draw=None, name: str = "block_table"):
        self.table, self.block, self.draw, self.name = table, block, draw, name

    def bind(self, n, m):
        if self.draw is None:
            return self
        return BlockTable(self.draw(n, m), self.block, None, self.name)

    def _table(self, device) -> torch.Tensor:
        if self.table is None:
            raise ValueError(f"{self.name} draws its pattern for a size: bind it (mask.bind(n, m)) or pass it to "
                             "attend")
        return self.table.to(device)

    def __call__(self, b, h, q_idx, kv_idx):
        t = self._table(q_idx.device)
        qi, ki = q_idx // self.block, kv_idx // self.block
        inside = (qi < t.shape[0]) & (ki < t.shape[1])
        return t[qi.clamp(max=t.shape[0] - 1), ki.clamp(max=t.shape[1] - 1)] & inside

    def tiles(self, grid):
        t = self._table(grid.q_lo.device)
        cs = torch.nn.functional.pad(t.long().cumsum(0).cumsum(1), (1, 0, 1, 0))  # 2-D prefix sums
        r0, r1 = (grid.q_lo // self.block).clamp(0, t.shape[0]), (grid.q_hi // self.block + 1).clamp(0, t.shape[0])
        c0, c1 = (grid.kv_lo // self.block).clamp(0, t.shape[1]), (grid.kv_hi // self.block + 1).clamp(0, t.shape[1])
        count = cs[r1, c1] - cs[r0, c1] - cs[r1, c0] + cs[r0, c0]
        cells = (r1 - r0) * (c1 - c0)
        inside = (grid.q_hi // self.block < t.shape[0]) & (grid.kv_hi // self.block < t.shape[1])
        return torch.where((count == cells) & inside & (cells > 0), FULL,
                           torch.where(count == 0, EMPTY, PARTIAL)).to(torch.uint8)

    def __repr__(self):
        return f"{self.name}(block={self.block})"


@builder
def block_table(table: torch.Tensor, block: int) -> Mask:
    """A pattern of whole squares: query block ``t`` attends to key block ``s`` where ``table[t, s]``
    (``table`` a bool ``(query blocks, key blocks)`` tensor; blocks of ``block`` positions)."""
    if not isinstance(table, torch.Tensor) or table.dtype != torch.bool or table.dim() != 2:
        raise ArgumentTypeError("table must be a 2-D bool tensor (query blocks, key blocks)")
    return BlockTable(table, _check_size("block", block))


@builder
def random_blocks(count: int, block: int, *, seed: int = 0, causal: bool = False) -> Mask:
    """BigBird's random attention (Zaheer et al. 2020): each query block of ``block`` positions
    attends to ``count`` key blocks drawn without replacement (earlier ones when ``causal``),
    from ``seed`` and the number of blocks, so the pattern is fixed for a given size."""
    count, block = _check_size("count", count), _check_size("block", block)
    if block < 1:
        raise ValueError("block must be >= 1")

    def draw(n, m):
        nq, nk = -(-n // block), -(-m // block)
        g = torch.Generator().manual_seed(int(seed) * 1_000_003 + nq * 7919 + nk)
        table = torch.zeros(nq, nk, dtype=torch.bool)
        for t in range(nq):
            pool = torch.arange(min(t + 1, nk) if causal else nk)
            if pool.numel():
                table[t, pool[torch.randperm(pool.numel(), generator=g)[:count]]] = True
        return table

    return BlockTable(None, block, draw, name="random_blocks")


@builder
def graph(edge_index: torch.Tensor, num_nodes: int, *, add_self_loops: bool = False) -> Mask:
    """Attention restricted to a graph's edges: ``(2, E)`` ``edge_index``, column ``(j, i)`` an edge
    ``j -> i`` (source first, as in PyTorch Geometric), meaning **node i attends to node j**. For
    an undirected graph list both directions. Self-attention restricted this way is a graph
    neural network. (A ``(num_nodes, num_nodes)`` adjacency held as a tensor mask; for large
    sparse graphs :func:`attnlab.core.graph.edge_attention` costs O(E).)"""
    from .graph import check_edge_index

    num_nodes = _check_size("num_nodes", num_nodes)
    edge_index = check_edge_index(edge_index, num_nodes)
    adj = torch.zeros(num_nodes, num_nodes, dtype=torch.bool, device=edge_index.device)
    adj[edge_index[1], edge_index[0]] = True  # target i attends to source j
    if add_self_loops:
        adj.fill_diagonal_(True)
    return TensorMask(adj)


from .documents import Documents  # noqa: E402  (a Mask built from the ones above)

builder(Documents)


def positions_of(mask, n: int, device=None) -> torch.Tensor | None:
    """The positions a positional encoding should see for ``n`` tokens under ``mask`` (packed
    documents restart them; a shard of a sharded sequence holds its own), or None: the usual ones."""
    method = getattr(mask, "positions", None)
    return method(n, device) if callable(method) else None


def padding_tensor_hint(shape: tuple[int, ...], b: int, m: int) -> str:
    """What to say of a bool tensor of ``shape`` given as a mask where key padding was meant: a
    bare ``(B, M)`` tensor (torch's ``key_padding_mask`` shape) is, for every attention, an
    ``(N, M)`` mask of (query, key) pairs; key padding goes through :func:`valid_keys` (``""``
    for any other shape)."""
    if len(shape) != 2 or shape != (b, m) or b == 1:
        return ""
    return (f"; a (B, M) = ({b}, {m}) key-padding tensor goes through attnlab.masks.valid_keys(flags), flags True = a "
            "real key (every attention reads a bare 2-D tensor as an (N, M) mask of (query, key) pairs; torch's "
            "key_padding_mask is True = padding: valid_keys(~key_padding_mask))")


def valid_key_flags(mask, b: int, m: int, device=None, *, refuse: str = "a key-padding mask") -> torch.Tensor | None:
    """The ``(B, M)`` "key is real" flags of a key-padding mask, or None for no mask: a mask that
    depends on the key alone (:func:`padding`, :func:`valid_keys`), or a bool tensor that does
    once broadcast to ``(B, H, N, M)``, as every attention reads a tensor: ``(B, 1, 1, M)``,
    ``(1, M)`` or ``(M,)``. A bare ``(B, M)`` tensor is not one: it reads as an ``(N, M)`` mask.

    Raises ``TypeError`` for a non-bool tensor and ``ValueError`` for any other mask, the
    message naming what was expected and got, then ``refuse``: what the caller takes instead.
    """
    if mask is None:
        return None
    inner = getattr(mask, "mask", None)
    if isinstance(inner, Mask):  # a block map: its mask
        mask = inner
    if isinstance(mask, torch.Tensor):
        if mask.dtype != torch.bool:
            raise ArgumentTypeError(f"mask must be a bool tensor (True = may attend), got {mask.dtype}")
        shape = tuple(mask.shape)
        full = (1,) * (4 - len(shape)) + shape  # as it broadcasts to (B, H, N, M)
        if len(shape) > 4 or full[1:3] != (1, 1) or full[0] not in (1, b) or full[3] != m:
            raise ValueError(f"expected a key-padding mask, a bool tensor broadcastable to (B, 1, 1, M) = ({b}, 1, 1, "
                             f"{m}), got shape {shape}{padding_tensor_hint(shape, b, m)}; {refuse}")
        return mask.reshape(full[0], m).expand(b, m).to(device)
    mk = as_mask(mask) if callable(mask) else None
    if mk is None or not mk.key_only:
        raise ValueError(f"expected a key-padding mask (masks.padding, masks.valid_keys, a (B, 1, 1, M) tensor), "
                         f"got {mask!r}; {refuse}")
    if mk.batch is not None and mk.batch not in (1, b):
        raise ValueError(f"the key-padding mask is for {mk.batch} rows, the batch has {b}")
    flags = mk.dense(1, m, batch=b, device=device)
    return flags.reshape(-1, m).expand(b, m)


from .blockmap import DEFAULT_BLOCK, BlockMap, block_map  # noqa: E402


def names() -> list[str]:
    """The mask builders by name."""
    return LIBRARY.names()


__all__ += ["SharedPrefix", "Grid", "And", "Or", "Not", "TensorMask", "EMPTY", "PARTIAL", "FULL", "BlockMap",
            "block_map", "DEFAULT_BLOCK", "LIBRARY", "builder", "names", "positions_of"]
