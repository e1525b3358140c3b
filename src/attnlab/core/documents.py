"""Packed documents as a mask: each row of a batch holds whole documents one after another (then
padding), and a token attends only within its own document."""

from __future__ import annotations

import torch

from ..validate import ArgumentTypeError, is_int
from .band import Band
from .maskfn import EMPTY, FULL, PARTIAL, Mask, combine_and

__all__ = ["Documents"]


class Documents(Mask):
    """Packed documents: a token attends only within its own document (block-diagonal), causally
    and / or within a window if asked; padding after a row's documents attends to nothing and is
    seen by nothing. Positions restart at 0 in every document (:meth:`positions`, what a layer's
    positional encoding sees).

    Pass it as ``mask=`` anywhere a mask goes (``attend``, :class:`attnlab.MultiHeadAttention`,
    :class:`attnlab.models.Encoder`, a language model's ``documents=``): the tiles between two
    documents are never computed, so the cost is ``sum_d L_d^2`` (plus the tiles a document
    boundary cuts), linear in the packed length for bounded documents, forward and backward.
    The efficient approximations run each document alone.

    Args:
        lengths: the documents' lengths, one list per row (a flat list: one row).
        causal: within a document, token ``i`` sees tokens ``j <= i``.
        window: within a document, ``|i - j| <= window`` (``0 <= i - j <= window`` if causal).
    """

    batch: int  # the rows of ``lengths``: always known

    def __init__(self, lengths, *, causal: bool = False, window: int | None = None):
        rows = lengths.tolist() if isinstance(lengths, torch.Tensor) else list(lengths)
        if not rows or not isinstance(rows[0], (list, tuple)):
            rows = [rows]
        clean = []
        for row in rows:
            for n in row:
                if not is_int(n) or n < 1:
                    raise ValueError(f"document lengths must be integers >= 1, got {n!r}")
            clean.append(tuple(int(n) for n in row))
        if window is not None and (not is_int(window) or window < 0):
            raise (ArgumentTypeError if not is_int(window) else ValueError)(
                f"window must be an int >= 0, got {window!r}")
        self.lengths, self.causal, self.window = tuple(clean), bool(causal), window
        self.batch = len(clean)
        longest = max(sum(r) for r in clean)
        self._pad_id = max(len(r) for r in clean)  # the document number of padding: after every real one
        ids = torch.full((self.batch, longest), self._pad_id, dtype=torch.long)
        for b, row in enumerate(clean):
            ids[b, : sum(row)] = torch.repeat_interleave(torch.arange(len(row)), torch.tensor(row))
        self.ids = ids  # (B, T): the document of each position, padding numbered after the last document
        self._inner = None  # the rule inside a document: offsets are the same as in the packed row
        if window is not None:
            self._inner = Band(-window, 0 if self.causal else window, align="top_left", name="window")
        elif self.causal:
            self._inner = Band(None, 0, align="top_left", name="causal")

    def __eq__(self, other):
        return isinstance(other, Documents) and (
            (self.lengths, self.causal, self.window) == (other.lengths, other.causal, other.window))

    def __hash__(self):
        return hash((self.lengths, self.causal, self.window))

    def __repr__(self):
        return f"Documents({list(map(list, self.lengths))}, causal={self.causal}, window={self.window})"

    @property
    def rows(self) -> int:
        """Rows of the batch."""
        return self.batch

    def check(self, batch: int, length: int) -> None:
        """Refuse a batch of another shape: ``batch`` rows, each of ``length`` >= its documents."""
        if batch != self.rows:
            raise ValueError(f"the documents describe {self.rows} row(s), the batch has {batch}")
        longest = max(sum(r) for r in self.lengths)
        if longest > length:
            raise ValueError(f"the documents of a row add up to {longest} tokens, the rows hold {length}")

    def bind(self, n, m):
        if n != m:
            raise ValueError(f"packed documents are self-attention: as many queries as keys, got {n} and {m}")
        self.check(self.rows, n)
        return self

    def _doc(self, b, idx: torch.Tensor) -> torch.Tensor:
        ids = self.ids.to(idx.device)
        b = b if self.batch > 1 else 0  # one row: the same for every batch row
        inside = idx < ids.shape[1]
        return torch.where(inside, ids[b, idx.clamp(0, ids.shape[1] - 1)], self._pad_id)

    def __call__(self, b, h, q_idx, kv_idx):
        dq = self._doc(b, q_idx)
        out = (dq == self._doc(b, kv_idx)) & (dq != self._pad_id)
        return out if self._inner is None else out & self._inner(b, h, q_idx, kv_idx)

    def tiles(self, grid):
        b = torch.arange(self.batch, device=grid.q_lo.device)[:, None, None]
        qa, qb = self._doc(b, grid.q_lo[None]), self._doc(b, grid.q_hi[None])  # (B, I, 1): documents are in order
        ka, kb = self._doc(b, grid.kv_lo[None]), self._doc(b, grid.kv_hi[None])  # (B, 1, J)
        pad = self._pad_id
        empty = (qb < ka) | (kb < qa) | (qa == pad) | (ka == pad)
        full = (qa == qb) & (ka == kb) & (qa == ka) & (qa != pad)
        same = torch.where(empty, EMPTY, torch.where(full, FULL, PARTIAL)).to(torch.uint8)[:, None]  # (B, 1, I, J)
        return same if self._inner is None else combine_and([same, self._inner.tiles(grid)])

    def hidden_keys(self, m, device=None):
        real = torch.tensor([sum(r) for r in self.lengths], device=device)
        return torch.arange(m, device=device)[None, :] >= real[:, None]

    def positions(self, n: int, device=None) -> torch.Tensor:
        """``(B, n)`` positions restarting at 0 in every document (padding: 0)."""
        self.check(self.rows, n)
        out = torch.zeros(self.rows, n, dtype=torch.long)
        for b, row in enumerate(self.lengths):
            out[b, : sum(row)] = torch.cat([torch.arange(k) for k in row])
        return out.to(device)

    def segments(self, n: int) -> list[tuple[int, int, int]]:
        """Every document as ``(row, start, length)`` (what an approximation attends one by one)."""
        self.check(self.rows, n)
        out = []
        for b, row in enumerate(self.lengths):
            start = 0
            for k in row:
                out.append((b, start, k))
                start += k
        return out
