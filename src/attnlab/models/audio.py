"""Backbones over frame sequences (audio features ``(B, T, F)`` with a padding mask).

* ``audio_transformer`` — a linear projection of each frame, then an
  :class:`attnlab.models.Encoder` (any attention: ``attention="local"`` with
  ``attention_options={"window": w}`` is truncated attention, +-w frames);
* ``conformer`` — the same projection, then a :class:`attnlab.models.conformer.Conformer`.

Both return the mean of the real frames' output vectors ``(B, embed_dim)``, for
:class:`attnlab.models.vectors.VectorClassifier`.
"""

from __future__ import annotations

import torch
from torch import nn

from ..validate import positive_int
from .base import ModelOutput, register
from .conformer import Conformer
from .encoder import Encoder

__all__ = ["AudioTransformerBackbone", "ConformerBackbone", "FrameBackbone"]


class FrameBackbone(nn.Module):
    """Base class: ``forward(x (B, T, F), pad (B, T) bool True = padding) -> (B, embed_dim)``.

    Attributes:
        inputs: ``"features"``.
    """

    inputs = "features"
    uses_attention = True
    encoder_class: type = Encoder
    options_target = Encoder  # where **encoder_options go (a subclass with another encoder_class sets both)

    def __init__(self, feature_dim: int, embed_dim: int, *, num_heads: int = 4, num_layers: int = 2, **encoder_options):
        super().__init__()
        self.feature_dim = positive_int("feature_dim", feature_dim)
        self.embed_dim = positive_int("embed_dim", embed_dim)
        self.proj = nn.Linear(feature_dim, embed_dim)
        self.encoder = self.encoder_class(embed_dim, num_heads, num_layers, **encoder_options)

    def forward(self, x: torch.Tensor, pad: torch.Tensor | None = None, *, return_weights: bool = False):
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[2] != self.feature_dim:
            raise ValueError(f"expected frames (B, T, {self.feature_dim}), got {getattr(x, 'shape', type(x).__name__)}")
        if pad is not None and pad.shape != x.shape[:2]:
            raise ValueError(f"pad must be (B, T) = {tuple(x.shape[:2])}, got {tuple(pad.shape)}")
        mask = None if pad is None or not bool(pad.any()) else ~pad[:, None, None, :]
        out = self.encoder(self.proj(x), mask=mask, return_weights=return_weights)
        if pad is None:
            pooled = out.output.mean(1)
        else:  # masked_fill, not a product: whatever padded frames hold (even NaN) stays out
            keep = ~pad[..., None]
            pooled = out.output.masked_fill(~keep, 0.0).sum(1) / keep.sum(1).clamp_min(1).to(out.output.dtype)
        return ModelOutput(pooled, out.weights)


@register("audio_transformer")
class AudioTransformerBackbone(FrameBackbone):
    """Frames -> linear -> Transformer encoder (any attention variant and positional encoding)."""


@register("conformer")
class ConformerBackbone(FrameBackbone):
    """Frames -> linear -> Conformer blocks (``conv_kernel`` option; any attention variant)."""

    encoder_class = options_target = Conformer
