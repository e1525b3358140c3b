"""Gated linear attention and the (gated) delta rule, in their three exact forms.

Causal linear attention is an RNN whose state is a ``D x Dv`` matrix (Katharopoulos et al. 2020);
the models that followed it change only how the state is updated (Yang et al. 2024, "Gated
Delta Networks", table 1). With ``S_0`` the initial state and ``q`` already scaled:

* **gated** (RetNet, GLA, Mamba-2): ``S_t = diag(a_t) S_{t-1} + k_t v_t^T``, where ``a_t =
  exp(g_t)`` is a decay per head (``g`` ``(B, H, N)``: RetNet's fixed one, Mamba-2's
  data-dependent one) or per key channel (``g`` ``(B, H, N, D)``: GLA);
* **delta** (DeltaNet, Gated DeltaNet): ``S_t = a_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t
  v_t^T`` — the state is corrected towards ``v_t`` at key ``k_t`` with learning rate ``beta_t``
  (Schlag et al. 2021; Yang et al. 2024), ``a_t = exp(g_t)`` a scalar decay per head or none;

and the output is ``o_t = S_t^T q_t``. Each has three forms, equal in exact arithmetic:

* ``parallel_*``: the quadratic form, masked attention with the decay as a multiplicative mask,
  ``O = (Q K^T ⊙ M) V`` with ``M_ij = prod_{j < l <= i} a_l`` for ``j <= i`` (the 1-semiseparable
  mask of Mamba-2's state-space duality, Dao & Gu 2024); the delta rule's values are first
  replaced by the pseudo-values ``U = (I + L)^{-1} diag(beta) V`` of a unit lower-triangular
  system (DeltaNet's WY / UT form). O(N^2) time and memory: the float64 reference;
* ``chunk_*``: chunkwise-parallel, for training: the parallel form inside chunks of ``chunk``
  positions and the recurrence across them; O(N C D + N D^2) time, O(N (C + D)) memory;
* ``recurrent_*``: one token at a time, O(D Dv) memory whatever the length: decoding.

Every function takes ``q``, ``k`` ``(B, H, N, D)``, ``v`` ``(B, H, N, Dv)`` and an initial
state ``(B, H, D, Dv)`` or None (zeros), and returns ``(o, final_state)``. Decays are given in
log space (``g <= 0``); cumulative sums of ``g`` are taken inside each chunk, so that only
differences ``G_i - G_j <= 0`` are exponentiated on the paths that can (the scalar decays, the
delta rule); GLA's per-channel decay is factored inside chunks of at most
:data:`CHANNEL_CHUNK` positions, so that no exponent is large.
"""

from __future__ import annotations

from typing import overload

import torch

from ..validate import positive_int

__all__ = ["CHANNEL_CHUNK", "CHUNK", "chunk_delta", "chunk_gated", "parallel_delta", "parallel_gated", "recurrent_delta", "recurrent_gated"]

CHUNK = 64
"""Positions per chunk of the chunkwise form."""

CHANNEL_CHUNK = 16
"""At most this many positions per chunk under a per-channel decay (GLA), whose scores are
factored as ``(q_i e^{G_i}) . (k_j e^{-G_j})`` inside a chunk: float32 overflows when a chunk's
log-decay passes -88, which 16 positions reach only at a mean decay below ``e^-5.5`` a step (fla's
kernels bound it the same way, with sub-chunks of 16)."""


def _check(q, k, v, g=None, beta=None, state=None, *, delta: bool = False) -> None:
    """``ValueError`` naming the shapes when the inputs do not fit together (see the module)."""
    def shape(t):
        return tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__

    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k, v)):
        raise ValueError(f"q, k, v must be (B, H, N, D) tensors, got {shape(q)}, {shape(k)}, {shape(v)}")
    b, h, n, d = q.shape
    if k.shape != q.shape or v.shape[:3] != (b, h, n):
        raise ValueError(f"k must have q's shape (B, H, N, D) = {tuple(q.shape)} and v its (B, H, N), got k {shape(k)}, v {shape(v)}")
    if g is not None and (not isinstance(g, torch.Tensor) or tuple(g.shape) not in ((b, h, n), (b, h, n, d)) or (delta and g.dim() == 4)):
        allowed = f"(B, H, N) = {(b, h, n)}" + ("" if delta else f" or (B, H, N, D) = {(b, h, n, d)}")
        raise ValueError(f"g (the log decay) must have shape {allowed}, got {shape(g)}")
    if delta and (not isinstance(beta, torch.Tensor) or tuple(beta.shape) != (b, h, n)):
        raise ValueError(f"beta must have shape (B, H, N) = {(b, h, n)}, got {shape(beta)}")
    if state is not None and (not isinstance(state, torch.Tensor) or tuple(state.shape) != (b, h, d, v.shape[-1])):
        raise ValueError(f"state must have shape (B, H, D, Dv) = {(b, h, d, v.shape[-1])}, got {shape(state)}")


def _state(q: torch.Tensor, v: torch.Tensor, state: torch.Tensor | None) -> torch.Tensor:
    b, h, _, d = q.shape
    return q.new_zeros(b, h, d, v.shape[-1]) if state is None else state


def _decay_rows(g: torch.Tensor | None, q: torch.Tensor) -> torch.Tensor:
    """``g`` as ``(B, H, N, D)`` (a scalar decay broadcast over the key channels; none: 0)."""
    if g is None:
        return q.new_zeros(()).expand(q.shape)
    return g[..., None].expand(q.shape) if g.dim() == 3 else g


# ---------------------------------------------------------------------------- recurrent forms
def recurrent_gated(q, k, v, g=None, *, state=None):
    """``S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T``, ``o_t = S_t^T q_t``, one token at a time."""
    _check(q, k, v, g, state=state)
    s, gd, outs = _state(q, v, state), _decay_rows(g, q), []
    for t in range(q.shape[2]):
        s = gd[:, :, t, :, None].exp() * s + k[:, :, t, :, None] * v[:, :, t, None, :]
        outs.append((q[:, :, t, None, :] @ s)[:, :, 0])
    return (torch.stack(outs, 2) if outs else v.new_zeros(*q.shape[:3], v.shape[-1])), s


def recurrent_delta(q, k, v, beta, g=None, *, state=None):
    """``S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T``, ``o_t = S_t^T q_t``."""
    _check(q, k, v, g, beta, state, delta=True)
    s, outs = _state(q, v, state), []
    for t in range(q.shape[2]):
        if g is not None:
            s = g[:, :, t, None, None].exp() * s
        kt, bt = k[:, :, t], beta[:, :, t, None]
        u = bt * (v[:, :, t] - (kt[:, :, None, :] @ s)[:, :, 0])  # beta_t (v_t - S^T k_t): the correction
        s = s + kt[..., None] * u[:, :, None, :]
        outs.append((q[:, :, t, None, :] @ s)[:, :, 0])
    return (torch.stack(outs, 2) if outs else v.new_zeros(*q.shape[:3], v.shape[-1])), s


# ---------------------------------------------------------------------------- parallel forms
def _causal(n: int, device, diagonal: int = 0) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool, device=device).tril(diagonal)


def _scalar_mask(g: torch.Tensor | None, n: int, like: torch.Tensor, diagonal: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``M_ij = exp(G_i - G_j)`` for ``j <= i`` (+ ``diagonal``), else 0; and ``exp(G)`` ``(B, H, N)``."""
    causal = _causal(n, like.device, diagonal)
    if g is None:
        return causal.to(like.dtype), like.new_ones(like.shape[:-1])
    big = g.cumsum(-1)
    diff = (big[..., :, None] - big[..., None, :]).masked_fill(~causal, float("-inf"))
    return diff.exp(), big.exp()


def _gated_scores(q, k, g):
    """``(Q K^T ⊙ M)`` of the gated form and ``q ⊙ exp(G)`` (the queries that read the initial state)."""
    n = q.shape[2]
    if g is None or g.dim() == 3:
        mask, decay = _scalar_mask(g, n, q)
        return (q @ k.transpose(-1, -2)) * mask, q * decay[..., None]
    big = g.cumsum(2)  # (B, H, N, D): per channel
    diff = big[:, :, :, None, :] - big[:, :, None, :, :]  # (B, H, N, N, D)
    diff = diff.masked_fill(~_causal(n, q.device)[..., None], float("-inf"))
    return torch.einsum("bhid,bhjd,bhijd->bhij", q, k, diff.exp()), q * big.exp()


def parallel_gated(q, k, v, g=None, *, state=None):
    """The quadratic form of :func:`recurrent_gated`: ``O = (Q K^T ⊙ M) V + (Q ⊙ e^G) S_0``."""
    _check(q, k, v, g, state=state)
    s0 = _state(q, v, state)
    scores, qd = _gated_scores(q, k, g)
    out = scores @ v + qd @ s0
    rows = _decay_rows(g, q)
    total = rows.sum(2)  # (B, H, D): the log-decay of the whole sequence
    tail = (total[:, :, None, :] - rows.cumsum(2)).exp()  # exp(G_N - G_j)
    return out, total.exp()[..., None] * s0 + (k * tail).transpose(-1, -2) @ v


def _pseudo_values(k, v, beta, g, s0):
    """The delta rule's pseudo-values ``U = (I + L)^{-1} diag(beta) (V - diag(e^G) K S_0)``,
    ``L_tj = beta_t e^{G_t - G_j} k_t . k_j`` for ``j < t``; and the inner mask ``exp(G_i - G_j)``."""
    n = k.shape[2]
    strict, decay = _scalar_mask(g, n, k, diagonal=-1)
    lower = beta[..., None] * (k @ k.transpose(-1, -2)) * strict
    eye = torch.eye(n, dtype=k.dtype, device=k.device)
    rhs = beta[..., None] * (v - decay[..., None] * (k @ s0))
    u = torch.linalg.solve_triangular(eye + lower, rhs, upper=False, unitriangular=True)
    return u, decay


def parallel_delta(q, k, v, beta, g=None, *, state=None):
    """The quadratic form of :func:`recurrent_delta`: ``O = (Q K^T ⊙ M) U + diag(e^G) Q S_0``."""
    _check(q, k, v, g, beta, state, delta=True)
    s0 = _state(q, v, state)
    n = q.shape[2]
    u, decay = _pseudo_values(k, v, beta, g, s0)
    mask, _ = _scalar_mask(g, n, q)
    out = ((q @ k.transpose(-1, -2)) * mask) @ u + (q * decay[..., None]) @ s0
    if g is None:
        return out, s0 + k.transpose(-1, -2) @ u
    big = g.cumsum(-1)
    tail = (big[..., -1:] - big).exp()  # exp(G_N - G_j)
    return out, big[..., -1, None, None].exp() * s0 + (k * tail[..., None]).transpose(-1, -2) @ u


# ---------------------------------------------------------------------------- chunkwise forms
@overload
def _chunks(x: torch.Tensor, c: int) -> torch.Tensor: ...
@overload
def _chunks(x: None, c: int) -> None: ...
def _chunks(x: torch.Tensor | None, c: int) -> torch.Tensor | None:
    """``(B, H, N, ...)`` -> ``(B, H, N / C, C, ...)``, zero-padded to a whole number of chunks
    (a zero key, value, decay and beta changes nothing)."""
    if x is None:
        return None
    n = x.shape[2]
    pad = -n % c
    if pad:
        x = torch.cat([x, x.new_zeros(*x.shape[:2], pad, *x.shape[3:])], 2)
    return x.view(*x.shape[:2], (n + pad) // c, c, *x.shape[3:])


def chunk_gated(q, k, v, g=None, *, chunk: int = CHUNK, state=None):
    """:func:`recurrent_gated` chunk by chunk: within each chunk its parallel form (every chunk at
    once), across chunks the recurrence on the chunk-end states."""
    _check(q, k, v, g, state=state)
    n = q.shape[2]
    c = min(positive_int("chunk", chunk), max(n, 1))  # a sequence shorter than a chunk is one chunk of its own length
    if g is not None and g.dim() == 4:  # per channel: e^-G_j within a chunk stays below e^(CHANNEL_CHUNK steps of decay)
        c = min(c, CHANNEL_CHUNK)
    qc, kc, vc = _chunks(q, c), _chunks(k, c), _chunks(v, c)  # (B, H, T, C, D)
    gd = _chunks(_decay_rows(g, q).contiguous(), c).cumsum(3)  # G within each chunk, (B, H, T, C, D)
    if g is None or g.dim() == 3:  # scalar: the mask exp(G_i - G_j) of one channel
        gs = gd[..., 0]
        causal = _causal(c, q.device)
        mask = (gs[..., :, None] - gs[..., None, :]).masked_fill(~causal, float("-inf")).exp()
        intra = ((qc @ kc.transpose(-1, -2)) * mask) @ vc
    else:  # per channel: no mask of one channel; factored at the chunk start, (q e^G_i) . (k e^-G_j)
        scores = (qc * gd.exp()) @ (kc * (-gd).exp()).transpose(-1, -2)
        intra = scores.masked_fill(~_causal(c, q.device), 0.0) @ vc
    last = gd[..., -1:, :]  # (B, H, T, 1, D): the chunk's total log-decay
    writes = (kc * (last - gd).exp()).transpose(-1, -2) @ vc  # (B, H, T, D, Dv): what each chunk adds
    carry = last[..., 0, :, None].exp()  # (B, H, T, D, 1)
    starts, s = _scan(_state(q, v, state), carry, writes)
    inter = (qc * gd.exp()) @ starts
    out = (intra + inter).flatten(2, 3)[:, :, :n]
    return out, s


def _scan(s, carry, writes):
    """``S_{t+1} = carry_t ⊙ S_t + writes_t`` over the chunks: the states entering each chunk
    ``(B, H, T, D, Dv)`` and the last. One fused op per chunk on ``(B H, D, Dv)`` views, the
    chunks unbound once (a slice per step would give autograd a full-size zero tensor per step)."""
    b, h = s.shape[:2]
    flat = lambda x: x.flatten(0, 1)  # noqa: E731
    s, starts = flat(s), []
    for cr, wr in zip(flat(carry).unbind(1), flat(writes).unbind(1)):
        starts.append(s)
        s = torch.addcmul(wr, cr, s)
    return torch.stack(starts, 1).unflatten(0, (b, h)), s.unflatten(0, (b, h))


def chunk_delta(q, k, v, beta, g=None, *, chunk: int = CHUNK, state=None):
    """:func:`recurrent_delta` chunk by chunk: the pseudo-values of every chunk at once from its
    WY form (a unit-triangular solve per chunk), then the recurrence on the chunk-end states, which
    corrects each chunk's pseudo-values for the state it starts from."""
    _check(q, k, v, g, beta, state, delta=True)
    n = q.shape[2]
    c = min(positive_int("chunk", chunk), max(n, 1))  # a sequence shorter than a chunk is one chunk of its own length
    qc, kc, vc, bc = _chunks(q, c), _chunks(k, c), _chunks(v, c), _chunks(beta, c)
    gc = None if g is None else _chunks(g, c)
    strict, decay = _scalar_mask(gc, c, kc, diagonal=-1)  # per chunk
    mask, _ = _scalar_mask(gc, c, qc)
    eye = torch.eye(c, dtype=q.dtype, device=q.device)
    system = eye + bc[..., None] * (kc @ kc.transpose(-1, -2)) * strict
    # U = T beta V and W = T beta e^G K: the chunk's pseudo-values from a zero state, and how they
    # move with the state it starts from (U_c = U - W S_c)
    solved = torch.linalg.solve_triangular(system, torch.cat([bc[..., None] * vc, (bc * decay)[..., None] * kc], -1),
                                           upper=False, unitriangular=True)
    u0, w = solved.split([v.shape[-1], k.shape[-1]], -1)
    scores = (qc @ kc.transpose(-1, -2)) * mask  # (B, H, T, C, C)
    qd = qc * decay[..., None]
    if gc is None:
        tail, carry = torch.ones_like(decay), None
    else:
        big = gc.cumsum(-1)
        tail, carry = (big[..., -1:] - big).exp(), big[..., -1].exp()  # exp(G_C - G_j), exp(G_C)
    kt = (kc * tail[..., None]).transpose(-1, -2)  # (B, H, T, D, C)
    # the state entering the next chunk is affine in the state entering this one:
    # S_{c+1} = carry_c S_c + K~_c^T (U_c - W_c S_c) = A_c S_c + B_c, with A_c = carry_c I - K~_c^T W_c
    # and B_c = K~_c^T U_c for every chunk at once; the sequential part is one product per chunk
    eye_d = torch.eye(k.shape[-1], dtype=q.dtype, device=q.device)
    step = (eye_d if carry is None else carry[..., None, None] * eye_d) - kt @ w  # (B, H, T, D, D)
    shift = kt @ u0  # (B, H, T, D, Dv)
    b, h = q.shape[:2]
    s, starts = _state(q, v, state).flatten(0, 1), []
    for a_t, b_t in zip(step.flatten(0, 1).unbind(1), shift.flatten(0, 1).unbind(1)):
        starts.append(s)
        s = torch.baddbmm(b_t, a_t, s)
    starts_t = torch.stack(starts, 1).unflatten(0, (b, h))  # (B, H, T, D, Dv): the state entering each chunk
    out = qd @ starts_t + scores @ (u0 - w @ starts_t)
    return out.flatten(2, 3)[:, :, :n], s.unflatten(0, (b, h))
