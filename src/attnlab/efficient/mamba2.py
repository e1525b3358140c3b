"""Mamba-2's state-space duality (SSD, Dao & Gu 2024) as attention: a scalar decay per head."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..core.amp import upcast
from ..layers.projection import init_projections
from ..validate import positive_int
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
    gated by ``silu(z)``, ``z = x W_z`` (the paper's gated RMSNorm, here per head and normalised
    before the gate). No scaling of q (SSD has none).

    B and C: by default one per head, of the head's width D (``q_proj`` and ``k_proj`` as every
    attnlab layer's). With ``ngroups`` and / or ``state_size``, B and C are projected to
    ``ngroups x state_size`` and shared by the heads of a group (head ``h`` reads group
    ``h // (H / ngroups)``, as transformers' ``Mamba2Mixer`` repeats them), convolved once per
    group; x keeps the head width, so each head's state is ``state_size x D``. ``ngroups=1``
    shares one B and C across all heads, as the paper's default (its ``d_state`` is
    ``state_size``); the output norm stays per head. Its method then receives C and B per group
    ``(B, ngroups, N, state_size)`` (what step hooks see) and the values per head: its ``q_proj``
    and ``k_proj`` project to that shape, which takes no ``num_kv_heads``, and ``rope`` only where
    ``state_size`` is the head width.

    Args:
        ngroups: the groups sharing B and C (must divide ``num_heads``; default: one per head).
        state_size: the width of B and C, the rows of each head's state (default: the head width).
    """

    default_conv_size = 4
    q_scale = False
    finish_reads_values = True  # the skip D x
    budget = Budget()  # not an approximation of softmax: not in the approximation table

    def __init__(self, embed_dim: int, num_heads: int, *, ngroups: int | None = None, state_size: int | None = None,
                 **options):
        super().__init__(embed_dim, num_heads, **options)
        h = self.num_heads
        self.ngroups = h if ngroups is None else positive_int("ngroups", ngroups)
        self.state_size = self.head_dim if state_size is None else positive_int("state_size", state_size)
        if h % self.ngroups:
            raise ValueError(f"ngroups must divide num_heads (each group of B and C serves num_heads / ngroups heads), "
                             f"got ngroups={self.ngroups} and num_heads={h}")
        if self.grouped_bc and self.conv is not None:  # the short convolution over C, B (per group) and x
            channels = 2 * self.ngroups * self.state_size + self.embed_dim
            self.conv = nn.Conv1d(channels, channels, self.conv_size, groups=channels, bias=False)
        self.dt_proj = nn.Linear(self.embed_dim, h, bias=False)
        self.dt_bias = nn.Parameter(time_step_bias(h))
        self.log_rate = nn.Parameter(torch.empty(h).uniform_(1, 16).log())  # A_h = -exp(log_rate)
        self.skip = nn.Parameter(torch.ones(h))  # D
        self.out_norm = HeadNorm(self.embed_dim, h, gate=True)
        if self.grouped_bc:  # C and B of their own shape, drawn last (as the layer that held it as a step drew them)
            self._project_bc()

    def _project_bc(self) -> None:
        """``q_proj`` and ``k_proj`` to C and B: ``ngroups`` heads of width ``state_size``."""
        if self.num_kv_heads != self.num_heads:
            raise ValueError(f"the {self.name!r} attention's queries and keys are {self.ngroups} heads of width "
                             f"{self.state_size}, its own: it takes no num_kv_heads")
        pe = self.positional
        if pe is not None and pe.kind == "rotation" and self.state_size != self.head_dim:
            raise ValueError(f"the {pe.name!r} encoding rotates the {self.name!r} attention's queries and keys, of "
                             f"width {self.state_size}: it needs them of the head width {self.head_dim}")
        bias = self.q_proj.bias is not None
        self.query_heads = self.ngroups  # C and B come in ngroups heads
        self.q_proj = nn.Linear(self.embed_dim, self.ngroups * self.state_size, bias=bias)
        self.k_proj = nn.Linear(self.embed_dim, self.ngroups * self.state_size, bias=bias)
        init_projections(self.q_proj, self.k_proj)

    @property
    def grouped_bc(self) -> bool:
        """Whether B and C are not the default (one per head, of the head width)."""
        return (self.ngroups, self.state_size) != (self.num_heads, self.head_dim)

    def extra_repr(self) -> str:
        grouped = f", ngroups={self.ngroups}, state_size={self.state_size}" if self.grouped_bc else ""
        return super().extra_repr() + grouped

    def features(self, q, k):
        """Grouped C and B (after the convolution) repeated to the heads: head ``h`` reads group
        ``h // (H / ngroups)``."""
        r = self.num_heads // q.shape[1]
        if r == 1:
            return q, k
        return q.repeat_interleave(r, dim=1), k.repeat_interleave(r, dim=1)

    def gates(self, x):
        dt = F.softplus(upcast(self.dt_proj(x)) + self.dt_bias).transpose(1, 2)  # (B, H, N)
        return -self.log_rate.exp()[:, None] * dt, dt  # log decay dt A, and dt scales the write

    def finish(self, o, x, v):
        return self.out_norm(o + self.skip.to(o.dtype)[:, None, None] * v, x)
