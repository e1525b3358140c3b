"""RoPE: rotary position embedding (Su et al. 2021)."""

from __future__ import annotations

import torch

from ..validate import number_above, positive_int
from .base import PositionalEncoding, register

__all__ = ["RoPE"]


@register("rope")
class RoPE(PositionalEncoding):
    """q and k rotated by angles proportional to their positions, so ``q_m . k_n`` depends on ``m - n`` only.

    Su et al. 2021, RoFormer (https://arxiv.org/abs/2104.09864), eq. 34: each pair of
    dimensions ``(x_{2i}, x_{2i+1})`` of a query or key at position ``m`` is rotated by the angle
    ``m theta_i``, ``theta_i = base^(-2i/D)``. A rotation by ``m theta`` and one by ``n theta``
    leave ``R_m q . R_n k = q . R_{n-m} k``: the score sees the offset only. Nothing is added to
    the values. The cos/sin tables are built in float32 for float32 and half-precision inputs
    (bf16 cannot even hold the position 257) and the rotation is done in float32, then cast
    back; float64 inputs get float64 tables.

    Args:
        dim: D, the head width (even).
        base: 10000 in the paper.
        interleaved: rotate pairs ``(2i, 2i+1)`` as the paper does (default), or pairs
            ``(i, i + D/2)`` as GPT-NeoX and LLaMA checkpoints expect.
    """

    kind = "rotation"

    def __init__(
        self, *, dim: int | None, num_heads: int | None = None, max_len: int | None = None, base: float = 10000.0,
        interleaved: bool = True
    ):
        super().__init__()
        self.dim = positive_int("dim", dim)
        if self.dim % 2:
            raise ValueError(f"rope rotates pairs of dimensions: the head width must be even, got {self.dim}")
        self.base, self.interleaved = number_above("base", base, 1), bool(interleaved)

    def angles(self, positions: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``m theta_i`` for integer positions ``(L,)`` (or ``(B, L)``): ``(…, L, D/2)`` in ``dtype``
        (float32 or float64)."""
        i = torch.arange(0, self.dim, 2, device=positions.device, dtype=dtype)
        theta = self.base ** (-i / self.dim)  # (D/2,)
        return positions.to(dtype)[..., None] * theta

    def _rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.dim:
            raise ValueError(f"rope was created for head width {self.dim}, got q/k of shape {tuple(x.shape)}")
        work = torch.float64 if x.dtype == torch.float64 else torch.float32
        ang = self.angles(positions.to(x.device), work)  # (L, D/2), or (B, L, D/2) per row
        if ang.dim() == 3:
            ang = ang[:, None]  # (B, 1, L, D/2): the same angles for every head
        cos, sin = ang.cos(), ang.sin()
        xw = x.to(work)
        if self.interleaved:
            x1, x2 = xw[..., 0::2], xw[..., 1::2]
        else:
            x1, x2 = xw[..., : self.dim // 2], xw[..., self.dim // 2 :]
        r1, r2 = x1 * cos - x2 * sin, x1 * sin + x2 * cos  # (…, L, D/2) each
        if self.interleaved:
            out = torch.stack((r1, r2), dim=-1).flatten(-2)  # back to (…, L, D), pairs interleaved
        else:
            out = torch.cat((r1, r2), dim=-1)
        return out.to(x.dtype)

    def rotate(self, q, k, q_positions, k_positions):
        return self._rotate(q, q_positions), self._rotate(k, k_positions)

    def table(self, length):
        return self.angles(torch.arange(length))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, base={self.base}, interleaved={self.interleaved}"
