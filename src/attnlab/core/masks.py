"""Boolean attention masks: ``True`` = this query may attend to this key.

One convention everywhere in attnlab (the one of
:func:`torch.nn.functional.scaled_dot_product_attention` and FlexAttention's ``mask_mod``):
a mask is a ``torch.bool`` tensor broadcastable to ``(B, H, N, M)`` whose entry ``[..., i, j]``
is ``True`` when query ``i`` may attend to key ``j``. Additive float terms (ALiBi, relative
biases) never travel as masks; they go to ``attend(..., bias=...)``.

Alignment when the number of queries ``n`` differs from the number of keys ``m``: the
builders that depend on positions (:func:`causal`, :func:`window`) align the *last* query with
the *last* key ("bottom-right" alignment, as in FlashAttention >= 2.1 and KV-cache decoding):
query ``i`` sits at key position ``i + (m - n)``. With ``n == m`` this is the usual diagonal.
Pass ``align="top_left"`` for the alignment of ``scaled_dot_product_attention(is_causal=True)``
(query ``i`` sits at key position ``i``).

A query row with no allowed key is legal: :func:`attnlab.attend` returns zeros (and zero
gradients) for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from ..validate import is_int

__all__ = [
    "Documents",
    "document",
    "key_padding_flags",
    "causal",
    "window",
    "padding",
    "graph",
    "no_self",
    "and_masks",
    "or_masks",
    "full",
]

Align = Literal["bottom_right", "top_left"]


def _check_size(name: str, value: object) -> int:
    # its own check: a size that is not an int is a TypeError here (a negative one a ValueError)
    if not is_int(value):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def _offsets(n: int, m: int | None, align: str, device) -> tuple[torch.Tensor, int]:
    """Return ``(j - i_aligned)`` as an ``(n, m)`` tensor, and ``m``."""
    n = _check_size("n", n)
    m = n if m is None else _check_size("m", m)
    if align == "bottom_right":
        shift = m - n
    elif align == "top_left":
        shift = 0
    else:
        raise ValueError(f"align must be 'bottom_right' or 'top_left', got {align!r}")
    i = torch.arange(n, device=device).unsqueeze(1) + shift  # (n, 1) key position of query i
    j = torch.arange(m, device=device).unsqueeze(0)  # (1, m)
    return j - i, m


def full(n: int, m: int | None = None, *, device=None) -> torch.Tensor:
    """All-True ``(n, m)`` mask: every query may attend to every key."""
    n = _check_size("n", n)
    m = n if m is None else _check_size("m", m)
    return torch.ones(n, m, dtype=torch.bool, device=device)


def causal(n: int, m: int | None = None, *, align: Align = "bottom_right", device=None) -> torch.Tensor:
    """Causal mask of shape ``(n, m)``: query ``i`` attends to keys ``j <= i + (m - n)``.

    The default ``align="bottom_right"`` puts the last query on the last key (decoding with a
    cache of ``m - n`` earlier keys); ``align="top_left"`` gives ``j <= i``, the alignment of
    ``scaled_dot_product_attention(is_causal=True)``. With ``n > m`` and bottom-right alignment
    the first ``n - m`` queries see no key (their output is zero).

    Args:
        n: number of queries N.
        m: number of keys M (default ``n``).
    """
    off, _ = _offsets(n, m, align, device)
    return off <= 0


def window(
    n: int,
    w: int,
    m: int | None = None,
    *,
    causal: bool = False,
    align: Align = "bottom_right",
    device=None,
) -> torch.Tensor:
    """Truncated (windowed) attention mask of shape ``(n, m)``.

    Two-sided (default): query ``i`` attends to keys with ``|i - j| <= w`` — the truncated
    self-attention of speech models, where a frame only looks at its neighbours.
    One-sided (``causal=True``): ``0 <= i - j <= w``, the streaming form that looks back ``w``
    steps and never ahead. ``w = 0`` lets each query see only its own position. Positions are
    aligned as in :func:`causal` when ``n != m``.

    Args:
        n: number of queries N.
        w: half-width of the window (>= 0).
        m: number of keys M (default ``n``).
        causal: one-sided (look-back) window.
    """
    w = _check_size("w (window half-width)", w)
    off, _ = _offsets(n, m, align, device)
    if causal:
        return (off <= 0) & (off >= -w)
    return off.abs() <= w


def padding(lengths, m: int | None = None, *, device=None) -> torch.Tensor:
    """Key-padding mask of shape ``(B, 1, 1, m)`` from the true lengths of a padded batch.

    Entry ``[b, 0, 0, j]`` is True when ``j < lengths[b]``; it broadcasts over heads and
    queries. Combine it with a causal or window mask through :func:`and_masks`.

    Args:
        lengths: ``(B,)`` integer tensor or sequence of ints, each in ``[0, m]``.
        m: padded length M (default ``max(lengths)``).
    """
    if not isinstance(lengths, torch.Tensor):
        try:
            lengths = torch.as_tensor(list(lengths), dtype=torch.long, device=device)
        except (TypeError, ValueError) as e:
            raise TypeError(f"lengths must be a 1-D integer tensor or a sequence of ints, got {lengths!r}") from e
    if lengths.dtype.is_floating_point or lengths.dtype == torch.bool or lengths.is_complex():
        raise TypeError(f"lengths must have an integer dtype, got {lengths.dtype}")
    if lengths.dim() != 1:
        raise ValueError(f"lengths must be 1-D of shape (B,), got shape {tuple(lengths.shape)}")
    if device is not None:
        lengths = lengths.to(device)
    if m is None:
        m = int(lengths.max()) if lengths.numel() else 0
    m = _check_size("m", m)
    if lengths.numel() and (int(lengths.min()) < 0 or int(lengths.max()) > m):
        raise ValueError(
            f"lengths must lie in [0, m={m}], got min {int(lengths.min())} and max {int(lengths.max())}"
        )
    j = torch.arange(m, device=lengths.device)
    return (j.unsqueeze(0) < lengths.unsqueeze(1))[:, None, None, :]  # (B, 1, 1, m)


def graph(edge_index: torch.Tensor, num_nodes: int, *, add_self_loops: bool = False) -> torch.Tensor:
    """Mask of shape ``(num_nodes, num_nodes)`` that restricts attention to the graph's edges.

    ``edge_index`` has shape ``(2, E)``; column ``(j, i) = edge_index[:, e]`` is an edge
    ``j -> i`` (source first, target second, as in PyTorch Geometric's ``source_to_target``
    flow): it means **node i attends to node j**, so ``mask[i, j] = True``. For an undirected
    graph list both directions. Self-attention restricted this way is a graph neural network.

    Args:
        edge_index: ``(2, E)`` integer tensor of node indices in ``[0, num_nodes)``.
        num_nodes: number of nodes.
        add_self_loops: also let every node attend to itself.
    """
    from .graph import check_edge_index

    num_nodes = _check_size("num_nodes", num_nodes)
    edge_index = check_edge_index(edge_index, num_nodes)
    mask = torch.zeros(num_nodes, num_nodes, dtype=torch.bool, device=edge_index.device)
    mask[edge_index[1], edge_index[0]] = True  # target i attends to source j
    if add_self_loops:
        mask.fill_diagonal_(True)
    return mask


def no_self(n: int, m: int | None = None, *, align: Align = "bottom_right", device=None) -> torch.Tensor:
    """Mask of shape ``(n, m)`` that forbids each query to attend to its own position.

    In the lecture notes attention of a vector to itself is optional; combine this with other
    masks through :func:`and_masks`. Positions are aligned as in :func:`causal`.
    """
    off, _ = _offsets(n, m, align, device)
    return off != 0


def _combine(masks, op, name: str) -> torch.Tensor | None:
    present = [m for m in masks if m is not None]
    for idx, m in enumerate(present):
        if not isinstance(m, torch.Tensor) or m.dtype != torch.bool:
            got = m.dtype if isinstance(m, torch.Tensor) else type(m).__name__
            raise TypeError(f"{name}: every mask must be a torch.bool tensor (True = may attend), got {got}")
    if not present:
        return None
    out = present[0]
    for m in present[1:]:
        try:
            out = op(out, m)
        except RuntimeError as e:
            raise ValueError(
                f"{name}: masks of shapes {tuple(out.shape)} and {tuple(m.shape)} do not broadcast"
            ) from e
    return out


def and_masks(*masks: torch.Tensor | None) -> torch.Tensor | None:
    """Intersection of masks (a pair is allowed only if every mask allows it); ``None`` = no
    constraint. Shapes broadcast."""
    return _combine(masks, torch.logical_and, "and_masks")


def or_masks(*masks: torch.Tensor | None) -> torch.Tensor | None:
    """Union of masks (a pair is allowed if any mask allows it). Shapes broadcast; a ``None``
    argument means "everything allowed", so it makes the union ``None`` too."""
    out = _combine(masks, torch.logical_or, "or_masks")
    return None if any(m is None for m in masks) else out


@dataclass(frozen=True)
class Documents:
    """Packed documents: each row of a batch holds whole documents one after another (then
    padding), and a token attends only within its own document (block-diagonal), causally
    and / or within a window if asked. Positions restart at 0 in every document.

    Pass it as ``mask=`` to :class:`attnlab.MultiHeadAttention`, :class:`attnlab.models.Encoder`
    or a language model: they attend document by document (documents of one length batched
    together), so the cost is ``sum_d L_d^2``, linear in the packed length for bounded
    documents, instead of the ``T^2`` of :meth:`dense`; forward and backward.

    Args:
        lengths: the documents' lengths, one list per row (a flat list: one row).
        causal: within a document, token ``i`` sees tokens ``j <= i``.
        window: within a document, ``|i - j| <= window`` (``0 <= i - j <= window`` if causal).
    """

    lengths: tuple
    causal: bool = False
    window: int | None = None

    def __post_init__(self):
        rows = self.lengths
        if isinstance(rows, torch.Tensor):
            rows = rows.tolist()
        rows = list(rows)
        if not rows or not isinstance(rows[0], (list, tuple)):
            rows = [rows]
        clean = []
        for row in rows:
            for n in row:
                if not is_int(n) or n < 1:
                    raise ValueError(f"document lengths must be integers >= 1, got {n!r}")
            clean.append(tuple(int(n) for n in row))
        object.__setattr__(self, "lengths", tuple(clean))
        if self.window is not None:
            _check_size("window", self.window)

    @property
    def rows(self) -> int:
        """Rows of the batch."""
        return len(self.lengths)

    def check(self, batch: int, length: int) -> None:
        """Refuse a batch of another shape: ``batch`` rows, each of ``length`` >= its documents."""
        if batch != self.rows:
            raise ValueError(f"the documents describe {self.rows} row(s), the batch has {batch}")
        longest = max(sum(r) for r in self.lengths)
        if longest > length:
            raise ValueError(f"the documents of a row add up to {longest} tokens, the rows hold {length}")

    def pieces(self, length: int) -> list[tuple[int, bool]]:
        """The batch flattened row after row into ``(length, real)`` pieces: every document,
        then each row's padding (``real`` False) up to ``length``."""
        out = []
        for row in self.lengths:
            out += [(n, True) for n in row]
            if length > sum(row):
                out.append((length - sum(row), False))
        return out

    def positions(self, length: int, device=None) -> torch.Tensor:
        """``(B, length)`` positions restarting at 0 in every document (padding: 0)."""
        flat = torch.cat([torch.arange(n, device=device) if real else torch.zeros(n, dtype=torch.long, device=device)
                          for n, real in self.pieces(length)])
        return flat.view(self.rows, length)

    def block(self, n: int, device=None) -> torch.Tensor | None:
        """The ``(n, n)`` mask inside one document of length ``n`` (None: every pair)."""
        if self.window is not None:
            return window(n, self.window, causal=self.causal, device=device)
        return causal(n, device=device) if self.causal else None

    def dense(self, length: int, device=None) -> torch.Tensor:
        """The same mask as a ``(B, 1, length, length)`` bool tensor (padding sees and is seen by nothing)."""
        out = torch.zeros(self.rows, 1, length, length, dtype=torch.bool, device=device)
        for b, row in enumerate(self.lengths):
            start = 0
            for n in row:
                blk = self.block(n, device)
                out[b, 0, start : start + n, start : start + n] = True if blk is None else blk
                start += n
        return out


def document(lengths, *, causal: bool = False, window: int | None = None, length: int | None = None, device=None) -> torch.Tensor:
    """The dense mask of packed documents (see :class:`Documents`): ``(T, T)`` for one row
    (``lengths`` a flat list; T = their sum, or ``length``), ``(B, 1, T, T)`` for several rows.
    Composable with the other masks (``&``) like any mask."""
    docs = Documents(lengths, causal=causal, window=window)
    t = max(sum(r) for r in docs.lengths) if length is None else length
    docs.check(docs.rows, t)
    out = docs.dense(t, device)
    return out[0, 0] if docs.rows == 1 and not (isinstance(lengths, (list, tuple)) and lengths and isinstance(lengths[0], (list, tuple))) else out


def key_padding_flags(mask, b: int, m: int, device=None, *, refuse: str = "a key-padding mask") -> torch.Tensor | None:
    """The ``(B, M)`` "key is real" flags of a key-padding mask, ``(B, 1, 1, M)`` (as
    :func:`padding` makes it) or ``(B, M)`` (B may be 1), or None for no mask.

    Raises ``TypeError`` for a non-bool mask and ``ValueError`` for any other shape, the message
    naming the shape expected and got, then ``refuse``: what the caller takes instead.
    """
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise TypeError(f"mask must be a bool tensor (True = may attend), got {got}")
    shape = tuple(mask.shape)
    ok = mask.dim() == 4 and shape[1:3] == (1, 1) and shape[0] in (1, b) and shape[3] == m
    ok = ok or (mask.dim() == 2 and shape[0] in (1, b) and shape[1] == m)
    if not ok:
        raise ValueError(f"expected a key-padding mask of shape (B, 1, 1, M) = ({b}, 1, 1, {m}) or (B, M), got shape {shape}; {refuse}")
    return mask.reshape(mask.shape[0], m).expand(b, m).to(device)
