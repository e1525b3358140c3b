"""Tiles of a mask: their states, their position ranges (:class:`Grid`) and the state algebra of
combined masks (what :meth:`attnlab.core.maskfn.Mask.tiles` returns and combines)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch

__all__ = ["EMPTY", "PARTIAL", "FULL", "UNKNOWN", "Grid", "broadcast_shape", "combine_and", "combine_or"]

EMPTY, PARTIAL, FULL, UNKNOWN = 0, 1, 2, 3
"""Tile states: no pair allowed, some, all; UNKNOWN: the structure does not tell (evaluate it)."""


@dataclass(frozen=True)
class Grid:
    """Tiles as position ranges: query tile ``i`` holds positions in ``[q_lo[i], q_hi[i]]``, key
    tile ``j`` in ``[kv_lo[j], kv_hi[j]]`` (``q_lo``, ``q_hi`` of shape ``(I, 1)``; ``kv_lo``,
    ``kv_hi`` ``(1, J)``). The positions a tile holds may be any subset of its range (a shard of
    a striped layout, a ring buffer of a cache), so a state derived from the ranges alone is
    sound for every subset: FULL only if every pair of the ranges is allowed, EMPTY only if none.

    ``uniform`` is ``(q_block, kv_block, q_start, q_stop, m)`` when the tiles are consecutive index
    blocks: queries ``q_start .. q_stop - 1`` in blocks of ``q_block``, keys ``0 .. m - 1`` in
    blocks of ``kv_block`` (what a tensor mask needs to reduce itself block-wise), else None.
    """

    q_lo: torch.Tensor
    q_hi: torch.Tensor
    kv_lo: torch.Tensor
    kv_hi: torch.Tensor
    uniform: tuple[int, int, int, int, int] | None = None

    @classmethod
    def blocks(cls, n: int, m: int, bq: int, bk: int, rows: tuple[int, int] | None = None, device=None) -> Grid:
        """The index tiles of an ``n x m`` grid, query tile rows ``rows`` (default all)."""
        r0, r1 = rows if rows is not None else (0, -(-n // bq))
        qi = torch.arange(r0, r1, device=device)[:, None] * bq
        kj = torch.arange(-(-m // bk), device=device)[None, :] * bk
        return cls(qi, (qi + bq).clamp(max=n) - 1, kj, (kj + bk).clamp(max=m) - 1,
                   (bq, bk, r0 * bq, min(r1 * bq, n), m))


def broadcast_shape(*shapes) -> tuple[int, ...]:
    """The broadcast of ``shapes`` (``torch.broadcast_shapes`` without its import of torch._refs,
    which loads sympy: tens of MiB a memory-capped process does not have). ValueError if they do not."""
    rank = max((len(s) for s in shapes), default=0)
    out = [1] * rank
    for s in shapes:
        for i, size in enumerate(s, start=rank - len(s)):
            if size != 1 and out[i] not in (1, size):
                raise ValueError(f"shapes {', '.join(str(tuple(x)) for x in shapes)} do not broadcast")
            out[i] = size if size != 1 else out[i]
    return tuple(out)


def _combine(states: list[torch.Tensor | None], absorbing: int, identity: int) -> torch.Tensor | None:
    """Per tile: ``absorbing`` if a part is, ``identity`` if all are, PARTIAL if one part is
    PARTIAL and the rest ``identity``, else UNKNOWN (an unknown part, None, counts as none)."""
    known = [s for s in states if s is not None]
    if not known:
        return None
    k = len(states)
    # each sum is of a non-empty list of tensors: a tensor, never sum()'s int start 0
    absorb, ident, partial = (cast(torch.Tensor, sum((s == state).int() for s in known))
                              for state in (absorbing, identity, PARTIAL))
    out = torch.where(absorb > 0, absorbing,
                      torch.where(ident == k, identity,
                                  torch.where((partial == 1) & (ident == k - 1), PARTIAL, UNKNOWN)))
    return out.to(torch.uint8)


def combine_and(states: list[torch.Tensor | None]) -> torch.Tensor | None:
    """States of ``a & b & ...``: EMPTY if a part is EMPTY, FULL if all are FULL, PARTIAL if one
    is PARTIAL and the rest FULL; otherwise (two partials, or an unknown part) UNKNOWN, for the
    map builder to settle by evaluation."""
    return _combine(states, EMPTY, FULL)


def combine_or(states: list[torch.Tensor | None]) -> torch.Tensor | None:
    """States of ``a | b | ...``: FULL if a part is FULL, EMPTY if all are EMPTY, PARTIAL if one is
    PARTIAL and the rest EMPTY; otherwise UNKNOWN."""
    return _combine(states, FULL, EMPTY)
