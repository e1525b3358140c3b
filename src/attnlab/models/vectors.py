"""Images as vector sets: pixels or patches under self-attention (ViT), and the CNN baseline.

An image ``(C, H, W)`` is a set of vectors two ways:

* **pixels** — every pixel a vector of its C channel values (``H W`` vectors): self-attention
  over all of them, each pixel free to look at every other;
* **patches** — every ``p x p`` patch flattened to ``C p^2`` values and projected to the
  model width (Dosovitskiy et al. 2021, "An Image is Worth 16x16 Words",
  https://arxiv.org/abs/2010.11929): ``H W / p^2`` vectors, plus a CLS token whose output is
  classified.

A CNN is self-attention restricted to a fixed receptive field with weights that depend on
the offset only: strong prior, fewer data needed; self-attention learns its own receptive
field, which pays off as the data grow. :class:`CNNBackbone` is the baseline with the same
head (a linear layer on one pooled vector).

Backbones here read ``x`` ``(B, C, H, W)`` and return ``(B, embed_dim)``;
:class:`VectorClassifier` puts the head on top.
"""

from __future__ import annotations

import torch
from torch import nn

from ..validate import positive_int
from .base import ModelOutput, register
from .encoder import Encoder

__all__ = ["CNNBackbone", "ImageBackbone", "PixelAttentionBackbone", "VectorClassifier", "ViTBackbone", "patchify"]


def patchify(x: torch.Tensor, patch: int) -> torch.Tensor:
    """``(B, C, H, W)`` -> ``(B, (H/p)(W/p), C p p)``: non-overlapping patches in raster order,
    each flattened channel-major (the order of a ``Conv2d`` with kernel = stride = ``p``)."""
    b, c, h, w = x.shape
    if h % patch or w % patch:
        raise ValueError(f"image size {h}x{w} is not divisible by the patch size {patch}")
    x = x.reshape(b, c, h // patch, patch, w // patch, patch)  # (B, C, H/p, p, W/p, p)
    return x.permute(0, 2, 4, 1, 3, 5).reshape(b, (h // patch) * (w // patch), c * patch * patch)


class ImageBackbone(nn.Module):
    """Base class: ``forward(x (B, C, H, W)) -> (B, embed_dim)``.

    Args:
        feature_dim: C, the channels. embed_dim: output width. image_size: ``(H, W)``.

    Attributes:
        inputs: ``"image"``.
    """

    inputs = "image"
    uses_attention = False

    def __init__(self, feature_dim: int, embed_dim: int, image_size: tuple[int, int] | list[int]):
        super().__init__()
        self.channels, self.embed_dim = positive_int("feature_dim", feature_dim), positive_int("embed_dim", embed_dim)
        if not (isinstance(image_size, (tuple, list)) and len(image_size) == 2):
            raise ValueError(f"image_size must be (H, W), got {image_size!r}")
        self.image_size = (positive_int("image height", image_size[0]), positive_int("image width", image_size[1]))

    def _check(self, x: torch.Tensor) -> None:
        if not isinstance(x, torch.Tensor) or x.dim() != 4 or tuple(x.shape[1:]) != (self.channels, *self.image_size):
            raise ValueError(f"expected images (B, {self.channels}, {self.image_size[0]}, {self.image_size[1]}), got "
                             f"{getattr(x, 'shape', type(x).__name__)}")


@register("vit")
class ViTBackbone(ImageBackbone):
    """Vision Transformer: patches of ``patch_size`` (a linear embedding), a CLS token, an
    :class:`attnlab.models.Encoder` (any attention variant and positional encoding by name;
    ViT's own is ``learned``); the CLS output is the image's vector."""

    uses_attention = True

    def __init__(self, feature_dim: int, embed_dim: int, image_size, *, patch_size: int = 2, num_heads: int = 4,
                 num_layers: int = 2, positional: str = "learned", max_len: int | None = None, **encoder_options):
        super().__init__(feature_dim, embed_dim, image_size)
        self.patch_size = positive_int("patch_size", patch_size)
        h, w = self.image_size
        if h % patch_size or w % patch_size:
            raise ValueError(f"image size {h}x{w} is not divisible by patch_size {patch_size}")
        self.num_patches = (h // patch_size) * (w // patch_size)
        self.embed = nn.Linear(feature_dim * patch_size * patch_size, embed_dim)
        self.cls = nn.Parameter(torch.zeros(1, 1, embed_dim))
        nn.init.normal_(self.cls, std=0.02)
        self.encoder = Encoder(embed_dim, num_heads, num_layers, positional=positional, max_len=self.num_patches + 1,
                               **encoder_options)

    def tokens(self, x: torch.Tensor) -> torch.Tensor:
        """The input vectors ``(B, 1 + patches, embed_dim)``: CLS, then the embedded patches."""
        self._check(x)
        v = self.embed(patchify(x, self.patch_size))
        return torch.cat([self.cls.expand(v.shape[0], -1, -1).to(v.dtype), v], dim=1)

    def forward(self, x, *, return_weights: bool = False):
        out = self.encoder(self.tokens(x), return_weights=return_weights)
        return ModelOutput(out.output[:, 0], out.weights)


@register("pixels")
class PixelAttentionBackbone(ViTBackbone):
    """Self-attention over single pixels: :class:`ViTBackbone` with ``patch_size=1`` (``H W``
    vectors of C values each)."""

    def __init__(self, feature_dim: int, embed_dim: int, image_size, **options):
        if options.get("patch_size", 1) != 1:
            raise ValueError("pixels attends over single pixels: patch_size is 1 (use model 'vit' for patches)")
        options.pop("patch_size", None)
        super().__init__(feature_dim, embed_dim, image_size, patch_size=1, **options)


@register("cnn")
class CNNBackbone(ImageBackbone):
    """A small CNN: ``num_layers`` 3x3 convolution blocks (GELU; a 2x2 max-pool after every
    second block while the map is larger than 2x2), then global average pooling."""

    def __init__(self, feature_dim: int, embed_dim: int, image_size, *, num_layers: int = 3, dropout: float = 0.0):
        super().__init__(feature_dim, embed_dim, image_size)
        positive_int("num_layers", num_layers)
        layers: list[nn.Module] = []
        c, size = feature_dim, min(self.image_size)
        for i in range(num_layers):
            width = embed_dim if i == num_layers - 1 else max(embed_dim // 2, 8)
            layers += [nn.Conv2d(c, width, 3, padding=1), nn.GELU()]
            if i % 2 == 1 and size > 2:
                layers.append(nn.MaxPool2d(2))
                size //= 2
            c = width
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(dropout)]
        self.net = nn.Sequential(*layers)

    def forward(self, x, *, return_weights: bool = False):
        self._check(x)
        return ModelOutput(self.net(x))


class VectorClassifier(nn.Module):
    """One label per image or frame sequence: the backbone's vector (an :class:`ImageBackbone`,
    or a :class:`attnlab.models.audio.FrameBackbone` given ``pad``), then LayerNorm and a linear layer."""

    def __init__(self, backbone: ImageBackbone, num_labels: int):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Sequential(nn.LayerNorm(backbone.embed_dim),
                                  nn.Linear(backbone.embed_dim, positive_int("num_labels", num_labels)))

    def forward(self, x: torch.Tensor, pad: torch.Tensor | None = None, *, return_weights: bool = False):
        """Logits ``(B, num_labels)`` (and the backbone's attention weights when asked); ``pad``
        ``(B, N)`` marks padded vectors of a frame sequence (images have none)."""
        args = (x,) if pad is None else (x, pad)
        res = self.backbone(*args, return_weights=return_weights)
        return ModelOutput(self.head(res.output), res.weights)
