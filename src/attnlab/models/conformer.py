"""Conformer: self-attention for the global context, convolution for the local one (Gulati et
al. 2020, "Conformer: Convolution-augmented Transformer for Speech Recognition",
https://arxiv.org/abs/2005.08100, Fig. 1 and eqs. 1-4). One block::

    x = x + 1/2 FFN(x)                 FFN: LN, Linear(4E), Swish, dropout, Linear(E), dropout
    x = x + drop(MHSA(LN(x)))          any attnlab attention: dense, or truncated ("local", +-w frames)
    x = x + Conv(x)                    LN, pointwise conv to 2E, GLU, depthwise conv (kernel k),
                                       BatchNorm, Swish, pointwise conv, dropout
    x = x + 1/2 FFN(x)
    y = LN(x)

A 1-minute recording is 6000 frames (25 ms windows, 10 ms hop): with ``attention="local"`` and
``attention_options={"window": w}`` each frame attends to +-w frames only (linear time and
memory), while the convolution module adds the local detail. Padded frames (from the key
padding mask) are zeroed before the depthwise convolution, so they never leak into real frames.
"""

from __future__ import annotations

import torch
from torch import nn

from ..positional.base import kind_of
from ..validate import is_int
from .encoder import Encoder, make_attention

__all__ = ["Conformer", "ConformerLayer", "ConvModule"]


class ConvModule(nn.Module):
    """The Conformer convolution module (``(B, N, E)`` -> ``(B, N, E)``, the residual added by the caller).

    Args:
        embed_dim: E. kernel_size: of the depthwise convolution (odd; "same" padding). dropout: at the end.
    """

    def __init__(self, embed_dim: int, kernel_size: int = 15, dropout: float = 0.0):
        super().__init__()
        if not is_int(kernel_size) or kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f"conv_kernel must be a positive odd int, got {kernel_size!r}")
        self.norm = nn.LayerNorm(embed_dim)
        self.pointwise1 = nn.Conv1d(embed_dim, 2 * embed_dim, 1)
        self.depthwise = nn.Conv1d(embed_dim, embed_dim, kernel_size, padding=kernel_size // 2, groups=embed_dim)
        self.batch_norm = nn.BatchNorm1d(embed_dim)
        self.pointwise2 = nn.Conv1d(embed_dim, embed_dim, 1)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        """``x`` ``(B, N, E)``; ``keep`` ``(B, N)`` bool, True = a real frame (None: all)."""
        h = self.norm(x).transpose(1, 2)  # (B, E, N)
        h = nn.functional.glu(self.pointwise1(h), dim=1)
        if keep is not None:
            h = h.masked_fill(~keep[:, None, :], 0.0)
        h = nn.functional.silu(self.batch_norm(self.depthwise(h)))
        return self.drop(self.pointwise2(h).transpose(1, 2))


class _FeedForward(nn.Module):
    def __init__(self, embed_dim: int, hidden: int, dropout: float):
        super().__init__()
        self.net = nn.Sequential(nn.LayerNorm(embed_dim), nn.Linear(embed_dim, hidden), nn.SiLU(), nn.Dropout(dropout),
                                 nn.Linear(hidden, embed_dim), nn.Dropout(dropout))

    def forward(self, x):
        return self.net(x)


class ConformerLayer(nn.Module):
    """One Conformer block (the module docstring); attention built like an
    :class:`attnlab.models.EncoderLayer`'s from an :class:`attnlab.models.EncoderConfig`."""

    def __init__(self, cfg, positional, kernel_size: int = 15):
        super().__init__()
        hidden = cfg.ff_dim or 4 * cfg.embed_dim
        self.ff1 = _FeedForward(cfg.embed_dim, hidden, cfg.dropout)
        self.norm_attn = nn.LayerNorm(cfg.embed_dim)
        self.attn = make_attention(cfg, positional)
        self.drop = nn.Dropout(cfg.dropout)
        self.conv = ConvModule(cfg.embed_dim, kernel_size, cfg.dropout)
        self.ff2 = _FeedForward(cfg.embed_dim, hidden, cfg.dropout)
        self.norm_out = nn.LayerNorm(cfg.embed_dim)

    def forward(self, x, *, mask=None, positions=None, return_weights=False):
        """``(B, N, E)`` -> :class:`attnlab.AttentionResult`; ``mask`` as for the Encoder (a key
        padding mask ``(B, 1, 1, N)`` also masks the convolution)."""
        keep = None
        if mask is not None and mask.dim() == 4 and mask.shape[1] == mask.shape[2] == 1 and mask.shape[3] == x.shape[1]:
            keep = mask[:, 0, 0, :].expand(x.shape[0], -1)
        x = x + 0.5 * self.ff1(x)
        res = self.attn(self.norm_attn(x), mask=mask, positions=positions, key_positions=positions,
                        return_weights=return_weights)
        x = x + self.drop(res.output)
        x = x + self.conv(x, keep)
        x = self.norm_out(x + 0.5 * self.ff2(x))
        res.output = x
        return res


class Conformer(Encoder):
    """A stack of :class:`ConformerLayer` blocks, with every :class:`attnlab.models.Encoder`
    option (attention by name, positional encoding, dropout, ...).

    Args:
        embed_dim, num_heads, num_layers: sizes. conv_kernel: depthwise kernel (odd, default
            15: +-70 ms at a 10 ms hop). options: :class:`attnlab.models.EncoderConfig` fields.

    ``forward(x (B, N, E), mask=None, ...)`` -> :class:`attnlab.models.EncoderOutput`.
    """

    def __init__(self, embed_dim: int, num_heads: int, num_layers: int, *, conv_kernel: int = 15, **options):
        options.setdefault("norm_first", True)
        super().__init__(embed_dim, num_heads, num_layers, **options)
        # as the Encoder shares it
        shared = self.positional if kind_of(self.config.positional) in ("bias", "rotation") else None
        self.layers = nn.ModuleList(ConformerLayer(self.config, shared, conv_kernel) for _ in range(num_layers))
        self.final_norm = nn.Identity()  # each block ends with its own LayerNorm
