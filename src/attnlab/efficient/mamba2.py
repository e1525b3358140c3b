"""Mamba-2's state-space duality (SSD, Dao & Gu 2024) as attention: a scalar decay per head."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..core.amp import upcast
from .base import Budget, register
from .gated import GatedRecurrence, HeadNorm, time_step_bias

__all__ = ["Mamba2Attention"]


@register("mamba2")
class Mamba2Attention(GatedRecurrence):
    """The SSD layer: ``h_t = exp(dt_t A_h) h_{t-1} + dt_t B_t x_t^T``, ``y_t = h_t^T C_t + D_h x_t``.

    Dao & Gu 2024, "Transformers are SSMs" (https://arxiv.org/abs/2405.21060), sections 3-6: in
    attention terms ``C`` is the query, ``B`` the key and ``x`` the value, and the output is
    ``(C B^T ⊙ L) (dt x)`` with the 1-semiseparable mask ``L_ij = exp(A_h sum_{j<l<=i} dt_l)``.
    ``dt = softplus(x W_dt + dt_bias)`` per head, ``A_h = -exp(A_log_h)``; x, B and C pass a short
    causal convolution (width 4) and SiLU; a skip ``D_h x_t``; the output is RMS-normalised and
    gated by ``silu(z)``, ``z = x W_z`` (the paper's gated RMSNorm). No scaling of q (SSD has
    none). Differences from the paper's layer: B and C are per head (the paper shares one group
    across heads, ``ngroups=1``) and the state width is the head width.
    """

    default_conv = 4
    q_scale = False
    budget = Budget()  # not an approximation of softmax: not in the approximation table

    def __init__(self, embed_dim: int, num_heads: int, **options):
        super().__init__(embed_dim, num_heads, **options)
        self.dt_proj = nn.Linear(self.embed_dim, self.num_heads, bias=False)
        self.dt_bias = nn.Parameter(time_step_bias(self.num_heads))
        self.log_rate = nn.Parameter(torch.empty(self.num_heads).uniform_(1, 16).log())  # A_h = -exp(log_rate)
        self.skip = nn.Parameter(torch.ones(self.num_heads))  # D
        self.out_norm = HeadNorm(self.embed_dim, self.num_heads, gate=True)

    def gates(self, x):
        dt = F.softplus(upcast(self.dt_proj(x)) + self.dt_bias).transpose(1, 2)  # (B, H, N)
        return -self.log_rate.exp()[:, None] * dt, dt  # log decay dt A, and dt scales the write

    def finish(self, o, x, v):
        return self.out_norm(o + self.skip.to(o.dtype)[:, None, None] * v, x)
