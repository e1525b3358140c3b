"""How the chunkwise forms (:mod:`attnlab.efficient.recurrence`) lay out and run the positions.

* **Chunks** (:class:`ChunkLayout`): ``(B, H, N, ...)`` as ``(B, H, T, C, ...)``, one sequence per batch row
  zero-padded at its end, or, given packed documents (``cu_seqlens``), each document from a chunk boundary; and the
  scan across the chunks, which starts each sequence or document from its own initial state (:func:`linear_scan`:
  the recurrence across chunks as one autograd function).
* **Segments** (memory, :func:`segmented`): a long sequence computed as segments of at most :data:`SEGMENT`
  positions, each a non-reentrant checkpoint, so that the backward keeps only the state entering each segment and
  computes its chunks again."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.autograd.function import once_differentiable
from torch.utils.checkpoint import checkpoint

from ..validate import positive_int

__all__ = ["SEGMENT", "ChunkLayout", "Piece", "linear_scan", "segment_bounds", "segmented"]


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
        if self.slots is None:  # zero-padded to whole chunks (a zero key, value, decay and beta changes nothing)
            n, pad = x.shape[2], -x.shape[2] % self.c
            if pad:
                x = torch.cat([x, x.new_zeros(*x.shape[:2], pad, *x.shape[3:])], 2)
            return x.view(*x.shape[:2], (n + pad) // self.c, self.c, *x.shape[3:]).contiguous()
        spread = x.new_zeros(*x.shape[:2], self.total * self.c, *x.shape[3:]).index_copy(2, self.slots, x)
        return spread.view(*x.shape[:2], self.total, self.c, *x.shape[3:])

    def positions(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, H, T, C, ...)`` -> ``(B, H, N, ...)``: the inverse of :meth:`chunks`."""
        x = x.flatten(2, 3)
        return x[:, :, :self.n] if self.slots is None else x.index_select(2, self.slots)

    def scan(self, init: torch.Tensor, carry: torch.Tensor, writes: torch.Tensor, *,
             matrix: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """The state entering each chunk ``(B, H, T, D, Dv)`` and the final state(s), with ``S_{t+1} = A_t S_t + B_t``
        (:func:`linear_scan`): ``carry`` the ``A_t`` ``(B, H, T, D, D)`` when ``matrix``,
        else the factors ``(B, H, T, 1 | D, 1)`` of a diagonal one, ``writes`` the ``B_t`` ``(B, H, T, D, Dv)``. Packed:
        each document starts from its own initial state ``init[i]``."""
        b, h = writes.shape[:2]
        if self.slots is None:  # one sequence per row: its first chunk begins it, its last ends it
            rows, begins, ends = init.flatten(0, 1)[None], {0: 0}, {writes.shape[2] - 1: 0}
        else:  # a batch of one: the initial states are one per document, (S, H, D, Dv)
            rows, begins, ends = init, self.begins, self.ends
        starts, finals = _LinearScan.apply(rows, carry.flatten(0, 1), writes.flatten(0, 1), begins, ends, matrix)
        return starts.unflatten(0, (b, h)), (finals[0].unflatten(0, (b, h)) if self.slots is None else finals)


SEGMENT = 1024
"""Positions per segment of the chunkwise forms (see the module: memory): under autograd only the
state entering each segment is kept, and the segment's chunks are computed again in the backward."""


Piece = tuple[int, "int | None", "int | None"]
"""A document's positions inside one segment: ``(length, begins, ends)``, ``begins`` the
document's index where it begins in the segment (else None: it continues the previous segment's
last piece), ``ends`` its index where it ends there (else None: the next segment continues it)."""


def _segments(n: int, c: int, segment: int,
              cu_seqlens: torch.Tensor | None) -> list[tuple[int, int, list[Piece] | None]]:
    """The segments of ``n`` positions, ``(a, b, pieces)``: positions ``[a, b)``, whole chunks of
    ``c`` but the last, at most ``segment`` positions (at least one chunk); packed (``cu_seqlens``),
    each document laid from a chunk boundary as :class:`ChunkLayout` lays it, and ``pieces``
    the documents' pieces in the segment (:data:`Piece`), else None."""
    # positions per segment; a plain positive int passes without a call, anything else is validate's to refuse
    m = c * max(1, (segment if type(segment) is int and segment > 0 else positive_int("segment", segment)) // c)
    if cu_seqlens is None:
        return [(a, min(a + m, n), None) for a in range(0, n, m)]
    parts: list[tuple[int, int, list[Piece] | None]] = []
    pieces: list[Piece] = []
    a = pos = used = 0  # the segment's first position, the next position, the chunk slots it has filled
    for i, length in enumerate(cu_seqlens.diff().tolist()):
        done = 0
        while done < length:
            if used == m:
                parts.append((a, pos, pieces))
                pieces, a, used = [], pos, 0
            take = min(length - done, m - used)  # a piece that goes on is whole chunks
            pieces.append((take, i if done == 0 else None, i if done + take == length else None))
            done, pos, used = done + take, pos + take, used + -(-take // c) * c
    if pieces:
        parts.append((a, pos, pieces))
    return parts


def segment_bounds(n: int, chunk: int, segment: int | None = SEGMENT,
                   cu_seqlens: torch.Tensor | None = None) -> list[tuple[int, int]]:
    """The positions ``[a, b)`` of each segment :func:`segmented` computes, in order."""
    parts = [] if segment is None else _segments(n, chunk, segment, cu_seqlens)
    return [(a, b) for a, b, _ in parts] if len(parts) > 1 else [(0, n)]


def segmented(run: Callable, n: int, *, chunk: int, state: torch.Tensor, cu_seqlens: torch.Tensor | None = None,
              segment: int | None = SEGMENT, split: tuple[torch.Tensor | None, ...] = ()) -> tuple[torch.Tensor, ...]:
    """A chunkwise form over segments of at most ``segment`` positions, one after another, each
    starting from the state the previous one ends in: ``run(a, b, state, cu_seqlens)`` computes
    positions ``[a, b)`` (whole chunks of ``chunk``, the chunk length the form takes:
    :func:`attnlab.efficient.recurrence.chunk_length`) from the state(s) entering them, and returns their output
    ``(B, H, b - a, Dv)``, final state(s), and any further outputs ``(B, H, b - a, ...)``; returns the output,
    the final state(s) and the further outputs over the N positions. ``split``: tensors ``(B, H, N,
    ...)`` (or None) cut once at the segments' bounds (:func:`segment_bounds`), each segment's
    pieces passed to ``run`` after its four arguments (one split, whose backward gathers the
    pieces' gradients in one concatenation; a slice per segment would give autograd a full-size
    zero gradient per segment). Under autograd each segment
    is a checkpoint (:func:`torch.utils.checkpoint.checkpoint`, non-reentrant): the backward keeps
    only the state entering it and what ``run`` reads, and computes the segment again, one segment
    at a time. Packed (``cu_seqlens``, ``state`` one per document ``(S, H, D, Dv)``): each segment
    gets the offsets of the documents' pieces in it and a state per piece, the carried state for a
    piece that continues a document, the document's own for one that begins; the final state is
    one per document (an empty document keeps its initial one). ``segment=None``, or a sequence of
    one segment: one call, everything kept for the backward."""
    parts = [] if segment is None else _segments(n, chunk, segment, cu_seqlens)
    if len(parts) <= 1:
        return run(0, n, state, cu_seqlens, *split)
    step = (lambda *a: checkpoint(run, *a, use_reentrant=False)) if torch.is_grad_enabled() else run
    sizes = [b - a for a, b, _ in parts]
    cuts = [[None] * len(parts) if t is None else t.split(sizes, 2) for t in split]
    outs = []
    if cu_seqlens is None:
        for i, (a, b, _) in enumerate(parts):
            out, state, *more = step(a, b, state, None, *(c[i] for c in cuts))
            outs.append((out, *more))
    else:
        finals, carry = list(state.unbind(0)), state[0]
        for i, (a, b, pieces) in enumerate(parts):
            assert pieces is not None
            starts = torch.stack([carry if begins is None else state[begins] for _, begins, _ in pieces])
            cu = torch.tensor([0] + [length for length, _, _ in pieces], device=cu_seqlens.device).cumsum(0)
            out, ends, *more = step(a, b, starts, cu, *(c[i] for c in cuts))
            outs.append((out, *more))
            for j, (_, _, end) in enumerate(pieces):
                if end is not None:
                    finals[end] = ends[j]
            carry = ends[-1]  # the last piece goes on into the next segment unless it ended here
        state = torch.stack(finals)
    out, *more = (torch.cat(pieces, 2) for pieces in zip(*outs))
    return (out, state, *more)


class _LinearScan(torch.autograd.Function):
    """:func:`linear_scan`'s autograd node: the forward a loop of one product per chunk that autograd
    does not record, the backward the reverse loop with ``dB_t = G_{t+1}`` and ``dA_t = G_{t+1} S_t^T``
    for every chunk at once."""

    @staticmethod
    def forward(ctx, rows, carry, writes, begins, ends, matrix):
        starts, finals, s = torch.empty_like(writes), rows.clone(), None
        for t in range(writes.shape[1]):
            if t in begins:
                s = rows[begins[t]]
            starts[:, t] = s
            s = torch.baddbmm(writes[:, t], carry[:, t], s) if matrix else torch.addcmul(writes[:, t], carry[:, t], s)
            if t in ends:
                finals[ends[t]] = s
        ctx.save_for_backward(carry, starts)
        ctx.begins, ctx.ends, ctx.matrix, ctx.rows = begins, ends, matrix, rows.shape[0]
        return starts, finals

    @staticmethod
    @once_differentiable
    def backward(ctx, d_starts, d_finals):
        carry, starts = ctx.saved_tensors
        begins, ends, matrix = ctx.begins, ctx.ends, ctx.matrix
        d_starts = torch.zeros_like(starts) if d_starts is None else d_starts
        d_finals = starts.new_zeros(ctx.rows, starts.shape[0], *starts.shape[2:]) if d_finals is None else d_finals
        d_rows = d_finals.clone()  # a row with no chunk: its final state is its initial one
        for r in begins.values():
            d_rows[r] = 0
        after = torch.empty_like(starts)  # G_{t+1}: the gradient of the state after each chunk
        g = None
        for t in reversed(range(starts.shape[1])):
            if t in ends:
                g = d_finals[ends[t]]
            after[:, t] = g
            g = torch.baddbmm(d_starts[:, t], carry[:, t].transpose(-1, -2), g) if matrix \
                else torch.addcmul(d_starts[:, t], carry[:, t], g)
            if t in begins:
                d_rows[begins[t]] = g
        if matrix:
            d_carry = after @ starts.transpose(-1, -2)
        else:
            d_carry = (after * starts).sum(-1, keepdim=True)
            if carry.shape[-2] == 1:
                d_carry = d_carry.sum(-2, keepdim=True)
        return d_rows, d_carry, after, None, None, None


def linear_scan(rows: torch.Tensor, carry: torch.Tensor, writes: torch.Tensor, begins: dict[int, int],
                ends: dict[int, int], matrix: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrence across chunks, ``S_{t+1} = A_t S_t + B_t``, as one autograd node (its backward
    the reverse loop ``G_t = A_t^T G_{t+1} + dS_t``, one product per chunk, where autograd's own
    would record two and a node per chunk).

    ``rows`` ``(R, M, D, Dv)``: the initial states; ``begins`` / ``ends``: the chunk at which row
    ``r`` begins / ends (a row with no chunk keeps its initial state); ``carry`` the ``A_t``, ``(M,
    T, D, D)`` when ``matrix``, else the diagonal factors ``(M, T, 1 | D, 1)``; ``writes`` the ``B_t``
    ``(M, T, D, Dv)``. Returns the state entering each chunk ``(M, T, D, Dv)`` and each row's final
    state ``(R, M, D, Dv)``. Differentiable once."""
    m, t = writes.shape[:2]
    if carry.shape[:2] != (m, t) or rows.shape[1:] != (m, *writes.shape[2:]):
        raise ValueError(f"linear_scan: carry {tuple(carry.shape)} and rows {tuple(rows.shape)} do not match writes "
                         f"{tuple(writes.shape)} (carry (M, T, ...), rows (R, M, D, Dv))")
    if (not set(begins.values()) | set(ends.values()) <= set(range(rows.shape[0]))
            or not all(0 <= c < t for c in (*begins, *ends))):
        raise ValueError(f"linear_scan: begins {begins} / ends {ends} name a chunk outside 0..{t - 1} or a row outside "
                         f"0..{rows.shape[0] - 1}")
    return _LinearScan.apply(rows, carry, writes, begins, ends, matrix)
