"""Local (truncated, sliding-window) attention, computed block by block."""

from __future__ import annotations

import torch

from ..validate import int_at_least, optional_int
from .base import Budget, EfficientAttention, Sweep, register
from .banded import banded_flash_attention
from .sparse import block_sparse_attention

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

    Query block ``t`` (of ``block`` positions) can only reach key blocks ``t - r .. t + r``,
    ``r = ceil(window / block)`` (``t - r .. t`` when causal). On CPU every block runs PyTorch's
    fused flash kernel over a strided view of its keys with one shared band mask
    (:func:`attnlab.efficient.banded.banded_flash_attention`); elsewhere each block's keys are
    gathered and run through ``scaled_dot_product_attention``
    (:func:`attnlab.efficient.sparse.block_sparse_attention` without global or random keys).

    Args:
        q, k: ``(B, H, N, D)`` (self-attention positions: as many keys as queries).
        v: ``(B, H, N, Dv)``.
        window: w >= 0.
        causal: the one-sided (look-back) window.
        valid: ``(B, N)`` bool, False for padded keys.
        block: query block length (default: :func:`attnlab.efficient.banded.default_block` on
            CPU, ``min(max(window, 64), 128)`` on the fallback path; at most N).
    """
    out = banded_flash_attention(q, k, v, window, causal=causal, valid=valid, block=block)
    if out is None:
        out = block_sparse_attention(q, k, v, window, causal=causal, valid=valid, block=block)
    return out


@register("local")
class LocalAttention(EfficientAttention):
    """Truncated self-attention: each query sees the keys within ``window`` positions.

    ``b_i = sum_{|i - j| <= w} softmax_j(q_i . k_j / sqrt(D)) v_j`` — the lecture's truncated
    self-attention for long audio, where a frame only needs its neighbourhood; with
    ``causal=True``, ``0 <= i - j <= w`` (streaming: look back w frames). Exact, not an
    approximation: it equals dense attention under :func:`attnlab.masks.window`, and dense
    attention itself once ``w >= N - 1``. Linear in N in time and memory, forward and
    backward (:func:`banded_attention`).

    Args:
        embed_dim, num_heads, causal, ...: see :class:`attnlab.efficient.EfficientAttention`.
        window: w, the half-width (default 256).
        block: the query block length of the computation (default: see :func:`banded_attention`).
    """

    budget = Budget(short={"window": 4}, long={"window": 256}, sweep=Sweep("window", (16, 64, 256, 1024), "window"))

    def __init__(self, embed_dim: int, num_heads: int, *, window: int = 256, block: int | None = None, **options):
        int_at_least("window", window, 0)
        optional_int("block", block)
        super().__init__(embed_dim, num_heads, **options)
        self.window, self.block = window, block

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, window={self.window}"

    def new_cache(self, *, window=None, sinks=0, positions="absolute"):
        """A ring buffer of the last ``window + 1`` keys: cached decoding equals the causal layer."""
        return self._bounded_cache(0, window, sinks, positions)

    def efficient(self, q, k, v, valid):
        return banded_attention(q, k, v, self.window, causal=self.causal, valid=valid, block=self.block)
