"""The textbook steps of self-attention in float64, one query at a time.

This is the yardstick every fast path is tested against, and what ``attnlab explain`` prints.
It follows the lecture notes (Hung-yi Lee, "Self-attention", 2021) literally:

1. ``q^i = W^q a^i``, ``k^i = W^k a^i``, ``v^i = W^v a^i``      (:func:`project`)
2. ``alpha_{i,j} = score(q^i, k^j)``  (+ ``bias_{i,j}``)        (:func:`score_row`)
3. ``alpha'_{i,j} = norm_j(alpha_{i,j})`` over the allowed ``j``  (:func:`normalize_row`)
4. ``b^i = sum_j alpha'_{i,j} v^j``                              (:func:`reference_attention`)

It is deliberately slow and plain: Python loops over batch, head and query, each step a
separate line, everything cast to float64. Nothing here calls ``attnlab.core.attend``.
"""

from __future__ import annotations

import math

import torch

from .scores import COSINE_EPS, Additive, Bilinear, CallableScore, Cosine, Dot, ScaledDot, Score, resolve_score

__all__ = ["project", "score_row", "normalize_row", "reference_attention", "F64"]

F64 = torch.float64


def project(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Step 1: ``x^i = W a^i`` for every row ``a^i`` of ``a`` ``(N, d_in)``, with ``W`` ``(d_out, d_in)``."""
    a, w = a.to(F64), w.to(F64)
    return torch.stack([w @ a[i] for i in range(a.shape[0])]) if a.shape[0] else a.new_zeros(0, w.shape[0])


def score_row(score, q_i: torch.Tensor, keys: torch.Tensor, head: int = 0) -> torch.Tensor:
    """Step 2: ``alpha_{i,j} = score(q^i, k^j)`` for one query ``q_i`` ``(D,)`` and keys ``(M, D)``.

    ``score`` is a name or a :class:`Score`; learnable scores use their (float64-cast) weights
    of head ``head``.
    """
    s = resolve_score(score) if not isinstance(score, Score) else score
    q_i, keys = q_i.to(F64), keys.to(F64)
    if isinstance(s, ScaledDot):
        return (keys @ q_i) / math.sqrt(q_i.shape[0])
    if isinstance(s, Dot):
        return keys @ q_i
    if isinstance(s, Cosine):
        tau = s.temperature.to(F64).reshape(-1)
        tau = tau[head] if tau.numel() > 1 else tau[0]
        qn = torch.linalg.vector_norm(q_i).clamp_min(COSINE_EPS)
        kn = torch.linalg.vector_norm(keys, dim=-1).clamp_min(COSINE_EPS)
        return (keys @ q_i) / (qn * kn) / tau
    if isinstance(s, Additive):
        h = head if s.w_q.shape[0] > 1 else 0
        w_q, w_k, v = s.w_q[h].to(F64), s.w_k[h].to(F64), s.v[h, :, 0].to(F64)  # (D, A), (D, A), (A,)
        return torch.stack([v @ torch.tanh(w_q.T @ q_i + w_k.T @ keys[j]) for j in range(keys.shape[0])])
    if isinstance(s, Bilinear):
        w = s.weight[head if s.weight.shape[0] > 1 else 0].to(F64)  # (D, D_k)
        return torch.stack([q_i @ w @ keys[j] for j in range(keys.shape[0])])
    if isinstance(s, CallableScore):
        return s.fn(q_i[None, None, None, :], keys[None, None])[0, 0, 0]
    return s(q_i[None, None, None, :], keys[None, None])[0, 0, 0]


def normalize_row(normalize, scores: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Step 3: weights of one row from its scores ``(M,)`` and its allowed keys (bool ``(M,)``).

    A row with no allowed key gets all zeros.
    """
    out = torch.zeros_like(scores, dtype=F64)
    idx = allowed.nonzero().flatten()
    if idx.numel() == 0:
        return out
    s = scores.to(F64)[idx]
    count = idx.numel()
    if normalize == "softmax":
        e = torch.exp(s - s.max().detach())
        w = e / e.sum()
    elif normalize == "relu":
        w = torch.clamp(s, min=0) / count
    elif normalize == "sigmoid":
        w = 1.0 / (1.0 + torch.exp(-(s - math.log(count))))
    else:
        raise ValueError(f"the reference knows softmax, relu and sigmoid, got {normalize!r}")
    return out.index_put((idx,), w)


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    score="scaled_dot",
    normalize: str = "softmax",
    mask=None,
    bias: torch.Tensor | None = None,
    score_mod=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps 2-4 in float64 for ``q`` ``(B, H, N, D)``, ``k`` ``(B, H, M, D)``, ``v`` ``(B, H, M, Dv)``.

    ``mask``: a bool tensor, or a mask function (made dense here, pair by pair);
    ``score_mod``: a score function ``(score, b, h, q_idx, kv_idx)``, applied to each row of
    scores. Returns ``(output (B, H, N, Dv), weights (B, H, N, M))``, both float64;
    differentiable with respect to q, k, v and the score's weights.
    """
    q, k, v = q.to(F64), k.to(F64), v.to(F64)
    b, h, n, _ = q.shape
    m, dv = k.shape[2], v.shape[3]
    if k.shape[1] != h:  # grouped keys / values: key head g serves query heads g H/G .. (g+1) H/G - 1
        k, v = k.repeat_interleave(h // k.shape[1], 1), v.repeat_interleave(h // k.shape[1], 1)
    if mask is not None and not isinstance(mask, torch.Tensor):
        from .blockmap import BlockMap
        from .maskfn import as_mask

        fn = mask.mask if isinstance(mask, BlockMap) else as_mask(mask)
        mask = fn.dense(n, m, batch=b, heads=h)
        mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    allowed = torch.ones(b, h, n, m, dtype=torch.bool) if mask is None else mask.cpu().expand(b, h, n, m)
    bias = None if bias is None else bias.to(F64).expand(b, h, n, m)
    outputs, weights = [], []
    for bi in range(b):
        for hi in range(h):
            for i in range(n):
                alpha = score_row(score, q[bi, hi, i], k[bi, hi], head=hi) if m else q.new_zeros(0)
                if bias is not None:
                    alpha = alpha + bias[bi, hi, i]
                if score_mod is not None and m:
                    alpha = score_mod(alpha, torch.tensor(bi), torch.tensor(hi), torch.tensor(i),
                                      torch.arange(m)).to(F64)
                alpha_prime = normalize_row(normalize, alpha, allowed[bi, hi, i])
                b_i = v.new_zeros(dv)
                for j in range(m):
                    if allowed[bi, hi, i, j]:  # a masked-out value never enters the sum
                        b_i = b_i + alpha_prime[j] * v[bi, hi, j]
                outputs.append(b_i)
                weights.append(alpha_prime)
    out = torch.stack(outputs).reshape(b, h, n, dv) if outputs else v.new_zeros(b, h, n, dv)
    w = torch.stack(weights).reshape(b, h, n, m) if weights else q.new_zeros(b, h, n, m)
    return out, w
