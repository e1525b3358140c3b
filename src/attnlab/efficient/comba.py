"""Comba (Hu et al. 2025): the gated delta rule with closed-loop control of its output."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..core.amp import upcast
from .base import Budget, register
from .deltanet import GatedDeltaNetAttention

__all__ = ["CombaAttention"]


@register("comba")
class CombaAttention(GatedDeltaNetAttention):
    """``S_t = alpha_t S_{t-1} + beta_t k_t (v_t - (alpha_t S_{t-1})^T p_t)^T``,
    ``o_t = S_t^T (q_t - d_h p_t)``: the state corrected from what it reads at ``p_t``, and the
    output corrected by the read key (closed-loop control).

    Hu et al. 2025, "Comba: Improving Bilinear RNNs with Closed-loop Control"
    (https://arxiv.org/abs/2506.02475), as fla's ``Comba`` layer computes it: the read key
    ``p_t = k_t sigmoid(c_h)`` (``c_h`` the inner decay, one per head, initially 1), the query
    ``q_t - d_h p_t`` (``d_h`` the output correction, initially 1), then q, k and p L2-normalised;
    Gated DeltaNet's decay ``alpha_t = exp(-exp(A_h) softplus(x_t W_a + dt_h))`` and
    ``beta_t = sigmoid(x_t W_beta)``; q, k, v through a width-4 short convolution and SiLU; the
    heads' outputs RMS-normalised and gated by ``sigmoid(x W_g)``.

    A positive scale per head leaves a direction unchanged, so the normalised read key is the
    normalised key: the state follows the gated delta rule
    (:func:`attnlab.efficient.recurrence.chunk_delta`, which takes a general read key as
    ``read=``), and Comba differs from ``gated_deltanet`` in its corrected query and its output
    gate. Tested against fla's ``naive_recurrent_comba``.
    """

    output_gate = False  # its own sigmoid gate, in finish
    budget = Budget()  # not an approximation of softmax: not in the approximation table
    norm_eps = 1e-5  # fla's layer's

    def __init__(self, embed_dim: int, num_heads: int, **options):
        super().__init__(embed_dim, num_heads, **options)
        self.inner_decay = nn.Parameter(torch.ones(self.num_heads))  # c_h: p = k sigmoid(c_h)
        self.correction = nn.Parameter(torch.ones(self.num_heads))  # d_h: q - d_h p
        self.gate_proj = nn.Linear(self.embed_dim, self.embed_dim, bias=False)  # W_g

    def features(self, q, k):
        """``normalize(q - d p)`` and ``normalize(k)`` (= ``normalize(p)``), after the convolution's SiLU."""
        if self.conv is None:  # the convolution already applied SiLU
            q, k = F.silu(q), F.silu(k)
        p = k * torch.sigmoid(self.inner_decay).to(k.dtype)[:, None, None]
        q = q - self.correction.to(q.dtype)[:, None, None] * p
        return F.normalize(q, dim=-1), F.normalize(k, dim=-1)

    def finish(self, o, x, v):
        """RMSNorm over each head's output, gated by ``sigmoid(x W_g)``."""
        b, n, _ = x.shape
        gate = self.gate_proj(x).view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        return self.out_norm(o, x) * torch.sigmoid(upcast(gate)).to(o.dtype)
