"""``attend(q, k, v)``: the attention core — validation, then dispatch to one of two backends.

* ``"sdpa"``: softmax over a dot-product score (dot, scaled dot, cosine, bilinear — all are a
  scaled dot product after :meth:`Score.prepare`) with no weights requested goes to
  :func:`torch.nn.functional.scaled_dot_product_attention`, PyTorch's fused kernel, which never
  builds the N x M matrix.
* ``"chunked"``: every other combination processes the queries in blocks of ``block_size``
  rows, so the forward pass holds O(block x M) scores, not O(N x M); its backward pass
  recomputes one block at a time (as FlashAttention does), so training holds O(block x M) too. Only ``return_weights=True`` materialises the full ``(B, H, N, M)`` weights, because the
  caller asked for them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

import torch
import torch.nn.functional as F

from ..validate import optional_int, probability
from .bias import BlockBias
from .normalize import resolve_normalizer, softmax
from .scores import Score, resolve_score

__all__ = ["attend", "AttentionResult", "DEFAULT_BLOCK_ELEMENTS", "plan"]

DEFAULT_BLOCK_ELEMENTS = 1 << 22
"""Elements of the score block (B x H x block x M x pair_cost) the chunked path aims for: 16 MiB in fp32."""

Backend = Literal["auto", "sdpa", "chunked"]


@dataclass
class AttentionResult:
    """What attention returns, whatever the flags.

    Attributes:
        output: ``(B, H, N, Dv)`` from :func:`attend`, ``(B, N, E)`` from ``MultiHeadAttention``.
        weights: ``(B, H, N, M)`` normalised attention weights (before dropout) when
            ``return_weights=True`` was asked, else ``None``.
    """

    output: torch.Tensor
    weights: torch.Tensor | None = None


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"tensor of shape {tuple(x.shape)} and dtype {x.dtype}"
    return type(x).__name__


def check_mask_or_bias(name: str, t, target: tuple[int, int, int, int], device) -> None:
    """Raise unless ``t`` is a valid ``mask`` (bool) or ``bias`` (float tensor or BlockBias) for
    scores of shape ``target`` = (B, H, N, M) on ``device``."""
    b, h, n, m = target
    if name == "bias" and isinstance(t, BlockBias):
        if (t.n, t.m) != (n, m):
            raise ValueError(f"bias is a BlockBias for {t.n} queries x {t.m} keys, but q, k give N={n}, M={m}")
        return
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor broadcastable to (B, H, N, M), got {_describe(t)}")
    if name == "mask" and t.dtype != torch.bool:
        raise TypeError(
            f"mask must have dtype torch.bool (True = this query may attend to this key), got {t.dtype}; "
            "pass additive float terms as bias="
        )
    if name == "bias" and not t.is_floating_point():
        raise TypeError(f"bias must be a floating-point tensor (added to the scores), got dtype {t.dtype}")
    try:
        ok = t.dim() <= 4 and torch.broadcast_shapes(t.shape, target) == target
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(f"{name} of shape {tuple(t.shape)} does not broadcast to (B, H, N, M) = {target}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but q is on {device}")


def _validate(q, k, v, mask, bias, dropout_p) -> tuple[int, int, int, int, int]:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of shape (B, H, N|M, D), got {_describe(t)}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have rank 4, shape (B, H, N|M, D); got rank {t.dim()}, shape {tuple(t.shape)}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k and v must be on one device, got {q.device}, {k.device}, {v.device}")
    b, h, n, _ = q.shape
    m = k.shape[2]
    g = k.shape[1]
    if k.shape[0] != b or v.shape[:2] != (b, g) or (g == 0 and h != 0) or (g and h % g):
        raise ValueError(
            "q, k and v must agree on (B, H), or k and v have G key heads dividing H (grouped-query): got "
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if v.shape[2] != m:
        raise ValueError(f"k and v must have the same number of keys M: got k {tuple(k.shape)}, v {tuple(v.shape)}")
    for name, t in (("mask", mask), ("bias", bias)):
        if t is not None:
            check_mask_or_bias(name, t, (b, h, n, m), q.device)
    probability("dropout_p", dropout_p)
    return b, h, n, m, v.shape[3]


def plan(score="scaled_dot", normalize="softmax", *, head_dim: int, return_weights: bool = False) -> str:
    """The backend ``attend`` picks under ``backend="auto"``: ``"sdpa"`` or ``"chunked"``."""
    s = resolve_score(score)
    return "sdpa" if _sdpa_scale(s, resolve_normalizer(normalize), head_dim, return_weights) is not None else "chunked"


def _sdpa_scale(score: Score, norm: Callable, head_dim: int, return_weights: bool) -> float | None:
    if return_weights or norm is not softmax:
        return None
    return score.dot_scale(head_dim)


def _rows(t: torch.Tensor | BlockBias | None, start: int, stop: int) -> torch.Tensor | None:
    """Rows ``start:stop`` of a mask or bias broadcastable to (B, H, N, M) (dim -2 may be 1)."""
    if isinstance(t, BlockBias):
        return t.rows(start, stop)
    if t is None or t.dim() < 2 or t.shape[-2] == 1:
        return t
    return t[..., start:stop, :]


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    score: str | Score | Callable = "scaled_dot",
    normalize: str | Callable = "softmax",
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | BlockBias | None = None,
    dropout_p: float = 0.0,
    return_weights: bool = False,
    backend: Backend = "auto",
    block_size: int | None = None,
) -> AttentionResult:
    """Attention ``b_i = sum_j norm_j(score(q_i, k_j) + bias_ij) v_j`` over the allowed keys.

    The textbook steps (Vaswani et al. 2017, https://arxiv.org/abs/1706.03762, eq. 1 in its
    scaled-dot/softmax form): scores ``alpha_ij = score(q_i, k_j)``, plus ``bias``; pairs the
    mask forbids removed; ``alpha'_i. = norm(alpha_i.)``; output ``b_i = sum_j alpha'_ij v_j``.
    A query with no allowed key gets a zero output and zero gradients; keys and values that no
    query may see (padding) never reach the output, even if they hold NaN.

    Args:
        q: ``(B, H, N, D)`` queries.
        k: ``(B, H, M, D)`` keys, or ``(B, G, M, D)`` with G dividing H (grouped-query attention:
            key head g serves query heads ``g H/G .. (g+1) H/G - 1``).
        v: ``(B, H, M, Dv)`` values (or ``(B, G, M, Dv)`` with grouped keys).
        score: a name from :func:`attnlab.scores.names` with no weights (``"dot"``,
            ``"scaled_dot"``, ``"cosine"``), a :class:`attnlab.Score` module (``Additive``,
            ``Bilinear``, ...) or a callable ``(q, k) -> (B, H, N, M)``.
        normalize: ``"softmax"``, ``"relu"``, ``"sigmoid"`` (see :mod:`attnlab.core.normalize`)
            or a callable ``(scores, mask) -> weights``.
        mask: bool, broadcastable to ``(B, H, N, M)``, True = may attend (see :mod:`attnlab.masks`).
        bias: float, broadcastable to ``(B, H, N, M)``, added to the scores (ALiBi, relative
            positions); or a :class:`attnlab.BlockBias`, which the chunked path asks for one
            row block at a time and the SDPA path materialises.
        dropout_p: dropout on the weights (apply only in training; ``MultiHeadAttention`` does).
        return_weights: also return the ``(B, H, N, M)`` weights (this materialises them).
        backend: ``"auto"`` (default), or force ``"sdpa"`` / ``"chunked"``.
        block_size: query rows per block on the chunked path (default: about
            :data:`DEFAULT_BLOCK_ELEMENTS` score elements per block).

    Returns:
        :class:`AttentionResult` with ``output`` ``(B, H, N, Dv)`` and ``weights`` or None.
    """
    b, h, n, m, dv = _validate(q, k, v, mask, bias, dropout_p)
    score_fn = resolve_score(score)
    norm_fn = resolve_normalizer(normalize)
    if k.shape[1] not in (h, 0) and not _grouped_fused(score_fn, norm_fn, q.shape[-1], return_weights, mask, bias, backend):
        r = h // k.shape[1]  # grouped keys / values, repeated to H heads: key head g serves query heads g r .. g r + r - 1
        k, v = k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1)
    check = getattr(score_fn, "check", None)
    if check is not None:
        check(q, k)
    if backend not in ("auto", "sdpa", "chunked"):
        raise ValueError(f"backend must be 'auto', 'sdpa' or 'chunked', got {backend!r}")
    optional_int("block_size", block_size)

    if n == 0 or m == 0 or b * h == 0:
        weights = q.new_zeros(b, h, n, m)
        if v.shape[1] not in (h, 0):  # grouped values left for the fused kernel: repeat them here
            v = v.repeat_interleave(h // v.shape[1], dim=1)
        return AttentionResult(weights @ v, weights if return_weights else None)

    causal = _is_causal(mask)  # every key is seen by a later query: nothing to zero
    if mask is not None and not causal:
        # keys no query may see (padding): zero them so that NaN or inf there cannot leak
        col_ok = mask.any(-2).unsqueeze(-1)  # (…, M, 1)
        if not bool(col_ok.all()):
            zero = torch.zeros((), dtype=v.dtype, device=v.device)
            k, v = torch.where(col_ok, k, zero), torch.where(col_ok, v, zero)
    qp, kp = score_fn.prepare(q, k)  # per-vector work, once: (B, H, N, D'), (B, H, M, D')

    scale = _sdpa_scale(score_fn, norm_fn, qp.shape[-1], return_weights)
    if backend == "sdpa" and scale is None:
        raise ValueError(
            "backend='sdpa' needs softmax over a dot-product score (dot, scaled_dot, cosine, bilinear) "
            "and return_weights=False"
        )
    if backend != "chunked" and scale is not None:
        return AttentionResult(_sdpa(qp, kp, v, mask, bias, dropout_p, scale, causal), None)
    return _chunked(qp, kp, v, score_fn, norm_fn, mask, bias, dropout_p, return_weights, block_size)


def _grouped_fused(score_fn, norm_fn, head_dim, return_weights, mask, bias, backend) -> bool:
    """Whether grouped keys / values (G < H heads) go to PyTorch's fused kernel as they are
    (``enable_gqa``): softmax over a plain scaled dot product, no bias, a mask without a head axis."""
    if backend == "chunked" or bias is not None or type(score_fn).prepare is not Score.prepare:
        return False
    if mask is not None and mask.dim() >= 3 and mask.shape[-3] != 1:
        return False
    return _sdpa_scale(score_fn, norm_fn, head_dim, return_weights) is not None


def _is_causal(mask: torch.Tensor | None) -> bool:
    """Whether ``mask`` is the square causal mask ``j <= i`` (any leading dimensions of size 1),
    which PyTorch's fused kernel computes without reading a mask (``is_causal=True``)."""
    if mask is None or mask.dim() < 2 or mask.shape[-1] != mask.shape[-2] or mask.shape[-1] < 2 or any(s != 1 for s in mask.shape[:-2]):
        return False
    n = mask.shape[-1]
    return torch.equal(mask.reshape(n, n), torch.ones(n, n, dtype=torch.bool, device=mask.device).tril())


def _sdpa(q, k, v, mask, bias, dropout_p, scale, causal: bool = False) -> torch.Tensor:
    gqa = {"enable_gqa": True} if k.shape[1] != q.shape[1] else {}  # grouped keys / values, on the fused kernel
    if bias is None and causal:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale, is_causal=True, **gqa)
    row_ok = None
    if mask is not None:
        row_ok = mask.any(-1, keepdim=True)  # (…, N, 1)
        if bool(row_ok.all()):
            row_ok = None
        else:
            # a row with no allowed key attends everywhere, then is zeroed: no NaN, zero gradients
            mask = mask | ~row_ok
    attn_mask = mask
    if isinstance(bias, BlockBias):
        bias = bias.materialize()
    if bias is not None:
        attn_mask = bias.to(q.dtype)
        if mask is not None:
            attn_mask = attn_mask.masked_fill(~mask, float("-inf"))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale, **gqa)
    if row_ok is not None:
        out = out.masked_fill(~row_ok, 0.0)
    return out


class _Blocks:
    """What one chunked call needs besides its tensors: the score, normaliser, mask, dropout
    seed and the block layout."""

    def __init__(self, score_fn, norm_fn, mask, dropout_p, n, block_size, device):
        self.score_fn, self.norm_fn, self.mask = score_fn, norm_fn, mask
        self.dropout_p, self.device = dropout_p, device
        self.block_bias: BlockBias | None = None  # a bias given rule-wise, asked for block by block
        # one seed per call, drawn from torch's global generator (so torch.manual_seed rules);
        # block i's dropout mask comes from seed + i, so the backward pass can replay it
        self.seed = int(torch.randint(0, 2**62, (1,))) if dropout_p > 0 else 0
        self.spans = [(a, min(a + block_size, n)) for a in range(0, n, block_size)]

    def run(self, index, qb, k, v, bias_rows):
        """Output ``(B, H, b, Dv)`` and weights ``(B, H, b, M)`` of block ``index`` (weights before dropout)."""
        start, stop = self.spans[index]
        s = self.score_fn.pairwise(qb, k)  # (B, H, b, M)
        if bias_rows is not None:
            s = s + bias_rows
        w = self.norm_fn(s, _rows(self.mask, start, stop))
        wd = w
        if self.dropout_p > 0:
            g = torch.Generator(device=self.device).manual_seed(self.seed + index)
            keep = torch.rand(w.shape, generator=g, device=w.device) >= self.dropout_p
            wd = w * keep / (1.0 - self.dropout_p)
        return wd @ v, w


class _ChunkedAttention(torch.autograd.Function):
    """Query-blocked attention whose backward pass recomputes one block at a time.

    Forward: each block's output is written into one preallocated ``(B, H, N, Dv)`` tensor and
    nothing else is kept, so memory stays O(block x M). Backward: each block is recomputed
    under autograd and its gradients accumulated in place into dq, dk, dv (and the bias and
    score weights). Preallocating instead of keeping per-block autograd graphs also keeps the
    process's heap from fragmenting over thousands of blocks.
    """

    @staticmethod
    def forward(ctx, blocks: _Blocks, q, k, v, bias, *params):
        b, h, n, _ = q.shape
        out = torch.empty(b, h, n, v.shape[-1], dtype=v.dtype, device=v.device)
        src = bias if bias is not None else blocks.block_bias
        for i, (start, stop) in enumerate(blocks.spans):
            out[:, :, start:stop] = blocks.run(i, q[:, :, start:stop], k, v, _rows(src, start, stop))[0]
        ctx.blocks = blocks
        ctx.save_for_backward(q, k, v, bias, *params)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        q, k, v, bias, *params = ctx.saved_tensors
        blocks: _Blocks = ctx.blocks
        need_q, need_k, need_v, need_bias = ctx.needs_input_grad[1:5]
        need_params = ctx.needs_input_grad[5:]
        dq = torch.zeros_like(q) if need_q else None
        dk = torch.zeros_like(k) if need_k else None
        dv = torch.zeros_like(v) if need_v else None
        dbias = torch.zeros_like(bias) if need_bias else None
        dparams: list[torch.Tensor | None] = [None] * len(params)
        kd = k.detach().requires_grad_(need_k)
        vd = v.detach().requires_grad_(need_v)
        for i, (start, stop) in enumerate(blocks.spans):
            with torch.enable_grad():
                qb = q[:, :, start:stop].detach().requires_grad_(need_q)
                if bias is not None:
                    bb = _rows(bias, start, stop).detach().requires_grad_(need_bias)
                else:  # a BlockBias (its parameters are among params) or none
                    bb = _rows(blocks.block_bias, start, stop)
                out_b = blocks.run(i, qb, kd, vd, bb)[0]
                wrt = [(name, t) for name, t in (("q", qb), ("k", kd), ("v", vd)) if t.requires_grad]
                if bias is not None and need_bias:
                    wrt.append(("bias", bb))
                wrt += [(j, p) for j, p in enumerate(params) if need_params[j]]
                if not wrt:
                    continue
                grads = torch.autograd.grad(out_b, [t for _, t in wrt], grad_out[:, :, start:stop], allow_unused=True)
            for (name, _), g in zip(wrt, grads):
                if g is None:
                    continue
                if name == "q":
                    dq[:, :, start:stop] = g
                elif name == "k":
                    dk += g
                elif name == "v":
                    dv += g
                elif name == "bias":
                    if bias.dim() >= 2 and bias.shape[-2] != 1:
                        dbias[..., start:stop, :] += g
                    else:
                        dbias += g
                else:
                    dparams[name] = g if dparams[name] is None else dparams[name] + g
        return (None, dq, dk, dv, dbias, *dparams)


def _chunked(q, k, v, score_fn, norm_fn, mask, bias, dropout_p, return_weights, block_size):
    b, h, n, _ = q.shape
    m = k.shape[2]
    if block_size is None:
        per_row = b * h * m * max(int(getattr(score_fn, "pair_cost", 1)), 1)
        block_size = max(1, DEFAULT_BLOCK_ELEMENTS // per_row)
    blocks = _Blocks(score_fn, norm_fn, mask, dropout_p, n, min(block_size, n), q.device)
    if not return_weights:
        params = [p for p in score_fn.parameters() if p.requires_grad] if isinstance(score_fn, torch.nn.Module) else []
        bias_tensor = bias
        if isinstance(bias, BlockBias):
            # computed block by block from its parameters, which get their gradients that way too
            params += [p for p in bias.params if p.requires_grad]
            bias_tensor = None
        blocks.block_bias = bias if isinstance(bias, BlockBias) else None
        return AttentionResult(_ChunkedAttention.apply(blocks, q, k, v, bias_tensor, *params), None)
    # weights asked for: they are materialised anyway, so plain autograd through every block
    outs, weights = [], []
    for i, (start, stop) in enumerate(blocks.spans):
        out, w = blocks.run(i, q[:, :, start:stop], k, v, _rows(bias, start, stop))
        outs.append(out)
        weights.append(w)
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-2)
    w = weights[0] if len(weights) == 1 else torch.cat(weights, dim=-2)
    return AttentionResult(out, w.expand(b, h, n, m))
