"""Kernelised attention: softmax's exp(q . k) replaced by a feature-map product phi(q) . phi(k).

Shared by :mod:`attnlab.efficient.linear` (phi = elu + 1) and :mod:`attnlab.efficient.performer`
(FAVOR+ random features). Non-causal, the key-value summary ``S = sum_j phi(k_j) v_j^T`` is
computed once; causal, it is a running sum, computed chunk by chunk so that memory stays
O(N x chunk + N x D) instead of the O(N x D x Dv) of a naive cumulative sum.
"""

from __future__ import annotations

import torch

from ..core.amp import same_autocast_backward, same_autocast_forward

__all__ = ["kernel_attention", "chunked_kernel_attention", "FeatureMap", "CAUSAL_CHUNK"]

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
    clamp: bool = False,
    state: tuple[torch.Tensor, torch.Tensor] | None = None,
    return_state: bool = False,
):
    """``b_i = phi(q_i)^T S_i / (phi(q_i)^T z_i)`` with ``S_i = sum_j phi(k_j) v_j^T``, ``z_i = sum_j phi(k_j)``.

    Sums over all ``j`` (non-causal) or ``j <= i`` (causal). Padded keys must already have
    ``phi(k_j) = 0``.

    Args:
        phi_q: ``(B, H, N, F)`` non-negative features of the queries.
        phi_k: ``(B, H, M, F)`` of the keys.
        v: ``(B, H, M, Dv)``.
        causal: running sums (N = M).
        eps: added to the denominator (``clamp``: its floor instead, so that a constant factor
            in the keys' features cancels exactly).
        chunk: positions per chunk of the causal computation.
        state: causal: the sums ``(S, z)`` ``(B, H, F, Dv)``, ``(B, H, F)`` of earlier tokens
            (decoding with a :class:`attnlab.layers.cache.RecurrentState`); None: none.
        return_state: causal: also return the sums after the last token, ``(out, (S, z))``.
    """
    fix = (lambda d: d.clamp_min(eps)) if clamp else (lambda d: d + eps)
    if not causal:
        # S and z in one product: phi(K)^T [V, 1]; then numerator and denominator in one more
        v1 = torch.cat([v, v.new_ones(*v.shape[:-1], 1)], dim=-1)  # (B, H, M, Dv + 1)
        kvz = phi_k.transpose(-2, -1) @ v1  # (B, H, F, Dv + 1): [S, z]
        out = phi_q @ kvz  # (B, H, N, Dv + 1)
        return out[..., :-1] / fix(out[..., -1:])
    b, h, n, f = phi_q.shape
    if state is None:
        kv = phi_q.new_zeros(b, h, f, v.shape[-1])  # the running S
        z = phi_q.new_zeros(b, h, f)  # the running z
    else:
        kv, z = state
    tri = torch.ones(chunk, chunk, dtype=torch.bool, device=phi_q.device).tril()
    outs = []
    for a in range(0, n, chunk):
        e = min(a + chunk, n)
        qc, kc, vc = phi_q[:, :, a:e], phi_k[:, :, a:e], v[:, :, a:e]
        inner = (qc @ kc.transpose(-2, -1)).masked_fill(~tri[: e - a, : e - a], 0.0)  # (B, H, c, c), j <= i in chunk
        num = qc @ kv + inner @ vc
        den = (qc * z[..., None, :]).sum(-1, keepdim=True) + inner.sum(-1, keepdim=True)
        outs.append(num / fix(den))
        kv = kv + kc.transpose(-2, -1) @ vc
        z = z + kc.sum(-2)
    out = torch.cat(outs, dim=-2) if outs else phi_q.new_zeros(b, h, 0, v.shape[-1])
    return (out, (kv, z)) if return_state else out


class FeatureMap:
    """A feature map for :func:`chunked_kernel_attention`.

    ``query(x)`` gives the features of a chunk of queries. Keys: a map whose features are
    ``exp(logits)`` (FAVOR+) defines ``key_logits(x)``; the keys' features are then
    ``exp(logits - shift)`` with one shift per head, kept at the running maximum so nothing
    overflows (it cancels in the normalisation); a direct map (elu + 1) defines ``key(x)``.
    """

    exponential: bool = False

    def query(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def key(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def key_logits(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


def _key_features(fmap: FeatureMap, kc, shift):
    return torch.exp(fmap.key_logits(kc) - shift).to(kc.dtype) if fmap.exponential else fmap.key(kc)


class _ChunkedKernel(torch.autograd.Function):
    """Non-causal kernel attention over chunks of ``chunk`` rows, forward and backward.

    Only the ``(F, Dv + 1)`` summary ``[S, z]`` and the output are kept; the ``(N, F)``
    features are recomputed chunk by chunk in the backward pass, so the working set stays
    cache-sized however long the sequence.
    """

    @staticmethod
    @same_autocast_forward
    def forward(ctx, fmap, chunk, eps, valid, q, k, v):
        b, h, m, dv = v.shape
        kvz, shift = None, None
        with torch.no_grad():
            for a in range(0, m, chunk):
                kc = k[:, :, a : a + chunk]
                v1 = torch.cat([v[:, :, a : a + chunk], v.new_ones(b, h, kc.shape[2], 1)], dim=-1)
                if fmap.exponential:  # running max of the logits, as online softmax does
                    logits = fmap.key_logits(kc)
                    new = logits.amax(dim=(-2, -1), keepdim=True)
                    new = new if shift is None else torch.maximum(shift, new)
                    pk = torch.exp(logits - new).to(v.dtype)
                    if kvz is not None:
                        kvz = kvz * torch.exp(shift - new)
                    shift = new
                else:
                    pk = fmap.key(kc)
                if valid is not None:
                    pk = pk * valid[:, None, a : a + chunk, None].to(pk.dtype)
                part = pk.transpose(-2, -1) @ v1  # (B, H, F, Dv + 1)
                kvz = part if kvz is None else kvz + part
            out = torch.empty(*q.shape[:-1], dv, dtype=v.dtype, device=v.device)
            for a in range(0, q.shape[2], chunk):
                o = fmap.query(q[:, :, a : a + chunk]) @ kvz
                out[:, :, a : a + chunk] = o[..., :-1] / (o[..., -1:] + eps)
        ctx.fmap, ctx.chunk, ctx.eps, ctx.valid, ctx.shift = fmap, chunk, eps, valid, shift
        ctx.save_for_backward(q, k, v, kvz, out)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    @same_autocast_backward
    def backward(ctx, grad_out):
        q, k, v, kvz, out = ctx.saved_tensors
        fmap, chunk, eps, valid, shift = ctx.fmap, ctx.chunk, ctx.eps, ctx.valid, ctx.shift
        b, h, m, dv = v.shape
        dq = torch.empty_like(q)
        dkvz = torch.zeros_like(kvz)
        for a in range(0, q.shape[2], chunk):
            with torch.enable_grad():
                qc = q[:, :, a : a + chunk].detach().requires_grad_(True)
                pq = fmap.query(qc)
                den = pq.detach() @ kvz[..., -1:] + eps  # (B, H, c, 1)
                g_num = grad_out[:, :, a : a + chunk] / den
                g_den = -(g_num * out[:, :, a : a + chunk]).sum(-1, keepdim=True)
                g_o = torch.cat([g_num, g_den], dim=-1)  # d loss / d [num, den]: (B, H, c, Dv + 1)
                dkvz += pq.detach().transpose(-2, -1) @ g_o
                dq[:, :, a : a + chunk] = torch.autograd.grad(pq, qc, g_o @ kvz.transpose(-2, -1))[0]
        dk, dv_ = torch.empty_like(k), torch.empty_like(v)
        for a in range(0, m, chunk):
            with torch.enable_grad():
                kc = k[:, :, a : a + chunk].detach().requires_grad_(True)
                pk = _key_features(fmap, kc, shift)
                if valid is not None:
                    pk = pk * valid[:, None, a : a + chunk, None].to(pk.dtype)
                v1 = torch.cat([v[:, :, a : a + chunk], v.new_ones(b, h, kc.shape[2], 1)], dim=-1)
                dv_[:, :, a : a + chunk] = pk.detach() @ dkvz[..., :-1]
                dk[:, :, a : a + chunk] = torch.autograd.grad(pk, kc, v1 @ dkvz.transpose(-2, -1))[0]
        return None, None, None, None, dq, dk, dv_


def chunked_kernel_attention(
    fmap: FeatureMap,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    valid: torch.Tensor | None = None,
    eps: float = 1e-6,
    chunk: int = 1024,
) -> torch.Tensor:
    """Non-causal :func:`kernel_attention` with the feature map applied chunk by chunk.

    Same result, forward and backward, as materialising ``phi(Q)`` and ``phi(K)``; but no
    ``(N, F)`` feature tensor is ever whole, so time stays linear in N once the features no
    longer fit in the cache.

    Args:
        fmap: the :class:`FeatureMap`.
        q: ``(B, H, N, D)``; k: ``(B, H, M, D)``; v: ``(B, H, M, Dv)``.
        valid: ``(B, M)`` bool, False for padded keys (their features are zeroed).
        eps: added to the normaliser.
        chunk: rows per chunk.
    """
    return _ChunkedKernel.apply(fmap, chunk, eps, valid, q, k, v)
