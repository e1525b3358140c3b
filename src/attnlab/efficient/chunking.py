"""Where the chunkwise forms (:mod:`attnlab.efficient.recurrence`) lay the positions: chunks of ``C`` positions,
``(B, H, N, ...)`` as ``(B, H, T, C, ...)``; one sequence per batch row, zero-padded at its end, or, given packed
documents (``cu_seqlens``), each document from a chunk boundary; and the scan across the chunks, which starts each
sequence or document from its own initial state (:func:`~attnlab.efficient.segments.linear_scan`)."""

from __future__ import annotations

import torch

from .segments import linear_scan

__all__ = ["ChunkLayout"]


class ChunkLayout:
    """Where the positions lie in the chunked tensors ``(B, H, T, C, ...)``: one sequence per batch
    row, zero-padded at its end; or, given ``cu_seqlens``, each document from a chunk boundary."""

    def __init__(self, cu_seqlens: torch.Tensor | None, n: int, c: int, device):
        self.c, self.n, self.slots = c, n, None
        if cu_seqlens is None:
            return
        lengths = cu_seqlens.diff().to(device)
        self.documents = lengths.numel()
        per = (lengths + c - 1) // c  # chunks per document
        first = per.cumsum(0) - per
        doc = torch.repeat_interleave(torch.arange(lengths.numel(), device=device), lengths, output_size=n)
        self.slots = first[doc] * c + torch.arange(n, device=device) - cu_seqlens[:-1].to(device)[doc]
        self.total = int(per.sum())
        firsts, pers = first.tolist(), per.tolist()
        self.begins = {f: i for i, (f, m) in enumerate(zip(firsts, pers)) if m}
        self.ends = {f + m - 1: i for i, (f, m) in enumerate(zip(firsts, pers)) if m}

    def chunks(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, H, N, ...)`` -> ``(B, H, T, C, ...)``, contiguous: one copy of a strided input (a
        segment's piece, heads transposed from the projections) instead of one per product it
        enters, forward and backward (batched products flatten ``(B, H, T)``)."""
        if self.slots is None:
            return _chunks(x, self.c).contiguous()
        spread = x.new_zeros(*x.shape[:2], self.total * self.c, *x.shape[3:]).index_copy(2, self.slots, x)
        return spread.view(*x.shape[:2], self.total, self.c, *x.shape[3:])

    def positions(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, H, T, C, ...)`` -> ``(B, H, N, ...)``: the inverse of :meth:`chunks`."""
        x = x.flatten(2, 3)
        return x[:, :, :self.n] if self.slots is None else x.index_select(2, self.slots)

    def scan(self, init: torch.Tensor, carry: torch.Tensor, writes: torch.Tensor, *,
             matrix: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """The state entering each chunk ``(B, H, T, D, Dv)`` and the final state(s), with ``S_{t+1} = A_t S_t + B_t``
        (:func:`~attnlab.efficient.segments.linear_scan`): ``carry`` the ``A_t`` ``(B, H, T, D, D)`` when ``matrix``,
        else the factors ``(B, H, T, 1 | D, 1)`` of a diagonal one, ``writes`` the ``B_t`` ``(B, H, T, D, Dv)``. Packed:
        each document starts from its own initial state ``init[i]``."""
        b, h = writes.shape[:2]
        if self.slots is None:  # one sequence per row: its first chunk begins it, its last ends it
            rows, begins, ends = init.flatten(0, 1)[None], {0: 0}, {writes.shape[2] - 1: 0}
        else:  # a batch of one: the initial states are one per document, (S, H, D, Dv)
            rows, begins, ends = init, self.begins, self.ends
        starts, finals = linear_scan(rows, carry.flatten(0, 1), writes.flatten(0, 1), begins, ends, matrix)
        return starts.unflatten(0, (b, h)), (finals[0].unflatten(0, (b, h)) if self.slots is None else finals)

    def initial(self, state: torch.Tensor | None, q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The initial state(s): the one given, or zeros (one per batch row, or one per document when packed)."""
        if state is not None:
            return state
        rows = q.shape[0] if self.slots is None else self.documents
        return q.new_zeros(rows, q.shape[1], q.shape[-1], v.shape[-1])


def _chunks(x: torch.Tensor, c: int) -> torch.Tensor:
    """``(B, H, N, ...)`` -> ``(B, H, N / C, C, ...)``, zero-padded to a whole number of chunks
    (a zero key, value, decay and beta changes nothing)."""
    n = x.shape[2]
    pad = -n % c
    if pad:
        x = torch.cat([x, x.new_zeros(*x.shape[:2], pad, *x.shape[3:])], 2)
    return x.view(*x.shape[:2], (n + pad) // c, c, *x.shape[3:])
