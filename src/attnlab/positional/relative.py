"""A learned bias per head and per (clipped or bucketed) relative offset (Shaw et al. 2018; T5)."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..validate import positive_int
from .base import BiasEncoding, register

__all__ = ["Relative", "relative_bucket"]


def relative_bucket(offsets: torch.Tensor, *, num_buckets: int, max_distance: int, bidirectional: bool) -> torch.Tensor:
    """T5's bucket of each offset ``j - i``: exact for small distances, logarithmic up to ``max_distance``.

    Raffel et al. 2020 (https://arxiv.org/abs/1910.10683), section 2.1: bidirectional buckets
    split into half for keys before the query and half for keys after; within each half, the
    first half of the buckets are the distances 0, 1, 2, ... and the rest cover distances up to
    ``max_distance`` on a log scale; farther offsets share the last bucket. Unidirectional
    (causal) buckets use all buckets for keys at or before the query; keys after it go to
    bucket 0.
    """
    n = num_buckets
    if bidirectional:
        n //= 2
        base = (offsets > 0).long() * n  # keys after the query use the upper half
        dist = offsets.abs()
    else:
        base = torch.zeros_like(offsets)
        dist = (-offsets).clamp_min(0)
    exact = max(n // 2, 1)
    # log-spaced buckets for distance >= exact; clamp before the log so it never sees 0
    far = exact + (
        torch.log(dist.clamp_min(exact).float() / exact) / math.log(max(max_distance / exact, 1 + 1e-6)) * (n - exact)
    ).long()
    far = far.clamp_max(n - 1)
    return base + torch.where(dist < exact, dist, far)


@register("relative")
class Relative(BiasEncoding):
    """``s_ij + w_h[bucket(j - i)]``: one learned scalar per head and per relative-offset bucket.

    Two ways to map an offset to its bucket:

    * ``mode="clip"`` (Shaw et al. 2018, https://arxiv.org/abs/1803.02155, as a scalar bias):
      the offset clipped to ``[-max_distance, max_distance]``: ``2 K + 1`` buckets.
    * ``mode="bucket"`` (T5, :func:`relative_bucket`): ``num_buckets`` buckets, exact near the
      query, logarithmic up to ``max_distance``.

    Every offset has a bucket, so it runs at any length.

    Args:
        num_heads: H.
        mode: ``"bucket"`` (default) or ``"clip"``.
        num_buckets: buckets in ``"bucket"`` mode (32).
        max_distance: the farthest distance told apart (128 in bucket mode, 16 in clip mode).
        bidirectional: keys after the query get their own buckets (False for causal attention).
        init_std: normal initialisation of the bias table.
    """

    def __init__(
        self,
        *,
        dim: int | None = None,
        num_heads: int | None,
        max_len: int | None = None,
        mode: str = "bucket",
        num_buckets: int = 32,
        max_distance: int | None = None,
        bidirectional: bool = True,
        init_std: float = 0.02,
    ):
        super().__init__(num_heads)
        if mode not in ("bucket", "clip"):
            raise ValueError(f"mode must be 'bucket' or 'clip', got {mode!r}")
        self.mode, self.bidirectional = mode, bool(bidirectional)
        self.max_distance = positive_int("max_distance", max_distance if max_distance is not None
                                         else (128 if mode == "bucket" else 16))
        if mode == "bucket":
            self.num_buckets = positive_int("num_buckets", num_buckets)
            if self.num_buckets < (4 if bidirectional else 2):
                raise ValueError(f"num_buckets must be at least {4 if bidirectional else 2}, got {num_buckets}")
        else:
            self.num_buckets = (2 * self.max_distance + 1) if bidirectional else (self.max_distance + 1)
        self.weight = nn.Parameter(torch.empty(self.num_heads, self.num_buckets))  # (H, buckets)
        nn.init.normal_(self.weight, std=init_std)

    def bucket(self, offsets: torch.Tensor) -> torch.Tensor:
        """The bucket index of each offset ``j - i`` (same shape, long)."""
        if self.mode == "bucket":
            return relative_bucket(
                offsets, num_buckets=self.num_buckets, max_distance=self.max_distance, bidirectional=self.bidirectional
            )
        k = self.max_distance
        if self.bidirectional:
            return offsets.clamp(-k, k) + k
        return (-offsets).clamp(0, k)

    def head_bias(self, h, offsets):
        return self.weight[h, self.bucket(offsets.to(self.weight.device))]

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, mode={self.mode!r}, num_buckets={self.num_buckets}, "
            f"max_distance={self.max_distance}, bidirectional={self.bidirectional}"
        )
