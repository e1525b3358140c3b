"""The delta rule: DeltaNet (Yang et al. 2024) and Gated DeltaNet (Yang, Kautz & Hatamizadeh 2025)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..core.amp import upcast
from .base import Budget, register
from .gated import GatedRecurrence, HeadNorm, time_step_bias

__all__ = ["DeltaNetAttention", "GatedDeltaNetAttention"]


@register("deltanet")
class DeltaNetAttention(GatedRecurrence):
    """``S_t = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T``: the state is corrected towards
    ``v_t`` at key ``k_t`` (one step of online regression) instead of having ``k_t v_t^T`` added.

    Schlag et al. 2021 (https://arxiv.org/abs/2102.11174) and Yang et al. 2024, "Parallelizing
    Linear Transformers with the Delta Rule over Sequence Length"
    (https://arxiv.org/abs/2406.06484): ``beta_t = sigmoid(x_t W_beta)`` per head; q and k pass a
    short causal convolution (width 4) and SiLU, then L2 normalisation (so that ``I - beta k k^T``
    is a contraction); the heads' outputs are RMS-normalised (fla's default layer has no output
    gate). The chunkwise form is the paper's WY / UT form (section 3).
    """

    delta = True
    default_conv_size = 4
    output_gate = False  # fla's DeltaNet layer has none; Gated DeltaNet has
    beta_bias = True  # beta's projection has a bias (KDA's has none)
    norm_eps = 1e-6  # the output RMSNorm's epsilon
    budget = Budget()  # not an approximation of softmax: not in the approximation table

    def __init__(self, embed_dim: int, num_heads: int, **options):
        super().__init__(embed_dim, num_heads, **options)
        self.beta_proj = nn.Linear(self.embed_dim, self.num_heads, bias=self.beta_bias)
        self.out_norm = HeadNorm(self.embed_dim, self.num_heads, gate=self.output_gate, eps=self.norm_eps)

    def features(self, q, k):
        if self.conv is None:  # the convolution already applied SiLU
            q, k = F.silu(q), F.silu(k)
        return F.normalize(q, dim=-1), F.normalize(k, dim=-1)

    def _beta(self, x):
        return torch.sigmoid(upcast(self.beta_proj(x))).transpose(1, 2)  # (B, H, N)

    def gates(self, x):
        return None, self._beta(x)

    def finish(self, o, x, v):
        return self.out_norm(o, x)


@register("gated_deltanet")
class GatedDeltaNetAttention(DeltaNetAttention):
    """``S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T``: the delta rule with a
    data-dependent decay per head.

    Yang, Kautz & Hatamizadeh 2025, "Gated Delta Networks" (https://arxiv.org/abs/2412.06464),
    equation 10: ``alpha_t = exp(-exp(A_h) softplus(x_t W_a + dt_h))`` (Mamba-2's decay), ``beta_t
    = sigmoid(x_t W_beta)``; short convolution, SiLU and L2-normalised q and k as DeltaNet; the
    heads' outputs RMS-normalised and gated by ``swish(x W_g)``.
    """

    output_gate = True
    budget = Budget()  # not an approximation of softmax: not in the approximation table

    def __init__(self, embed_dim: int, num_heads: int, **options):
        super().__init__(embed_dim, num_heads, **options)
        self.decay_proj = nn.Linear(self.embed_dim, self.num_heads, bias=False)
        self.log_rate = nn.Parameter(torch.empty(self.num_heads).uniform_(1, 16).log())  # A_h = exp(log_rate)
        self.time_bias = nn.Parameter(time_step_bias(self.num_heads))

    def gates(self, x):
        dt = F.softplus(upcast(self.decay_proj(x)) + self.time_bias)  # (B, N, H)
        return (-self.log_rate.exp() * dt).transpose(1, 2), self._beta(x)
