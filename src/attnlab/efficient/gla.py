"""Gated linear attention (GLA, Yang et al. 2024): a data-dependent decay per key channel."""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn

from ..core.amp import upcast
from .base import Budget, register
from .gated import GatedRecurrence, HeadNorm

__all__ = ["GatedLinearAttention"]


@register("gla")
class GatedLinearAttention(GatedRecurrence):
    """``S_t = diag(alpha_t) S_{t-1} + k_t v_t^T``, ``alpha_t = sigmoid(x_t W_1 W_2 + b)^(1/tau)``.

    Yang et al. 2024, "Gated Linear Attention Transformers with Hardware-Efficient Training"
    (https://arxiv.org/abs/2312.06635), section 4.1: the forget gate is a low-rank (rank 16)
    projection of the input, one value per head and key channel, with ``tau = 16`` so that the
    decay starts close to 1; the heads' outputs are RMS-normalised and gated by ``swish(x W_r)``.
    No short convolution (the paper has none). The chunkwise form factors the per-channel decay
    inside a chunk (see :mod:`attnlab.efficient.recurrence`).

    Args:
        gate_rank: the rank of the gate's projection. gate_temperature: tau.
    """

    decay_per_channel = True  # one decay per head and key channel
    budget = Budget()  # not an approximation of softmax: not in the approximation table

    def __init__(self, embed_dim: int, num_heads: int, *, gate_rank: int = 16, gate_temperature: float = 16.0,
                 **options):
        super().__init__(embed_dim, num_heads, **options)
        self.gate_down = nn.Linear(self.embed_dim, gate_rank, bias=False)
        self.gate_up = nn.Linear(gate_rank, self.embed_dim)
        self.gate_temperature = float(gate_temperature)
        self.out_norm = HeadNorm(self.embed_dim, self.num_heads, gate=True)

    def gates(self, x):
        b, n, _ = x.shape
        logit = upcast(self.gate_up(self.gate_down(x)))
        g = F.logsigmoid(logit) / self.gate_temperature  # (B, N, E): log alpha
        return g.view(b, n, self.num_heads, self.head_dim).transpose(1, 2), None

    def finish(self, o, x, v):
        return self.out_norm(o, x)
