"""Gated linear attention and the (gated) delta rule, in their three exact forms.

Causal linear attention is an RNN whose state is a ``D x Dv`` matrix (Katharopoulos et al. 2020);
the models that followed it change only how the state is updated (Yang et al. 2024, "Gated
Delta Networks", table 1). With ``S_0`` the initial state and ``q`` already scaled:

* **gated** (RetNet, GLA, Mamba-2): ``S_t = diag(a_t) S_{t-1} + k_t v_t^T``, where ``a_t =
  exp(g_t)`` is a decay per head (``g`` ``(B, H, N)``: RetNet's fixed one, Mamba-2's
  data-dependent one) or per key channel (``g`` ``(B, H, N, D)``: GLA);
* **delta** (DeltaNet, Gated DeltaNet, KDA): ``S_t = diag(a_t) (I - beta_t k_t k_t^T) S_{t-1} +
  beta_t k_t v_t^T`` — the state is corrected towards ``v_t`` at key ``k_t`` with learning rate
  ``beta_t`` (Schlag et al. 2021; Yang et al. 2024), ``a_t = exp(g_t)`` a decay per head (Gated
  DeltaNet), per key channel (Kimi Delta Attention, Kimi Team 2025) or none; with a read key ``p_t`` (``read=``;
  Comba, Hu et al. 2025) the state is corrected at ``k_t`` from what it reads at ``p_t``,
  ``S_t = S' + beta_t k_t (v_t - S'^T p_t)^T`` with ``S' = diag(a_t) S_{t-1}`` (``p_t = k_t``: the delta rule);

and the output is ``o_t = S_t^T q_t``. Each has three forms, equal in exact arithmetic:

* ``parallel_*``: the quadratic form, masked attention with the decay as a multiplicative mask, ``O = (Q K^T ⊙ M) V``
  with ``M_ij = prod_{j < l <= i} a_l`` for ``j <= i`` (the 1-semiseparable mask of Mamba-2's state-space duality, Dao &
  Gu 2024); the delta rule's values are first replaced by the pseudo-values ``U = (I + L)^{-1} diag(beta) V`` of a unit
  lower-triangular system (DeltaNet's WY / UT form). O(N^2) time and memory: the float64 reference;
* ``chunk_*``: chunkwise-parallel, for training: the parallel form inside chunks of ``chunk`` positions and the
  recurrence across them; O(N C D + N D^2) time; in segments of ``segment`` positions (see memory, below);
* ``recurrent_*``: one token at a time, O(D Dv) memory whatever the length: decoding.

Every function takes ``q``, ``k`` ``(B, H, N, D)``, ``v`` ``(B, H, N, Dv)`` and an initial state ``(B, H, D, Dv)`` or
None (zeros), and returns ``(o, final_state)``. Decays are given in log space (``g <= 0``); cumulative sums of ``g`` are
taken inside each chunk, so that only differences ``G_i - G_j <= 0`` are exponentiated on the paths that can (the scalar
decays, the delta rule, KDA's per-channel decay); GLA's per-channel decay is factored inside chunks of at most
:data:`CHANNEL_CHUNK` positions, so that no exponent is large.

**Packed documents.** The chunkwise forms take ``cu_seqlens`` (``(S + 1,)`` offsets of ``S`` documents laid end to end
in a batch of one, as flash-attention and fla take them): no state crosses a boundary. Each document is laid out from a
chunk boundary (its last chunk padded with zeros, which change nothing), the chunks of every document are computed at
once, and the scan over chunks starts each document from its own initial state: no Python loop per document. The state
given and returned is then one per document, ``(S, H, D, Dv)``.

**Memory.** Autograd would keep every chunk's products for the backward, O(N (C + D)) per head with a large constant (a
(C, C) score and decay and several (C, D) and (D, Dv) tensors per chunk). The chunkwise forms therefore run in segments
of :data:`~attnlab.efficient.chunking.SEGMENT` positions (``segment=``; :func:`~attnlab.efficient.chunking.segmented`),
each starting from the state the previous one ends in and, under autograd, a non-reentrant checkpoint: the backward
keeps the ``D x Dv`` state entering each segment and computes one segment's chunks again at a time (as fla's kernels
keep the states at chunk boundaries); the scan across chunks is one autograd node
(:func:`~attnlab.efficient.chunking.linear_scan`). The price is one more forward of the chunks (none for a sequence of
one segment); ``segment=None`` keeps everything. Peak memory before and after: ``benchmarks/results/segments-*``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..validate import positive_int
from . import fla_ops
from .chunking import SEGMENT, ChunkLayout, segmented

__all__ = ["CHANNEL_CHUNK", "CHUNK", "causal_conv", "chunk_delta", "chunk_gated", "chunk_length", "delta_token",
           "gated_token", "parallel_delta", "parallel_gated", "recurrent_delta", "recurrent_gated"]

CHUNK = 64
"""Positions per chunk of the chunkwise form."""

CHANNEL_CHUNK = 16
"""At most this many positions per chunk under a per-channel decay (GLA), whose scores are
factored as ``(q_i e^{G_i}) . (k_j e^{-G_j})`` inside a chunk: float32 overflows when a chunk's
log-decay passes -88, which 16 positions reach only at a mean decay below ``e^-5.5`` a step (fla's
kernels bound it the same way, with sub-chunks of 16)."""

def _check(q, k, v, g=None, beta=None, state=None, *, delta: bool = False, cu_seqlens=None, read=None) -> None:
    """``ValueError`` naming the shapes when the inputs do not fit together (see the module)."""
    def shape(t):
        return tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__

    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k, v)):
        raise ValueError(f"q, k, v must be (B, H, N, D) tensors, got {shape(q)}, {shape(k)}, {shape(v)}")
    b, h, n, d = q.shape
    if k.shape != q.shape or v.shape[:3] != (b, h, n):
        raise ValueError(f"k must have q's shape (B, H, N, D) = {tuple(q.shape)} and v its (B, H, N), got k "
                         f"{shape(k)}, v {shape(v)}")
    if g is not None and (not isinstance(g, torch.Tensor) or tuple(g.shape) not in ((b, h, n), (b, h, n, d))):
        raise ValueError(f"g (the log decay) must have shape (B, H, N) = {(b, h, n)} or (B, H, N, D) = {(b, h, n, d)}, "
                         f"got {shape(g)}")
    if delta and (not isinstance(beta, torch.Tensor) or tuple(beta.shape) != (b, h, n)):
        raise ValueError(f"beta must have shape (B, H, N) = {(b, h, n)}, got {shape(beta)}")
    if read is not None and (not isinstance(read, torch.Tensor) or read.shape != k.shape):
        raise ValueError(f"read (the read key) must have k's shape (B, H, N, D) = {tuple(k.shape)}, got {shape(read)}")
    if cu_seqlens is None:
        if state is not None and (not isinstance(state, torch.Tensor) or tuple(state.shape) != (b, h, d, v.shape[-1])):
            raise ValueError(f"state must have shape (B, H, D, Dv) = {(b, h, d, v.shape[-1])}, got {shape(state)}")
        return
    docs = _check_offsets(cu_seqlens, b, n)
    if state is not None and (not isinstance(state, torch.Tensor) or tuple(state.shape) != (docs, h, d, v.shape[-1])):
        raise ValueError(f"with cu_seqlens, state must have shape (S, H, D, Dv) = {(docs, h, d, v.shape[-1])}, "
                         f"one per document, got {shape(state)}")


def _check_offsets(cu_seqlens, b: int, n: int) -> int:
    """The number of documents ``cu_seqlens`` describes; ``ValueError`` unless it is a 1-D integer
    tensor rising from 0 to N over a batch of one."""
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2 \
            or cu_seqlens.is_floating_point() or cu_seqlens.dtype == torch.bool:
        raise ValueError(f"cu_seqlens must be a 1-D integer tensor of S + 1 offsets, got {cu_seqlens!r}")
    if b != 1:
        raise ValueError(f"packed documents (cu_seqlens) lie end to end in a batch of one, got a batch of {b}")
    if int(cu_seqlens[0]) != 0 or int(cu_seqlens[-1]) != n or bool((cu_seqlens.diff() < 0).any()):
        raise ValueError(f"cu_seqlens must rise from 0 to the sequence length {n}, got {cu_seqlens.tolist()}")
    return cu_seqlens.numel() - 1


def _one_token(t):
    """A decoding step's ``(B, H, ...)`` input as a sequence of one token, ``(B, H, 1, ...)``, for
    :func:`_check` (anything else is left for it to name)."""
    return t.unsqueeze(2) if isinstance(t, torch.Tensor) and t.dim() >= 2 else t


def _needed(s):
    if not isinstance(s, torch.Tensor):
        raise ValueError(f"a decoding step needs the state (B, H, D, Dv), got {type(s).__name__}")
    return s


def _initial(state: torch.Tensor | None, q: torch.Tensor, v: torch.Tensor,
             cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
    """The initial state(s): the one given, or zeros (one per document when packed)."""
    if state is not None:
        return state
    rows = q.shape[0] if cu_seqlens is None else cu_seqlens.numel() - 1
    return q.new_zeros(rows, q.shape[1], q.shape[-1], v.shape[-1])


def _decay_rows(g: torch.Tensor | None, q: torch.Tensor) -> torch.Tensor:
    """``g`` as ``(B, H, N, D)`` (a scalar decay broadcast over the key channels; none: 0)."""
    if g is None:
        return q.new_zeros(()).expand(q.shape)
    return g[..., None].expand(q.shape) if g.dim() == 3 else g


def _as_rows(cum_log_decay: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """A cumulative log decay as rows that broadcast against ``like`` ``(..., N, D)``: ``(..., N, 1)``
    per head, ``(..., N, D)`` per channel, zeros when there is none."""
    if cum_log_decay is None:
        return like.new_zeros(like.shape[:-1] + (1,))
    return cum_log_decay[..., None] if cum_log_decay.dim() == like.dim() - 1 else cum_log_decay


def _products(a: torch.Tensor, b: torch.Tensor, cum_log_decay: torch.Tensor | None, diagonal: int = 0,
              decay: torch.Tensor | None = None) -> torch.Tensor:
    """``P_ij = sum_d a_id b_jd exp(G_id - G_jd)`` for ``j <= i + diagonal`` (``diagonal`` 0 or -1), else 0, over the
    last two dimensions; ``cum_log_decay`` the cumulative log decay ``G``, ``(..., N)`` per head, ``(..., N, D)`` per
    channel, or None; ``decay``: its :func:`_decay`, when already made. Only differences ``G_i - G_j <= 0`` are
    exponentiated (per channel this holds a ``(..., N, N, D)`` tensor: the chunkwise form calls it on chunks)."""
    keep = _causal(a.shape[-2], a.device, diagonal)
    if cum_log_decay is None:
        return (a @ b.transpose(-1, -2)).masked_fill(~keep, 0.0)
    decay = _decay(cum_log_decay, a) if decay is None else decay
    if cum_log_decay.dim() == a.dim() - 1:  # per head: one mask for every channel
        products = (a @ b.transpose(-1, -2)) * decay
    else:
        products = torch.einsum("...id,...jd,...ijd->...ij", a, b, decay)
    return products if diagonal == 0 else products.masked_fill(~keep, 0.0)


def _decay(cum_log_decay: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``exp(G_i - G_j)`` for ``j <= i``, else 0, in ``like``'s dtype (a decay accumulated in float64, see
    :func:`chunk_delta`, is exponentiated there and rounded once), ``G`` the cumulative log decay:
    ``(..., N, N)`` per head, ``(..., N, N, D)`` per channel (see :func:`_products`)."""
    per_head = cum_log_decay.dim() == like.dim() - 1
    keep = _causal(cum_log_decay.shape[-1 if per_head else -2], cum_log_decay.device)
    if per_head:
        differences = cum_log_decay[..., :, None] - cum_log_decay[..., None, :]
        return differences.masked_fill(~keep, float("-inf")).exp().to(like.dtype)
    differences = cum_log_decay[..., :, None, :] - cum_log_decay[..., None, :, :]
    return differences.masked_fill(~keep[..., None], float("-inf")).exp().to(like.dtype)


# ---------------------------------------------------------------------------- recurrent forms
def recurrent_gated(q, k, v, g=None, *, state=None):
    """``S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T``, ``o_t = S_t^T q_t``, one token at a time."""
    _check(q, k, v, g, state=state)
    s, outs = _initial(state, q, v), []
    for t in range(q.shape[2]):
        o, s = _gated_token(q[:, :, t], k[:, :, t], v[:, :, t], None if g is None else g[:, :, t], s)
        outs.append(o)
    return (torch.stack(outs, 2) if outs else v.new_zeros(*q.shape[:3], v.shape[-1])), s


def gated_token(q, k, v, g, s):
    """One token of :func:`recurrent_gated` (decoding): ``q``, ``k`` ``(B, H, D)``, ``v`` ``(B, H,
    Dv)``, ``g`` ``(B, H)``, ``(B, H, D)`` or None, the state ``s`` ``(B, H, D, Dv)``; returns the
    output ``(B, H, Dv)`` and the new state."""
    _check(*map(_one_token, (q, k, v, g)), state=_needed(s))
    return _gated_token(q, k, v, g, s)


def _gated_token(q, k, v, g, s):
    if g is not None:
        s = (g[..., None, None] if g.dim() == 2 else g[..., None]).exp() * s
    s = s + k[..., None] * v[:, :, None, :]
    return (q[:, :, None, :] @ s)[:, :, 0], s


def recurrent_delta(q, k, v, beta, g=None, *, state=None, read=None):
    """``S_t = diag(exp(g_t)) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T``, ``o_t = S_t^T q_t``. ``read``: the
    read key ``p`` ``(B, H, N, D)`` (Comba): the correction reads the decayed state at ``p_t`` instead of ``k_t``,
    ``S_t = S' + beta_t k_t (v_t - S'^T p_t)^T`` with ``S' = diag(exp(g_t)) S_{t-1}``; None: ``k``."""
    _check(q, k, v, g, beta, state, delta=True, read=read)
    s, outs = _initial(state, q, v), []
    for t in range(q.shape[2]):
        o, s = _delta_token(q[:, :, t], k[:, :, t], v[:, :, t], beta[:, :, t], None if g is None else g[:, :, t], s,
                            read=None if read is None else read[:, :, t])
        outs.append(o)
    return (torch.stack(outs, 2) if outs else v.new_zeros(*q.shape[:3], v.shape[-1])), s


def delta_token(q, k, v, beta, g, s, *, read=None):
    """One token of :func:`recurrent_delta` (decoding): ``q``, ``k`` ``(B, H, D)``, ``v`` ``(B, H,
    Dv)``, ``beta`` ``(B, H)``, ``g`` ``(B, H)`` (per head), ``(B, H, D)`` (per channel) or None,
    the state ``s`` ``(B, H, D, Dv)``, ``read`` the read key ``(B, H, D)`` or None (``k``); returns
    the output ``(B, H, Dv)`` and the new state."""
    _check(*map(_one_token, (q, k, v, g, beta)), _needed(s), delta=True, read=_one_token(read))
    return _delta_token(q, k, v, beta, g, s, read=read)


def _delta_token(q, k, v, beta, g, s, *, read=None):
    if g is not None:  # per head: one factor; per channel (KDA): the state's rows
        s = (g[..., None, None] if g.dim() == 2 else g[..., None]).exp() * s
    p = k if read is None else read
    u = beta[..., None] * (v - (p[:, :, None, :] @ s)[:, :, 0])  # beta_t (v_t - S^T p_t): the correction
    s = s + k[..., None] * u[:, :, None, :]
    return (q[:, :, None, :] @ s)[:, :, 0], s


# ---------------------------------------------------------------------------- parallel forms
def _causal(n: int, device, diagonal: int = 0) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool, device=device).tril(diagonal)


def _gated_scores(q, k, g):
    """``(Q K^T ⊙ M)`` of the gated form and ``q ⊙ exp(G)`` (the queries that read the initial state)."""
    cum_log_decay = None if g is None else g.cumsum(2)
    return _products(q, k, cum_log_decay), q * _as_rows(cum_log_decay, q).exp()


def parallel_gated(q, k, v, g=None, *, state=None):
    """The quadratic form of :func:`recurrent_gated`: ``O = (Q K^T ⊙ M) V + (Q ⊙ e^G) S_0``."""
    _check(q, k, v, g, state=state)
    s0 = _initial(state, q, v)
    scores, qd = _gated_scores(q, k, g)
    out = scores @ v + qd @ s0
    rows = _decay_rows(g, q)
    total = rows.sum(2)  # (B, H, D): the log-decay of the whole sequence
    tail = (total[:, :, None, :] - rows.cumsum(2)).exp()  # exp(G_N - G_j)
    return out, total.exp()[..., None] * s0 + (k * tail).transpose(-1, -2) @ v


def parallel_delta(q, k, v, beta, g=None, *, state=None, read=None):
    """The quadratic form of :func:`recurrent_delta`: ``O = P(Q, K) U + (Q ⊙ e^G) S_0`` with
    ``P(A, B)_ij = sum_d a_id b_jd e^{G_id - G_jd}`` (``j <= i``) and the pseudo-values ``U = (I +
    L)^{-1} diag(beta) (V - (K ⊙ e^G) S_0)``, ``L = diag(beta) P(K, K)`` strictly below the diagonal
    (DeltaNet's WY / UT form; per channel, KDA's). With the read key ``read`` (``P``, Comba) the state is read at
    ``P``: ``L = diag(beta) P(P, K)`` and ``U = (I + L)^{-1} diag(beta) (V - (P ⊙ e^G) S_0)``."""
    _check(q, k, v, g, beta, state, delta=True, read=read)
    p = k if read is None else read
    s0 = _initial(state, q, v)
    cum_log_decay = None if g is None else g.cumsum(2)
    rows = _as_rows(cum_log_decay, k)  # (B, H, N, 1 | D): G
    eye = torch.eye(q.shape[2], dtype=k.dtype, device=k.device)
    system = eye + beta[..., None] * _products(p, k, cum_log_decay, -1)
    u = torch.linalg.solve_triangular(system, beta[..., None] * (v - (p * rows.exp()) @ s0), upper=False,
                                      unitriangular=True)
    out = _products(q, k, cum_log_decay) @ u + (q * rows.exp()) @ s0
    last = rows[..., -1:, :]  # (B, H, 1, 1 | D): G_N
    return out, last.transpose(-1, -2).exp() * s0 + (k * (last - rows).exp()).transpose(-1, -2) @ u


# ---------------------------------------------------------------------------- chunkwise forms
def chunk_length(chunk: int, n: int, g: torch.Tensor | None = None, *, per_channel: bool | None = None) -> int:
    """The positions per chunk the chunkwise forms take, asked for ``chunk`` over ``n`` positions with the log decay
    ``g`` (or ``per_channel``: whether it is one per key channel): at most ``n`` (a shorter sequence is one chunk of its
    own length), and under a per-channel decay at most :data:`CHANNEL_CHUNK` (e^-G_j within a chunk stays below
    e^(CHANNEL_CHUNK steps of decay))."""
    # a plain positive int passes without a call (this runs per segment); anything else is validate's to refuse
    c = min(chunk if type(chunk) is int and chunk > 0 else positive_int("chunk", chunk), max(n, 1))
    if per_channel is None:
        per_channel = g is not None and g.dim() == 4
    return min(c, CHANNEL_CHUNK) if per_channel else c


def chunk_gated(q, k, v, g=None, *, chunk: int = CHUNK, state=None, cu_seqlens=None, segment: int | None = SEGMENT):
    """:func:`recurrent_gated` chunk by chunk: within each chunk its parallel form (every chunk at
    once), across chunks the recurrence on the chunk-end states; in segments of ``segment``
    positions (:func:`segmented`: under autograd each segment's chunks are computed again in the
    backward; None: never). ``cu_seqlens``: packed documents (see the module)."""
    _check(q, k, v, g, state=state, cu_seqlens=cu_seqlens)
    if q.device.type in fla_ops.SERVED_ON:  # fla's kernel on CUDA, where it serves
        if (served := fla_ops.dispatch_gated(q, k, v, g, state, cu_seqlens)) is not None:
            return served
    c, state = chunk_length(chunk, q.shape[2], g), _initial(state, q, v, cu_seqlens)
    if segment is None:
        return _chunk_gated(q, k, v, g, state=state, cu_seqlens=cu_seqlens, chunk=c)
    run = lambda a, b, s, cu, *pieces: _chunk_gated(*pieces, state=s, cu_seqlens=cu, chunk=c)  # noqa: E731
    return segmented(run, q.shape[2], chunk=c, state=state, cu_seqlens=cu_seqlens, segment=segment, split=(q, k, v, g))


def _chunk_gated(q, k, v, g, *, state, cu_seqlens, chunk):
    lay = ChunkLayout(cu_seqlens, q.shape[2], chunk, q.device)
    qc, kc, vc = lay.chunks(q), lay.chunks(k), lay.chunks(v)  # (B, H, T, C, D)
    # G within each chunk, (B, H, T, C) per head, (B, H, T, C, D) per channel
    cum_log_decay = None if g is None else lay.chunks(g).cumsum(3)
    if cum_log_decay is None or cum_log_decay.dim() == 4:  # per head: the mask exp(G_i - G_j) of one channel
        intra = _products(qc, kc, cum_log_decay) @ vc
    else:  # per channel: no mask of one channel; factored at the chunk start, (q e^G_i) . (k e^-G_j)
        scores = (qc * cum_log_decay.exp()) @ (kc * (-cum_log_decay).exp()).transpose(-1, -2)
        intra = scores.masked_fill(~_causal(lay.c, q.device), 0.0) @ vc
    rows = _as_rows(cum_log_decay, kc)  # (B, H, T, C, 1 | D)
    last = rows[..., -1:, :]  # (B, H, T, 1, 1 | D): the chunk's total log-decay
    writes = (kc * (last - rows).exp()).transpose(-1, -2) @ vc  # (B, H, T, D, Dv): what each chunk adds
    carry = last.transpose(-1, -2).exp()  # (B, H, T, 1 | D, 1)
    starts, s = lay.scan(state, carry, writes, matrix=False)
    return lay.positions(intra + (qc * rows.exp()) @ starts), s


def chunk_delta(q, k, v, beta, g=None, *, chunk: int = CHUNK, state=None, cu_seqlens=None,
                segment: int | None = SEGMENT, read=None):
    """:func:`recurrent_delta` chunk by chunk: the pseudo-values of every chunk at once from its WY form (a
    unit-triangular solve per chunk), then the recurrence on the chunk-end states, which corrects each chunk's
    pseudo-values for the state it starts from. A per-channel decay (KDA) takes chunks of at most :data:`CHANNEL_CHUNK`
    positions (its scores hold ``(C, C, D)`` per chunk). In segments of ``segment`` positions as :func:`chunk_gated`.
    ``cu_seqlens``: packed documents (see the module). ``read``: the read key (Comba; :func:`parallel_delta`), chunked
    and segmented as ``k``; None: ``k`` (fla's kernels serve only this)."""
    _check(q, k, v, g, beta, state, delta=True, cu_seqlens=cu_seqlens, read=read)
    if (read is None or read is k) and q.device.type in fla_ops.SERVED_ON:  # fla's kernels on CUDA, where they serve
        if (served := fla_ops.dispatch_delta(q, k, v, beta, g, state, cu_seqlens)) is not None:
            return served
    c, state = chunk_length(chunk, q.shape[2], g), _initial(state, q, v, cu_seqlens)
    if segment is None:
        return _chunk_delta(q, k, v, beta, g, read, state=state, cu_seqlens=cu_seqlens, chunk=c)
    run = lambda a, b, s, cu, *pieces: _chunk_delta(*pieces, state=s, cu_seqlens=cu, chunk=c)  # noqa: E731
    return segmented(run, q.shape[2], chunk=c, state=state, cu_seqlens=cu_seqlens, segment=segment,
                     split=(q, k, v, beta, g, read))


def _chunk_delta(q, k, v, beta, g, read, *, state, cu_seqlens, chunk):
    lay = ChunkLayout(cu_seqlens, q.shape[2], chunk, q.device)
    qc, kc, vc, bc = lay.chunks(q), lay.chunks(k), lay.chunks(v), lay.chunks(beta)
    pc = kc if read is None else lay.chunks(read)  # the read keys P (Comba), else K
    # G within each chunk; a decay per head, (B, H, N), accumulated and exponentiated in float64 and rounded once
    cum_log_decay = None if g is None else lay.chunks(g.double() if g.dim() == 3 else g).cumsum(3)
    rows = _as_rows(cum_log_decay, kc)  # (B, H, T, C, 1 | D)
    # e^{G_i - G_j}, j <= i: one for both products below
    decay = None if cum_log_decay is None else _decay(cum_log_decay, kc)
    eye = torch.eye(lay.c, dtype=q.dtype, device=q.device)
    system = eye + bc[..., None] * _products(pc, kc, cum_log_decay, -1, decay)  # I + diag(beta) P(P, K), strictly lower
    # U = T beta V and W = T beta e^G P: the chunk's pseudo-values from a zero state, and how they
    # move with the state it starts from, read at P (U_c = U - W S_c)
    right = torch.cat([bc[..., None] * vc, bc[..., None] * rows.exp().to(kc.dtype) * pc], -1)
    solved = torch.linalg.solve_triangular(system, right, upper=False, unitriangular=True)
    u0, w = solved.split([v.shape[-1], k.shape[-1]], -1)
    last = rows[..., -1:, :]  # (B, H, T, 1, 1 | D): the chunk's total log-decay
    kt = (kc * (last - rows).exp().to(kc.dtype)).transpose(-1, -2)  # (B, H, T, D, C): K~ = K e^{G_C - G_j}
    # the state entering the next chunk is affine in the state entering this one:
    # S_{c+1} = diag(e^G_C) S_c + K~_c^T (U_c - W_c S_c) = A_c S_c + B_c, with A_c = diag(e^G_C) -
    # K~_c^T W_c and B_c = K~_c^T U_c for every chunk at once; the sequential part is one product per chunk
    # (B, H, T, D, D)
    step = last.transpose(-1, -2).exp().to(kc.dtype) * torch.eye(k.shape[-1], dtype=q.dtype, device=q.device) - kt @ w
    starts, s = lay.scan(state, step, kt @ u0, matrix=True)
    out = (qc * rows.exp().to(qc.dtype)) @ starts + _products(qc, kc, cum_log_decay, 0, decay) @ (u0 - w @ starts)
    return lay.positions(out), s


fla_ops.register_kernels(chunk_gated, chunk_delta)  # fla's kernels for these forms, on CUDA (attnlab.efficient.fla_ops)


def causal_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                cu_seqlens=None) -> torch.Tensor:
    """The gated family's short convolution: depthwise and causal, ``x`` ``(B, C, N)``, ``weight`` ``(C, K)``:
    ``out_t = sum_j w_j x_{t - K + 1 + j}`` (+ bias), zero before the sequence; with packed documents (``cu_seqlens``, a
    batch of one) zero before each document, so that no position reads an earlier document's."""
    c, n, width = x.shape[1], x.shape[-1], weight.shape[-1]
    if cu_seqlens is None:
        return F.conv1d(x, weight.unsqueeze(1), bias, padding=width - 1, groups=c)[..., :n]
    _check_offsets(cu_seqlens, x.shape[0], n)
    pos = torch.arange(n, device=x.device)
    cu = cu_seqlens.to(x.device)
    start = cu[torch.searchsorted(cu, pos, right=True) - 1]  # each position's document start
    keep = (pos[:, None] - (width - 1) + torch.arange(width, device=x.device)) >= start[:, None]  # (N, K)
    out = (F.pad(x, (width - 1, 0)).unfold(-1, width, 1) * keep * weight[:, None, :]).sum(-1)  # windows (B, C, N, K)
    return out if bias is None else out + bias[:, None]
