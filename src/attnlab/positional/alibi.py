"""ALiBi: attention with linear biases (Press et al. 2022)."""

from __future__ import annotations

import math

import torch

from ..validate import positive_int
from .base import BiasEncoding, register

__all__ = ["ALiBi", "alibi_slopes"]


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """The heads' slopes ``m_h``: a geometric sequence, float64 ``(H,)``.

    For H a power of two: ``m_h = 2^(-8 h / H)``, h = 1..H (8 heads: 1/2, 1/4, ..., 1/256).
    Otherwise, as in the paper's code: the slopes of the largest power of two ``P < H``, then
    every other slope of ``2 P`` heads (the odd-numbered ones) until there are H.
    """
    h = positive_int("num_heads", num_heads)

    def power_of_two(n: int) -> list[float]:
        return [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]

    if h & (h - 1) == 0:
        return torch.tensor(power_of_two(h), dtype=torch.float64)
    p = 2 ** int(math.floor(math.log2(h)))
    return torch.tensor(power_of_two(p) + power_of_two(2 * p)[0::2][: h - p], dtype=torch.float64)


@register("alibi")
class ALiBi(BiasEncoding):
    """``s_ij + m_h (j - i)``: a fixed bias linear in the offset, one slope per head.

    Sign convention: ``bias_h(i, j) = m_h x (j - i)`` with ``m_h > 0`` (:func:`alibi_slopes`),
    so a key ``d`` positions before the query (``j = i - d``) gets ``-m_h d``: the paper's
    causal form (https://arxiv.org/abs/2108.12409). Keys *after* the query would get a
    positive bias that grows with distance, so for bidirectional attention pass
    ``symmetric=True``: ``-m_h |j - i|``. No parameters; any length.

    Args:
        num_heads: H.
        symmetric: use ``-m_h |j - i|`` (for attention without a causal mask).
    """

    def __init__(self, *, dim: int | None = None, num_heads: int | None, max_len: int | None = None, symmetric: bool = False):
        super().__init__(num_heads)
        self.symmetric = bool(symmetric)
        self.register_buffer("slopes", alibi_slopes(self.num_heads).float(), persistent=False)

    def bias_from_offsets(self, offsets):
        d = offsets.to(self.slopes.device)
        d = -d.abs() if self.symmetric else d
        return self.slopes[:, None, None] * d.to(self.slopes.dtype)  # (H, n, m)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, symmetric={self.symmetric}"
