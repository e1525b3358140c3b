"""A learned table of position vectors (BERT, GPT-2; Gehring et al. 2017)."""

from __future__ import annotations

import torch
from torch import nn

from ..validate import positive_int
from .base import InputEncoding, register

__all__ = ["Learned"]


@register("learned")
class Learned(InputEncoding):
    """A trained vector per position, ``e^i = P[i]``, added to the inputs.

    The table has ``max_len`` rows and nothing beyond: a position >= ``max_len`` raises a
    ``ValueError`` (the lecture's "what if the sequence is 129 long?").

    Args:
        dim: E, the input width.
        max_len: the number of positions (default 512).
        init_std: standard deviation of the normal initialisation (0.02, as BERT).
    """

    def __init__(self, *, dim: int | None, num_heads: int | None = None, max_len: int | None = None,
                 init_std: float = 0.02):
        super().__init__(dim)
        self.max_len = 512 if max_len is None else positive_int("max_len", max_len)
        self.weight = nn.Parameter(torch.empty(self.max_len, self.dim))
        nn.init.normal_(self.weight, std=init_std)

    def encode(self, positions):
        self._check_length(positions)
        return self.weight[positions.to(self.weight.device)]
