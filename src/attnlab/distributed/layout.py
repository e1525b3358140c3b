"""How a sequence is cut across the ranks of a process group: contiguous, zig-zag or striped.

* ``"contiguous"``: rank r holds positions ``r c .. (r+1) c - 1`` (``c = N / P``). A local
  window then needs only the neighbouring ranks' keys.
* ``"zigzag"``: the sequence is cut in ``2P`` chunks and rank r holds chunks ``r`` and
  ``2P - 1 - r``: under a causal mask every rank has the same number of allowed pairs (an
  early and a late chunk), so no rank idles (the balance of Brandon et al. 2023's striping,
  with contiguous runs a blocked kernel can use).
* ``"striped"``: rank r holds positions ``r, r + P, r + 2P, ...`` (Brandon et al. 2023,
  Striped Attention, https://arxiv.org/abs/2311.09431): balanced too, every tile masked.

The length must divide by P (by 2P for zig-zag); :func:`plan_layout` pads it up when asked.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["LAYOUTS", "SequenceLayout", "plan_layout"]

LAYOUTS = ("contiguous", "zigzag", "striped")
"""The ways to cut a sequence across ranks."""


@dataclass(frozen=True)
class SequenceLayout:
    """A sequence of ``length`` real positions cut in ``world`` equal shards of ``shard_len``.

    Attributes:
        length: N, the real positions. padded: the length after padding (a multiple of the
            shards' unit); positions ``length .. padded - 1`` are padding. world: P.
        kind: one of :data:`LAYOUTS`.
    """

    length: int
    padded: int
    world: int
    kind: str = "contiguous"

    @property
    def shard_len(self) -> int:
        """Positions per rank, ``padded / world``."""
        return self.padded // self.world

    def positions(self, rank: int, device=None) -> torch.Tensor:
        """The positions rank ``rank`` holds, ``(shard_len,)`` int64, in the order it holds them."""
        if not 0 <= rank < self.world:
            raise ValueError(f"rank must be in [0, {self.world}), got {rank}")
        p, c = self.world, self.shard_len
        if self.kind == "contiguous":
            return torch.arange(rank * c, (rank + 1) * c, device=device)
        if self.kind == "striped":
            return torch.arange(rank, self.padded, p, device=device)
        h = c // 2  # zig-zag: chunks rank and 2P - 1 - rank of length c / 2
        return torch.cat([torch.arange(rank * h, (rank + 1) * h, device=device),
                          torch.arange((2 * p - 1 - rank) * h, (2 * p - rank) * h, device=device)])

    def order(self, device=None) -> torch.Tensor:
        """Every rank's positions, rank after rank: ``(padded,)``; gathering the shards in rank
        order gives the sequence permuted by this."""
        return torch.cat([self.positions(r, device) for r in range(self.world)])


def plan_layout(length: int, world: int, kind: str = "contiguous", *, pad: bool = False) -> SequenceLayout:
    """The :class:`SequenceLayout` of ``length`` positions over ``world`` ranks.

    Raises ``ValueError`` when the length does not divide by the unit (P, or 2P for zig-zag)
    unless ``pad`` (then it is padded up to the next multiple).
    """
    if kind not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {kind!r}")
    if not isinstance(world, int) or world < 1:
        raise ValueError(f"world (the number of ranks) must be a positive int, got {world!r}")
    if not isinstance(length, int) or length < 1:
        raise ValueError(f"the sequence length must be a positive int, got {length!r}")
    unit = 2 * world if kind == "zigzag" else world
    padded = -(-length // unit) * unit
    if padded != length and not pad:
        raise ValueError(
            f"a sequence of {length} positions does not divide into {world} equal shards"
            + (" of two zig-zag chunks each" if kind == "zigzag" else "")
            + f" (it needs a multiple of {unit}); pad it to {padded} (pad=True / --pad) or choose another length"
        )
    return SequenceLayout(length, padded, world, kind)
