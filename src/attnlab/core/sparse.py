"""Block-sparse exact attention: only the tiles a :class:`attnlab.core.blockmap.BlockMap` allows.

The queries are cut into tiles of ``q_block`` rows and grouped into chunks (the map's plan);
each chunk reads its rows' non-empty key tiles, either as a strided view of the keys (rows
whose tiles run consecutively, as in a window, causal attention or documents: no copy) or by
gathering them (scattered tiles: global tokens, random blocks). Empty tiles are never read; full
tiles take no mask; the mask is evaluated on partial tiles only. Three kernels compute a chunk:

* ``fused`` (CPU, softmax over a dot-product score, no score function): PyTorch's fused flash
  kernel (``aten::_scaled_dot_product_flash_attention_for_cpu``, what
  ``scaled_dot_product_attention`` runs on CPU) with the chunk's mask, keeping the output and
  the row log-sum-exp; the backward pass is the kernel's own backward on the same views.
* ``softmax`` (any score and score function, any device): scores written out one chunk at a
  time, the log-sum-exp kept; backward FlashAttention's way, ``P = exp(S - lse)``,
  ``dS = P (dO V^T - rowsum(dO O))``, through autograd for the score and score function.
* ``generic`` (any normaliser, dropout): the chunk recomputed under autograd in the backward pass.

Forward and backward hold O(chunk) scores and O(N) of everything else: never an N x M tensor.
Rows with no allowed key give zeros and zero gradients. The same functions serve ring attention
(:mod:`attnlab.distributed.ring`), which merges shards by their log-sum-exp.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .amp import same_autocast_backward, same_autocast_forward
from .blockmap import BlockMap, Chunk
from .sparse_setup import SparseSetup, index4, split_heads, stat_dtype

__all__ = ["SparseSetup", "sparse_attention", "sparse_forward", "sparse_backward", "FUSED", "DEFAULT_BLOCK_ELEMENTS",
           "chunk_limits"]

_FWD = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_BWD = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
FUSED = _FWD is not None and _BWD is not None
"""Whether this PyTorch has the fused CPU flash kernel and its backward."""

DEFAULT_BLOCK_ELEMENTS = 1 << 20
"""Score elements (B x H x rows x keys x pair_cost) one chunk of the block-sparse path aims for: 4 MiB in fp32
(the chunk's key gradients are of the same order, so this also bounds the backward pass's temporaries)."""


def chunk_limits(kind: str, bmap: BlockMap, b: int, h: int, score_fn=None) -> tuple[int, int | None]:
    """``(budget, lead_budget)`` of :meth:`BlockMap.chunks` for a kernel ``kind``: the fused kernel
    writes no scores out, so a chunk's leading FULL slots are free and its masked slots cost their
    mask (one copy for every batch row and head when the mask does not depend on them); the
    explicit kernels hold a few score-sized temporaries per chunk."""
    if kind == "fused":
        copies = 1 if bmap.state.shape[0] * bmap.state.shape[1] == 1 else b * h
        return max(1, DEFAULT_BLOCK_ELEMENTS // (b * h)), max(1, DEFAULT_BLOCK_ELEMENTS // copies)
    return max(1, DEFAULT_BLOCK_ELEMENTS // (b * h * max(int(getattr(score_fn, "pair_cost", 1)), 1) * 8)), None


def _scores(setup: SparseSetup, c: Chunk, qc, kc, bias, allowed, *, fill: bool = True) -> torch.Tensor:
    """A chunk's scores ``(R, B, H, bq, L)`` in the statistics dtype, plus the bias (its rows of
    this chunk, or one row for all) and the score function; forbidden pairs at -inf if ``fill``."""
    b, h = setup.b, setup.h
    q5, k5 = split_heads(qc, b, h), split_heads(kc, b, h)
    assert setup.score_fn is not None  # every kernel has a score
    s = setup.score_fn.pairwise(q5, k5)
    dev = s.device
    if bias is not None or setup.score_mod is not None:
        bi = torch.arange(b, device=dev)[None, :, None, None, None]
        hi = torch.arange(h, device=dev)[None, None, :, None, None]
        qi = setup.qpos(c, dev)[:, None, None, :, None]
        ki = setup.kpos(c, dev)[:, None, None, None, :]
        if bias is not None:
            rel = qi - c.r0 * setup.bmap.block[0] if bias.dim() >= 2 and bias.shape[-2] > 1 else qi
            s = s + index4(bias, bi, hi, rel, ki).to(s.dtype)
        if setup.score_mod is not None:
            s = setup.score_mod(s, bi, hi, qi, ki)
    s = s.to(stat_dtype(qc.dtype))
    if fill and allowed is not None:
        s = s.masked_fill(~allowed.permute(2, 0, 1, 3, 4), float("-inf"))
    return s


@dataclass(frozen=True)
class _ChunkInputs:
    """One chunk of a call and what its kernels read: the setup, the chunk, its queries
    ``(R', BH, rows, D)`` (:meth:`SparseSetup.rows_of`) and its keys and values ``(R', BH, L, ·)``
    (:meth:`SparseSetup.keys`)."""

    setup: SparseSetup
    c: Chunk
    qc: torch.Tensor
    kc: torch.Tensor
    vc: torch.Tensor


def _fused_part(x: _ChunkInputs, first: int):
    """Output ``(R', B, H, rows, Dv)`` and log-sum-exp ``(R', B, H, rows)`` of slots ``first ..``
    of a chunk on the fused kernel (rows that see no key there: 0 and -inf)."""
    setup, c, qc, kc, vc = x.setup, x.c, x.qc, x.kc, x.vc
    g, rows = setup.groups(c)
    bk = setup.bmap.block[1]
    allowed, dead = setup.allowed(c, qc.device, first)
    mask = None if allowed is None else setup.kernel_mask(allowed, dead, qc.dtype, True)
    assert _FWD is not None  # the fused kind needs FUSED
    o, lse = _FWD(qc, kc[:, :, first * bk :], vc[:, :, first * bk :], attn_mask=mask, scale=setup.scale)
    o5, l5 = split_heads(o, setup.b, setup.h), lse.view(g, setup.b, setup.h, rows)
    d5 = SparseSetup.rows5(o, dead)
    if d5 is not None:
        o5 = o5.masked_fill(d5[..., None], 0.0)
        l5 = l5.masked_fill(d5, float("-inf"))
    return o5, l5


def _fused_forward(x: _ChunkInputs):
    """A chunk on the fused kernel: its leading FULL slots (:attr:`Chunk.lead`) without a mask,
    the rest with one, merged by their log-sum-exp."""
    setup, c, qc, kc, vc = x.setup, x.c, x.qc, x.kc, x.vc
    if not c.lead:
        return _fused_part(x, 0)
    bk = setup.bmap.block[1]
    g, rows = setup.groups(c)
    assert _FWD is not None  # the fused kind needs FUSED
    o, lead_lse = _FWD(qc, kc[:, :, : c.lead * bk], vc[:, :, : c.lead * bk], scale=setup.scale)
    oa, la = split_heads(o, setup.b, setup.h), lead_lse.view(g, setup.b, setup.h, rows)
    ob, lb = _fused_part(x, c.lead)
    lse = torch.logaddexp(la, lb)
    st = la.dtype
    out = oa.to(st) * torch.exp(la - lse)[..., None] + ob.to(st) * torch.exp(lb - lse)[..., None]
    return out.to(oa.dtype), lse


def _fused_backward(x: _ChunkInputs, doc, oc, lc, *, dq, dk, dv) -> None:
    """A chunk's gradients on the fused kernel's backward, part by part as :func:`_fused_forward`
    computed it (each part given the merged output ``oc`` and log-sum-exp ``lc``), into ``dq``, ``dk``, ``dv``."""
    setup, c, qc, kc, vc = x.setup, x.c, x.qc, x.kc, x.vc
    bk = setup.bmap.block[1]
    parts = [(0, c.lead, False), (c.lead, c.S, True)] if c.lead else [(0, c.S, True)]
    gq = None
    assert _BWD is not None  # the fused kind needs FUSED
    for a, b, masked in parts:
        mask = None
        if masked:
            allowed, dead = setup.allowed(c, qc.device, a)
            mask = None if allowed is None else setup.kernel_mask(allowed, dead, qc.dtype, False)
        part_q, gk, gv = _BWD(doc, qc, kc[:, :, a * bk : b * bk], vc[:, :, a * bk : b * bk], oc, lc, 0.0, False,
                              attn_mask=mask, scale=setup.scale)
        gq = part_q if gq is None else gq + part_q
        slots = (a, b) if c.lead else None
        setup.fold(dk, gk, c, slots)
        setup.fold(dv, gv, c, slots)
    assert gq is not None  # parts is never empty
    setup.put_rows(dq, c, gq)


def _softmax_chunk(s: torch.Tensor, v5: torch.Tensor):
    """Output ``(R, B, H, bq, Dv)`` and log-sum-exp ``(R, B, H, bq)`` of scores with -inf where forbidden."""
    m = s.amax(-1, keepdim=True)
    m = torch.where(m == float("-inf"), 0.0, m)
    e = torch.exp(s - m)
    den = e.sum(-1, keepdim=True)
    out = (e / den.clamp_min(torch.finfo(e.dtype).tiny)).to(v5.dtype) @ v5
    return out, (m + torch.log(den)).squeeze(-1)


def _generic_chunk(x: _ChunkInputs, index: int, bias, allowed, *, weights: bool = False):
    """Output ``(R, B, H, bq, Dv)`` (and the weights before dropout) of any normaliser."""
    setup, c, qc, kc, vc = x.setup, x.c, x.qc, x.kc, x.vc
    s = _scores(setup, c, qc, kc, bias, allowed, fill=False)
    mask = None if allowed is None else allowed.permute(2, 0, 1, 3, 4)
    assert setup.norm_fn is not None  # the generic kernel has a normaliser
    w = setup.norm_fn(s, mask)
    wd = w
    if setup.dropout_p > 0:
        g = torch.Generator(device=w.device).manual_seed(setup.seed + index)
        keep = torch.rand(w.shape, generator=g, device=w.device) >= setup.dropout_p
        wd = w * keep / (1.0 - setup.dropout_p)
    out = wd.to(vc.dtype) @ split_heads(vc, setup.b, setup.h)
    return (out, w.to(qc.dtype)) if weights else out


def _bias_rows(bias: torch.Tensor | None, c: Chunk, bq: int) -> torch.Tensor | None:
    if bias is None or bias.dim() < 2 or bias.shape[-2] == 1:
        return bias
    return bias[..., c.r0 * bq : c.r1 * bq, :]


def sparse_forward(setup: SparseSetup, qp, kp, vp, bias=None):
    """Every chunk's output into ``out`` ``(BH, NQ bq, Dv)`` and, for softmax kernels, the row
    log-sum-exp ``(BH, NQ bq)`` (-inf for rows that see no key; None for the generic kernel).
    ``qp`` ``(BH, NQ bq, D)``; ``kp``, ``vp`` ``(BH, NK bk, D)`` (padded to whole tiles). Rows in no
    chunk stay 0."""
    bh, nqp, _ = qp.shape
    dv = vp.shape[-1]
    out = qp.new_zeros(bh, nqp, dv, dtype=vp.dtype)
    lse = None if setup.kind == "generic" else torch.full((bh, nqp), float("-inf"), dtype=stat_dtype(qp.dtype),
                                                          device=qp.device)
    for i, c in enumerate(setup.chunks):
        g, rows = setup.groups(c)
        qc = setup.rows_of(qp, c)  # (R', BH, rows, D)
        kc, vc = setup.keys(kp, c), setup.keys(vp, c)
        if setup.kind == "fused":
            o5, l5 = _fused_forward(_ChunkInputs(setup, c, qc, kc, vc))
        elif setup.kind == "softmax":
            allowed, _ = setup.allowed(c, qp.device)
            s = _scores(setup, c, qc, kc, _bias_rows(bias, c, setup.bmap.block[0]), allowed)
            o5, l5 = _softmax_chunk(s, split_heads(vc, setup.b, setup.h))
        else:
            allowed, _ = setup.allowed(c, qp.device)
            o5 = _generic_chunk(_ChunkInputs(setup, c, qc, kc, vc), i, _bias_rows(bias, c, setup.bmap.block[0]),
                                allowed)
            l5 = None
        setup.put_rows(out, c, o5.reshape(g, bh, rows, dv))
        if lse is not None:
            setup.put_rows(lse, c, l5.reshape(g, bh, rows))
    return out, lse


def sparse_backward(setup: SparseSetup, do, qp, kp, vp, out, lse, bias=None, need=(True, True, True, False)):
    """Gradients ``(dq, dk, dv, dbias, dparams)`` of :func:`sparse_forward`'s output given ``do``
    ``(BH, NQ bq, Dv)``; ``out`` and ``lse`` as it returned them (the ring passes the merged
    ones). ``dk``, ``dv`` are ``(BH, NKp bk, ·)``, padding tiles included."""
    bmap = setup.bmap
    bq, bk = bmap.block
    bh = qp.shape[0]
    st = stat_dtype(qp.dtype)
    need_q, need_k, need_v, need_bias = need
    dq = torch.zeros_like(qp)
    dk = torch.zeros(bh, kp.shape[1] // bk, bk, kp.shape[-1], dtype=kp.dtype, device=kp.device)
    dv = torch.zeros(bh, vp.shape[1] // bk, bk, vp.shape[-1], dtype=vp.dtype, device=vp.device)
    dbias = torch.zeros_like(bias) if (bias is not None and need_bias) else None
    dparams: list = [None] * len(setup.params)
    if lse is not None:
        delta = (do.to(st) * out.to(st)).sum(-1)  # (BH, NQ bq): rowsum(dO * O)
        lse_safe = lse.masked_fill(lse == float("-inf"), 0.0)
    for i, c in enumerate(setup.chunks):
        r = setup.groups(c)[0]
        rows = slice(c.r0 * bq, c.r1 * bq)
        qc, doc = setup.rows_of(qp, c), setup.rows_of(do, c)
        kc, vc = setup.keys(kp, c), setup.keys(vp, c)
        if setup.kind == "fused":
            _fused_backward(_ChunkInputs(setup, c, qc, kc, vc), doc.contiguous(), setup.rows_of(out, c).contiguous(),
                            setup.rows_of(lse_safe, c).contiguous(), dq=dq, dk=dk, dv=dv)
            continue
        allowed, dead = setup.allowed(c, qp.device)
        with torch.enable_grad():
            ql = qc.detach().requires_grad_(need_q)
            kl = kc.detach().requires_grad_(need_k)
            vl = vc.detach().requires_grad_(need_v)
            brows = _bias_rows(bias, c, bq)
            if brows is not None:
                brows = brows.detach().requires_grad_(need_bias)
            cb = brows
            if setup.kind == "softmax":
                s = _scores(setup, c, ql, kl, cb, allowed)
                p = torch.exp(s.detach() - split_heads(setup.rows_of(lse_safe, c)[..., None], setup.b, setup.h))
                d5 = split_heads(doc, setup.b, setup.h).to(st)
                gv5 = p.transpose(-1, -2) @ d5  # (R, B, H, L, Dv)
                dp = d5 @ split_heads(vc, setup.b, setup.h).to(st).transpose(-1, -2)
                dl = split_heads(setup.rows_of(delta, c)[..., None], setup.b, setup.h)
                ds = p * (dp - dl)
                if dead is not None:
                    ds = ds.masked_fill(SparseSetup.rows5(ds, dead)[..., None], 0.0)
                target, grad = s, ds
                if need_v:
                    setup.fold(dv, gv5.reshape(r, bh, *gv5.shape[3:]).to(vp.dtype), c)
                wrt: list[tuple[str | int, torch.Tensor]] = [(n, t) for n, t in (("q", ql), ("k", kl))
                                                             if t.requires_grad]
            else:
                target = _generic_chunk(_ChunkInputs(setup, c, ql, kl, vl), i, cb, allowed)
                grad = split_heads(doc, setup.b, setup.h)
                wrt = [(n, t) for n, t in (("q", ql), ("k", kl), ("v", vl)) if t.requires_grad]
            if brows is not None and need_bias:
                wrt.append(("bias", brows))
            wrt += [(j, p_) for j, p_ in enumerate(setup.params) if p_.requires_grad]
            if not wrt:
                continue
            grads = torch.autograd.grad(target, [t for _, t in wrt], grad.to(target.dtype), allow_unused=True)
        for (name, _), g in zip(wrt, grads):
            if g is None:
                continue
            if name == "q":
                setup.put_rows(dq, c, g)
            elif name == "k":
                setup.fold(dk, g, c)
            elif name == "v":
                setup.fold(dv, g, c)
            elif name == "bias":
                assert dbias is not None  # bias gradients are asked for with need_bias
                if bias.dim() >= 2 and bias.shape[-2] != 1:
                    dbias[..., rows, :] += g
                else:
                    dbias += g
            else:
                assert isinstance(name, int)  # a parameter's index in setup.params
                dparams[name] = g if dparams[name] is None else dparams[name] + g
    return dq, dk.view(bh, -1, dk.shape[-1]), dv.view(bh, -1, dv.shape[-1]), dbias, dparams


class _SparseAttention(torch.autograd.Function):
    """``sparse_forward`` with ``sparse_backward`` as its gradient (inputs already padded)."""

    @staticmethod
    @same_autocast_forward
    def forward(ctx, setup: SparseSetup, qp, kp, vp, bias, *params):
        out, lse = sparse_forward(setup, qp, kp, vp, bias)
        ctx.setup = setup
        ctx.save_for_backward(qp, kp, vp, bias, out, lse, *params)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    @same_autocast_backward
    def backward(ctx, grad):
        qp, kp, vp, bias, out, lse, *params = ctx.saved_tensors
        need = ctx.needs_input_grad[1:5]
        dq, dk, dv, dbias, dparams = sparse_backward(ctx.setup, grad.contiguous(), qp, kp, vp, out, lse, bias, need)
        return (None, dq if need[0] else None, dk if need[1] else None, dv if need[2] else None, dbias, *dparams)


def pad_inputs(setup: SparseSetup, q, k, v):
    """q ``(B, H, N, D)`` -> ``(BH, NQ bq, D)``; k, v ``(B, H, M, ·)`` -> ``(BH, NK bk, ·)``: views when
    the lengths are whole tiles (and the tensors allow it), else padded to whole tiles with zeros,
    through autograd (so gradients fold back)."""
    bq, bk = setup.bmap.block
    b, h, n, d = q.shape
    nq, nk = setup.bmap.shape
    m = k.shape[2]

    def whole(x, rows, length):
        x = x if length == rows else F.pad(x, (0, 0, 0, length - rows))
        return x.reshape(b * h, length, x.shape[-1])

    return whole(q, n, nq * bq), whole(k, m, nk * bk), whole(v, m, nk * bk)


def sparse_attention(setup: SparseSetup, q, k, v, bias=None) -> torch.Tensor:
    """Block-sparse attention of q ``(B, H, N, D)`` over k ``(B, H, M, D)``, v ``(B, H, M, Dv)``
    (prepared, H heads): ``(B, H, N, Dv)``, differentiable through :func:`sparse_backward`."""
    b, h, n, _ = q.shape
    qp, kp, vp = pad_inputs(setup, q, k, v)
    out = _SparseAttention.apply(setup, qp, kp, vp, bias, *setup.params)
    return out.view(b, h, -1, v.shape[-1])[:, :, :n]


def sparse_weights(setup: SparseSetup, q, k, v, bias=None):
    """Output ``(B, H, N, Dv)`` and weights ``(B, H, N, M)`` through plain autograd (the weights
    are asked for, so they are materialised anyway)."""
    b, h, n, _ = q.shape
    m = k.shape[2]
    bq, bk = setup.bmap.block
    qp, kp, vp = pad_inputs(setup, q, k, v)
    nqp = qp.shape[1]
    dev = q.device
    out = q.new_zeros(b, h, nqp, v.shape[-1])
    weights = q.new_zeros(b, h, nqp, m)
    bi = torch.arange(b, device=dev)[None, :, None, None, None]
    hi = torch.arange(h, device=dev)[None, None, :, None, None]
    for i, c in enumerate(setup.chunks):
        qc = setup.rows_of(qp, c)
        allowed, _ = setup.allowed(c, dev)
        x = _ChunkInputs(setup, c, qc, setup.keys(kp, c), setup.keys(vp, c))
        o5, w5 = _generic_chunk(x, i, _bias_rows(bias, c, bq), allowed, weights=True)
        g, rows = setup.groups(c)
        qi = torch.arange(c.r0 * bq, c.r1 * bq, device=dev).view(g, rows)[:, None, None, :, None]  # (R', 1, 1, rows, 1)
        out.index_put_((bi[..., 0], hi[..., 0], qi[..., 0]), o5)
        kpos = setup.kpos(c, dev)[:, None, None, None, :]  # (R, 1, 1, 1, L): padding slots hold weight 0
        weights.index_put_((bi, hi, qi, kpos), w5.to(weights.dtype), accumulate=True)
    return out[:, :, :n], weights[:, :, :n]
