"""Kimi Delta Attention (KDA, Kimi Linear 2025): Gated DeltaNet with a decay per key channel."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..core.amp import upcast
from ..validate import positive_int
from .base import Budget, register
from .deltanet import DeltaNetAttention
from .gated import time_step_bias

__all__ = ["KimiDeltaAttention"]


@register("kda")
class KimiDeltaAttention(DeltaNetAttention):
    """``S_t = diag(alpha_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T``: the gated delta
    rule whose decay ``alpha_t`` is one value per head and key channel instead of one per head.

    Kimi Team 2025, "Kimi Linear: An Expressive, Efficient Attention Architecture"
    (https://arxiv.org/abs/2510.26692), section 3, as transformers' ``KimiLinearDeltaAttention``
    (and fla's ``KimiDeltaAttention``) compute it:

    * the log decay ``g_t = log alpha_t = -exp(A_h) softplus(x_t W_fa W_fb + dt)`` ``(B, H, N, D)``,
      ``W_fa`` ``E x r``, ``W_fb`` ``r x E`` a low-rank projection (rank ``r`` = the head width),
      ``dt`` a bias per channel (``softplus(dt)`` log-uniform in ``[1e-3, 0.1]`` at
      initialisation), ``A_h`` per head (``exp(A_h)`` uniform in ``[1, 16]``): Gated DeltaNet's
      decay, per channel;
    * ``beta_t = sigmoid(x_t W_beta)`` per head (no bias, as the paper's layer);
    * q, k, v through a width-4 short causal convolution and SiLU, then q and k L2-normalised
      (``F.normalize``, as ``deltanet``; the reference adds ``1e-6`` under the square root
      instead), q scaled by ``D^-1/2``;
    * the heads' outputs RMS-normalised and gated by ``sigmoid(x W_ga W_gb)``, a low-rank
      projection of the same rank (not the full-rank swish gate of ``gated_deltanet``).

    The recurrence is :func:`attnlab.efficient.recurrence.chunk_delta` (and its parallel and
    recurrent forms) with the ``(B, H, N, D)`` decay. What differs from the reference layer: the
    projections take ``bias=`` as every attnlab layer (default True; the reference has none).

    Args:
        gate_rank: the rank ``r`` of the decay's and the output gate's projections (default: the head width D).
    """

    output_gate = False  # the RMSNorm alone: KDA's output gate is its own (sigmoid, low rank), applied in finish
    beta_bias = False  # beta's projection has no bias, as the paper's layer
    norm_eps = 1e-5  # the reference's RMSNorm epsilon
    decay_per_channel = True  # one decay per head and key channel
    default_segment = 512  # its per-channel products hold (C, C, D) per chunk: half the positions per segment
    budget = Budget()  # not an approximation of softmax: not in the approximation table

    def __init__(self, embed_dim: int, num_heads: int, *, gate_rank: int | None = None, **options):
        super().__init__(embed_dim, num_heads, **options)
        e, h = self.embed_dim, self.num_heads
        self.gate_rank = r = self.head_dim if gate_rank is None else positive_int("gate_rank", gate_rank)
        self.decay_down = nn.Linear(e, r, bias=False)  # W_fa
        self.decay_up = nn.Linear(r, e, bias=False)  # W_fb
        self.log_rate = nn.Parameter(torch.empty(h).uniform_(1, 16).log())  # A_h: exp(log_rate) is the rate
        self.time_bias = nn.Parameter(time_step_bias(e))  # dt, one per head and channel
        self.out_gate_down = nn.Linear(e, r, bias=False)  # W_ga
        self.out_gate_up = nn.Linear(r, e, bias=False)  # W_gb

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, gate_rank={self.gate_rank}"

    def gates(self, x):
        b, n, _ = x.shape
        dt = F.softplus(upcast(self.decay_up(self.decay_down(x))) + self.time_bias)  # (B, N, E)
        g = -self.log_rate.exp()[:, None] * dt.view(b, n, self.num_heads, self.head_dim)  # (B, N, H, D)
        beta = torch.sigmoid(upcast(self.beta_proj(x))).transpose(1, 2)  # (B, H, N)
        return g.transpose(1, 2), beta

    def finish(self, o, x, v):
        b, n, _ = x.shape
        gate = self.out_gate_up(self.out_gate_down(x)).view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        return self.out_norm(o, x) * torch.sigmoid(upcast(gate)).to(o.dtype)
