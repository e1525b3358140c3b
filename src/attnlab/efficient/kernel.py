"""Kernelised attention: softmax's exp(q . k) replaced by a feature-map product phi(q) . phi(k).

Shared by :mod:`attnlab.efficient.linear` (phi = elu + 1) and :mod:`attnlab.efficient.performer`
(FAVOR+ random features). Non-causal, the key-value summary ``S = sum_j phi(k_j) v_j^T`` is
computed once; causal, it is a running sum, computed chunk by chunk so that memory stays
O(N x chunk + N x D) instead of the O(N x D x Dv) of a naive cumulative sum.
"""

from __future__ import annotations

import torch

__all__ = ["kernel_attention", "CAUSAL_CHUNK"]

CAUSAL_CHUNK = 128
"""Positions per chunk of the causal running sum."""


def kernel_attention(
    phi_q: torch.Tensor,
    phi_k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    eps: float = 1e-6,
    chunk: int = CAUSAL_CHUNK,
) -> torch.Tensor:
    """``b_i = phi(q_i)^T S_i / (phi(q_i)^T z_i)`` with ``S_i = sum_j phi(k_j) v_j^T``, ``z_i = sum_j phi(k_j)``.

    Sums over all ``j`` (non-causal) or ``j <= i`` (causal). Padded keys must already have
    ``phi(k_j) = 0``.

    Args:
        phi_q: ``(B, H, N, F)`` non-negative features of the queries.
        phi_k: ``(B, H, M, F)`` of the keys.
        v: ``(B, H, M, Dv)``.
        causal: running sums (N = M).
        eps: added to the denominator.
        chunk: positions per chunk of the causal computation.
    """
    if not causal:
        # S and z in one product: phi(K)^T [V, 1]; then numerator and denominator in one more
        v1 = torch.cat([v, v.new_ones(*v.shape[:-1], 1)], dim=-1)  # (B, H, M, Dv + 1)
        kvz = phi_k.transpose(-2, -1) @ v1  # (B, H, F, Dv + 1): [S, z]
        out = phi_q @ kvz  # (B, H, N, Dv + 1)
        return out[..., :-1] / (out[..., -1:] + eps)
    b, h, n, f = phi_q.shape
    kv = phi_q.new_zeros(b, h, f, v.shape[-1])  # the running S
    z = phi_q.new_zeros(b, h, f)  # the running z
    tri = torch.ones(chunk, chunk, dtype=torch.bool, device=phi_q.device).tril()
    outs = []
    for a in range(0, n, chunk):
        e = min(a + chunk, n)
        qc, kc, vc = phi_q[:, :, a:e], phi_k[:, :, a:e], v[:, :, a:e]
        inner = (qc @ kc.transpose(-2, -1)).masked_fill(~tri[: e - a, : e - a], 0.0)  # (B, H, c, c), j <= i in chunk
        num = qc @ kv + inner @ vc
        den = (qc * z[..., None, :]).sum(-1, keepdim=True) + inner.sum(-1, keepdim=True)
        outs.append(num / (den + eps))
        kv = kv + kc.transpose(-2, -1) @ vc
        z = z + kc.sum(-2)
    return torch.cat(outs, dim=-2)
