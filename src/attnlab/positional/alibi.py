"""ALiBi: attention with linear biases (Press et al. 2022)."""

from __future__ import annotations

from ..core.score_mods import alibi_slopes
from .base import BiasEncoding, register

__all__ = ["ALiBi", "alibi_slopes"]


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

    def __init__(self, *, dim: int | None = None, num_heads: int | None, max_len: int | None = None,
                 symmetric: bool = False):
        super().__init__(num_heads)
        self.symmetric = bool(symmetric)
        self.register_buffer("slopes", alibi_slopes(self.num_heads).float(), persistent=False)

    def head_bias(self, h, offsets):
        d = offsets.to(self.slopes.device)
        d = -d.abs() if self.symmetric else d
        return self.slopes[h] * d.to(self.slopes.dtype)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, symmetric={self.symmetric}"
