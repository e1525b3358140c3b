"""Bands: masks of the offset ``kv - q`` alone (causal, windows, dilated windows, no-self)."""

from __future__ import annotations

from typing import Literal

import torch

from .maskfn import EMPTY, FULL, PARTIAL, Mask

__all__ = ["Align", "Band"]

Align = Literal["bottom_right", "top_left"]


class Band(Mask):
    """``lo <= kv - q' <= hi`` with ``q' = q + shift`` (the query's key position), optionally only
    offsets divisible by ``dilation``; ``None`` bounds are open."""

    shift_invariant = True

    def __init__(self, lo: int | None, hi: int | None, *, dilation: int = 1, align: Align = "bottom_right",
                 shift: int | None = None, name: str = "band"):
        if align not in ("bottom_right", "top_left"):
            raise ValueError(f"align must be 'bottom_right' or 'top_left', got {align!r}")
        self.lo, self.hi, self.dilation, self.align, self.shift, self.name = lo, hi, dilation, align, shift, name

    def _shift(self) -> int:
        return self.shift or 0

    def bind(self, n, m):
        return Band(self.lo, self.hi, dilation=self.dilation, align=self.align,
                    shift=(m - n) if self.align == "bottom_right" else 0, name=self.name)

    def __call__(self, b, h, q_idx, kv_idx):
        d = kv_idx - (q_idx + self._shift())
        ok = torch.ones((), dtype=torch.bool, device=d.device)
        if self.lo is not None:
            ok = ok & (d >= self.lo)
        if self.hi is not None:
            ok = ok & (d <= self.hi)
        if self.dilation > 1:
            ok = ok & (d % self.dilation == 0)
        return ok

    def tiles(self, grid):
        s = self._shift()
        dmin = grid.kv_lo - (grid.q_hi + s)  # smallest kv - q' in the tile
        dmax = grid.kv_hi - (grid.q_lo + s)
        lo = dmin if self.lo is None else dmin.clamp(min=self.lo)  # the tile's offsets inside the band: lo .. hi
        hi = dmax if self.hi is None else dmax.clamp(max=self.hi)
        inside = (dmin >= lo) & (dmax <= hi)  # every offset of the tile lies in the band
        if self.dilation == 1:
            empty, full = lo > hi, inside
        else:  # offsets divisible by the dilation: none between lo and hi, or the tile holds one offset, divisible
            empty = (torch.div(hi, self.dilation, rounding_mode="floor")
                     < -torch.div(-lo, self.dilation, rounding_mode="floor"))
            full = inside & (dmin == dmax) & (dmin % self.dilation == 0)
        return torch.where(empty, EMPTY, torch.where(full, FULL, PARTIAL)).to(torch.uint8)

    def is_causal(self, n, m):
        shift = (m - n) if (self.shift is None and self.align == "bottom_right") else self._shift()
        return self.lo is None and self.hi == 0 and self.dilation == 1 and shift == 0 and n == m

    def __repr__(self):
        dilation = f", dilation={self.dilation}" if self.dilation > 1 else ""
        return f"{self.name}(lo={self.lo}, hi={self.hi}{dilation})"
