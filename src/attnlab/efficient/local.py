"""Local (truncated, sliding-window) attention: exact attention under a window mask, block-sparse."""

from __future__ import annotations

import torch

from ..core import masks
from ..core.attend import attend
from ..validate import int_at_least, optional_int
from .base import Budget, PatternStep, Sweep, register

__all__ = ["LocalAttention", "banded_attention"]


def banded_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    window: int,
    *,
    causal: bool = False,
    valid: torch.Tensor | None = None,
    block: int | None = None,
) -> torch.Tensor:
    """Softmax attention of each query ``i`` over the keys ``j`` with ``|i - j| <= window``
    (``0 <= i - j <= window`` when causal), exactly, in O(N x window) time and memory.

    :func:`attnlab.attend` under :func:`attnlab.masks.window` (and key padding): the block map
    keeps the ``2 ceil(window / block) + 1`` key tiles around each query tile, read as strided
    views of the keys; the band's pattern is evaluated once per chunk (the window depends on
    ``j - i`` alone), and PyTorch's fused CPU flash kernel computes the tiles, forward and backward.

    Args:
        q, k: ``(B, H, N, D)`` (self-attention positions: as many keys as queries).
        v: ``(B, H, N, Dv)``.
        window: w >= 0.
        causal: the one-sided (look-back) window.
        valid: ``(B, N)`` bool, False for padded keys.
        block: the tile (default :data:`attnlab.masks.DEFAULT_BLOCK`).
    """
    if k.shape[2] != q.shape[2]:
        raise ValueError(f"this attention relates positions: it needs as many keys as queries, got N={q.shape[2]}, "
                         f"M={k.shape[2]}")
    mask = masks.window(int_at_least("window", window, 0), causal=causal)
    if valid is not None:
        mask = mask & masks.valid_keys(valid)
    return attend(q, k, v, mask=mask, block_size=block).output


@register("local")
class LocalAttention(PatternStep):
    """Truncated self-attention: each query sees the keys within ``window`` positions.

    ``b_i = sum_{|i - j| <= w} softmax_j(q_i . k_j / sqrt(D)) v_j`` — the lecture's truncated
    self-attention for long audio, where a frame only needs its neighbourhood; with
    ``causal=True``, ``0 <= i - j <= w`` (streaming: look back w frames). Exact, not an
    approximation: it is exact attention under :func:`attnlab.masks.window` (block-sparse, see
    :func:`banded_attention`), and dense attention itself once ``w >= N - 1``. Linear in N in
    time and memory, forward and backward; any other mask, score function or encoding combines.

    Args:
        embed_dim, num_heads, causal: see :class:`attnlab.efficient.PatternStep`.
        window: w, the half-width (default 256).
        block: the tile of the computation (default :data:`attnlab.masks.DEFAULT_BLOCK`).
    """

    budget = Budget(short={"window": 4}, long={"window": 256}, sweep=Sweep("window", (16, 64, 256, 1024), "window"))

    def __init__(self, embed_dim: int, num_heads: int, *, window: int = 256, block: int | None = None, **options):
        int_at_least("window", window, 0)
        optional_int("block", block)
        super().__init__(embed_dim, num_heads, **options)
        self.window, self.block = window, block

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, window={self.window}"

    def pattern_mask(self):
        return masks.window(self.window, causal=self.causal)

    def cache_bounds(self) -> tuple[int, int]:
        """A ring buffer of the last ``window + 1`` keys: cached decoding equals the causal layer."""
        return self.window + 1, 0
