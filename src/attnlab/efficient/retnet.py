"""Retention (RetNet, Sun et al. 2023): linear attention with a fixed decay per head."""

from __future__ import annotations

import torch

from ..core.amp import upcast
from .base import Budget, register
from .gated import GatedRecurrence, HeadNorm

__all__ = ["RetentionAttention", "retention_decays"]


def retention_decays(num_heads: int) -> torch.Tensor:
    """RetNet's multi-scale decays ``gamma_h = 1 - 2^(-5 - h)``, h = 0..H-1 (section 2.2)."""
    return 1.0 - 2.0 ** (-5.0 - torch.arange(num_heads, dtype=torch.float64))


@register("retnet")
class RetentionAttention(GatedRecurrence):
    """Multi-scale retention: ``S_t = gamma_h S_{t-1} + k_t v_t^T``, ``o_t = S_t^T q_t``.

    Sun et al. 2023, "Retentive Network" (https://arxiv.org/abs/2307.08621), equations 1-8: the
    parallel form ``(Q K^T ⊙ D) V`` with ``D_nm = gamma^(n-m)`` for ``n >= m``, the recurrent form
    above and the chunkwise form of section 2.1. Each head keeps its own fixed decay
    (:func:`retention_decays`); the heads' outputs are normalised per head and gated by
    ``swish(x W_G)`` (the paper's GroupNorm and swish gate; RMSNorm here, as fla's layer). The
    paper rotates q and k with xPos: pass ``positional="rope"`` for the rotation (without xPos's
    scaling, which the decay already provides). No short convolution (the paper has none).
    """

    budget = Budget()  # exact recurrence, no knob; not an approximation of softmax, so not in the approximation table

    def __init__(self, embed_dim: int, num_heads: int, **options):
        super().__init__(embed_dim, num_heads, **options)
        # follows .double()
        self.register_buffer("log_decay", retention_decays(self.num_heads).log().float(), persistent=False)
        self.out_norm = HeadNorm(self.embed_dim, self.num_heads, gate=True)

    def gates(self, x):
        b, n, _ = x.shape
        return upcast(self.log_decay)[None, :, None].expand(b, -1, n), None

    def finish(self, o, x, v):
        return self.out_norm(o, x)
