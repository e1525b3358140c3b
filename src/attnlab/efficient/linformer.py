"""Linformer: keys and values projected along the sequence to k rows (Wang et al. 2020)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..validate import is_int, positive_int
from .base import Budget, EfficientStep, Sweep, register

__all__ = ["LinformerAttention"]


@register("linformer")
class LinformerAttention(EfficientStep):
    """``softmax(Q (E K)^T / sqrt(D)) (F V)`` with learned ``E, F`` of shape ``(k, max_len)``.

    Wang et al. 2020 (https://arxiv.org/abs/2006.04768): the N x N attention matrix is close to
    low rank, so projecting the N keys and values to k rows costs O(N k). ``E`` and ``F`` are
    shared by the heads (the paper's "headwise sharing"). A sequence shorter than ``max_len``
    uses the first columns of ``E`` and ``F``; a longer one cannot be projected and raises.
    Padded keys are zeroed before the projection, and a projected row that draws only on
    padded positions is masked (with identity projections, exactly the padded keys). Not causal (each projected row
    mixes all positions). With ``k = max_len = N`` and ``E = F = I`` it is exact attention.

    Args:
        embed_dim, num_heads: see :class:`attnlab.efficient.EfficientStep`.
        max_len: the longest sequence (required).
        k: the projected length (default 256, at most ``max_len``).
        share_kv: one projection for keys and values (``F = E``).
    """

    budget = Budget(short={"k": 16}, long={"k": 256}, sweep=Sweep("k", (32, 128, 512, 1024), "k (random E, F)"),
                    max_len=True)

    capabilities = EfficientStep.capabilities.with_changes(causal=None, family="low rank")

    def __init__(self, embed_dim: int, num_heads: int, *, max_len: int | None = None, k: int = 256,
                 share_kv: bool = False, **options):
        # None is not an int either: testing it first tells mypy
        if max_len is None or not is_int(max_len) or max_len < 1:
            raise ValueError("linformer projects sequences of a fixed maximum length: pass max_len (a positive int), "
                             f"got {max_len!r}")
        positive_int("k", k)
        super().__init__(embed_dim, num_heads, **options)
        self.max_len, self.k = max_len, min(k, max_len)
        self.proj_k = nn.Parameter(torch.empty(self.k, max_len))
        self.proj_v = self.proj_k if share_kv else nn.Parameter(torch.empty(self.k, max_len))
        for p in {id(self.proj_k): self.proj_k, id(self.proj_v): self.proj_v}.values():
            nn.init.normal_(p, std=self.k**-0.5)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, max_len={self.max_len}, k={self.k}"

    def compute(self, q, k, v, valid):
        m = k.shape[2]
        if m > self.max_len:
            raise ValueError(f"linformer was built for sequences up to max_len={self.max_len}, got {m} keys")
        ek, fv = self.proj_k[:, :m].to(k.dtype), self.proj_v[:, :m].to(v.dtype)  # (k, M)
        kp = ek @ k  # (B, H, k, D): E K
        vp = fv @ v  # (B, H, k, Dv): F V
        mask = None
        if valid is not None:
            # a projected row drawn only from padded positions is itself padding
            mask = (valid.to(ek.dtype) @ ek.abs().T > 0)[:, None, None, :]  # (B, 1, 1, k)
            mask = mask | ~mask.any(-1, keepdim=True)  # no real row at all: the caller zeroes the output
        return F.scaled_dot_product_attention(q, kp, vp, attn_mask=mask)
