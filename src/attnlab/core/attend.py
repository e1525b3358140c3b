"""``attend(q, k, v)``: the attention core — validation, then one of three backends.

* ``"sdpa"``: softmax over a dot-product score (dot, scaled dot, cosine, bilinear — all are a
  scaled dot product after :meth:`Score.prepare`) with no weights requested, and no mask, the
  causal mask or a dense bool tensor (or any mask below :data:`DENSE_PAIRS` pairs, made dense),
  goes to :func:`torch.nn.functional.scaled_dot_product_attention`, PyTorch's fused kernel (a
  dense tensor mask costs every pair: the caller built it).
* ``"chunked"``: everything else — a mask function, a block map, any score, normaliser or score
  function — runs block-sparse (:mod:`attnlab.core.sparse`): the mask becomes a block map
  (:mod:`attnlab.core.blockmap`) and only the tiles it allows are computed, forward and
  backward, holding O(tile) scores at a time. Only ``return_weights=True`` materialises the
  full ``(B, H, N, M)`` weights, because the caller asked for them.
* ``"flex"``: on CUDA, softmax over a dot-product score under a mask function or block map
  (not the plain causal mask, which SDPA computes), with no score function, bias, dropout or
  weights, goes to FlexAttention (:mod:`attnlab.core.flex`: a ``BlockMask`` from the block map's
  tiles) once its kernel matched the block-sparse path on this GPU and dtype
  (:mod:`attnlab.core.kernels`); a refused kernel falls back to the two above with one warning.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F

from ..validate import ArgumentTypeError, probability
from . import flex, spanning
from .blockmap import BlockMap, block_map, resolve_block
from .kernels import Kernel, needs_grad, register, serves
from .maskfn import Mask, as_mask, broadcast_shape
from .masks import padding_tensor_hint
from .normalize import resolve_normalizer, softmax
from .score_mods import check_learnable, learnable_tensors
from .scores import Score, resolve_score
from .sparse import DEFAULT_BLOCK_ELEMENTS, FUSED, SparseSetup, chunk_limits, sparse_attention, sparse_weights

__all__ = ["attend", "AttentionResult", "DEFAULT_BLOCK_ELEMENTS", "FLEX", "backend_for"]


DENSE_PAIRS = 1 << 20
"""Below this many (query, key) pairs a mask function under a fused-kernel computation is made
dense and run on PyTorch's kernel: at ~1K x 1K that is faster than building and walking tiles
(measured with ``attnlab bench masks``); a block map given as the mask, or a ``block_size``,
keeps the block-sparse path."""

Backend = Literal["auto", "sdpa", "chunked", "flex"]


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
    """Raise unless ``t`` is a valid ``mask`` (a bool tensor, a mask function or a block map) or
    ``bias`` (a float tensor) for scores of shape ``target`` = (B, H, N, M) on ``device``."""
    b, h, n, m = target
    if name == "mask" and isinstance(t, BlockMap):
        t.check(b, h, n, m, device)
        return
    if name == "mask" and not isinstance(t, torch.Tensor):
        if isinstance(t, Mask) or (callable(t) and not isinstance(t, type)):
            if isinstance(t, Mask) and t.batch is not None and t.batch not in (1, b):
                raise ValueError(f"the mask is defined for {t.batch} batch rows, the batch has {b}")
            return
        raise ArgumentTypeError("mask must be a torch.Tensor broadcastable to (B, H, N, M), a mask function or a block "
                                f"map, got {_describe(t)}")
    if not isinstance(t, torch.Tensor):
        raise ArgumentTypeError(f"{name} must be a torch.Tensor broadcastable to (B, H, N, M), got {_describe(t)}")
    if name == "mask" and t.dtype != torch.bool:
        raise ArgumentTypeError(
            f"mask must have dtype torch.bool (True = this query may attend to this key), got {t.dtype}; "
            "pass additive float terms as bias="
        )
    if name == "bias" and not t.is_floating_point():
        raise ArgumentTypeError(f"bias must be a floating-point tensor (added to the scores), got dtype {t.dtype}")
    try:
        ok = t.dim() <= 4 and broadcast_shape(t.shape, target) == target
    except ValueError:
        ok = False
    if not ok:
        hint = padding_tensor_hint(tuple(t.shape), b, m) if name == "mask" else ""
        raise ValueError(f"{name} of shape {tuple(t.shape)} does not broadcast to (B, H, N, M) = {target}{hint}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but q is on {device}")


def _validate(q, k, v, mask, bias, dropout_p) -> tuple[int, int, int, int, int]:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ArgumentTypeError(f"{name} must be a torch.Tensor of shape (B, H, N|M, D), got {_describe(t)}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have rank 4, shape (B, H, N|M, D); got rank {t.dim()}, shape "
                             f"{tuple(t.shape)}")
        if not t.is_floating_point():
            raise ArgumentTypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ArgumentTypeError(f"q, k and v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
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


def backend_for(score="scaled_dot", normalize="softmax", *, head_dim: int, return_weights: bool = False) -> str:
    """The backend ``attend`` picks under ``backend="auto"`` with no mask: ``"sdpa"`` or ``"chunked"``."""
    s = resolve_score(score)
    return "sdpa" if _sdpa_scale(s, resolve_normalizer(normalize), head_dim, return_weights) is not None else "chunked"


def _sdpa_scale(score: Score, norm: Callable, head_dim: int, return_weights: bool) -> float | None:
    if return_weights or norm is not softmax:
        return None
    return score.dot_scale(head_dim)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    score: str | Score | Callable = "scaled_dot",
    normalize: str | Callable = "softmax",
    mask=None,
    score_mod: Callable | None = None,
    bias: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    return_weights: bool = False,
    backend: Backend = "auto",
    block_size=None,
) -> AttentionResult:
    """Attention ``b_i = sum_j norm_j(mod(score(q_i, k_j)) + bias_ij) v_j`` over the allowed keys.

    The textbook steps (Vaswani et al. 2017, https://arxiv.org/abs/1706.03762, eq. 1 in its
    scaled-dot/softmax form): scores ``alpha_ij = score(q_i, k_j)``, plus ``bias``, through the
    score function; pairs the mask forbids removed; ``alpha'_i. = norm(alpha_i.)``; output
    ``b_i = sum_j alpha'_ij v_j``. A query with no allowed key gets a zero output and zero
    gradients; keys and values that no query may see (padding) never reach the output, even if
    they hold NaN. Only the tiles the mask allows are computed (module docstring).

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
        mask: True = may attend. A mask function of :mod:`attnlab.masks` or any callable
            ``(b, h, q_idx, kv_idx) -> bool`` (FlexAttention's mask_mod; computed block-sparse),
            a :class:`attnlab.core.blockmap.BlockMap` (built once, reused), or a bool tensor
            broadcastable to ``(B, H, N, M)``. A mask that describes keys on other processes (a sharded sequence,
            :class:`attnlab.distributed.ShardedMask`) is computed by the attention registered for it
            (:mod:`attnlab.core.spanning`: ring attention).
        score_mod: a score function ``(score, b, h, q_idx, kv_idx) -> score`` (FlexAttention's
            score_mod; :mod:`attnlab.score_mods`: ALiBi, relative biases, soft-capping). The
            tensors it learns get exact gradients: an ``nn.Module``'s parameters, a ``ScoreMod``'s
            ``params``, and the tensors a plain function captures (closure, default arguments,
            globals, a bound method's object); one whose result depends on a learnable tensor
            it does not reach is refused.
        bias: float, broadcastable to ``(B, H, N, M)``, added to the scores.
        dropout_p: dropout on the weights (apply only in training; ``MultiHeadAttention`` does).
        return_weights: also return the ``(B, H, N, M)`` weights (this materialises them).
        backend: ``"auto"`` (default), or force ``"sdpa"`` (a mask function is made dense) /
            ``"chunked"`` (block-sparse) / ``"flex"`` (FlexAttention on any device, unchecked).
        block_size: the tile of the block-sparse path, an int or ``(q_block, kv_block)`` (default
            :data:`attnlab.core.blockmap.DEFAULT_BLOCK`; a block map keeps its own).

    Returns:
        :class:`AttentionResult` with ``output`` ``(B, H, N, Dv)`` and ``weights`` or None.
    """
    sharded = spanning.SPANNING.get(type(mask))
    if sharded is not None:  # keys live on other processes: the attention registered for that kind of mask reaches them
        return sharded(mask, q, k, v, score=score, normalize=normalize, score_mod=score_mod, bias=bias,
                       dropout_p=dropout_p, return_weights=return_weights)
    b, h, n, m, dv = _validate(q, k, v, mask, bias, dropout_p)
    score_fn = resolve_score(score)
    norm_fn = resolve_normalizer(normalize)
    if backend not in ("auto", "sdpa", "chunked", "flex"):
        raise ValueError(f"backend must be 'auto', 'sdpa', 'chunked' or 'flex', got {backend!r}")
    if block_size is not None:
        resolve_block(block_size)
        if isinstance(mask, BlockMap) and resolve_block(block_size) != mask.block:
            raise ValueError(f"block_size {block_size!r} differs from the block map's {mask.block}")
    if score_mod is not None and not callable(score_mod):
        raise ArgumentTypeError("score_mod must be a callable (score, b, h, q_idx, kv_idx) -> score, got "
                                f"{_describe(score_mod)}")
    call = _Call(score_fn, norm_fn, mask, score_mod, bias, dropout_p, return_weights, backend, block_size)
    # FlexAttention when asked for, or under "auto" on a device it serves
    served = backend == "flex" or (backend == "auto" and q.device.type in flex.SERVED_ON)
    use_flex = served and _use_flex(q, k, v, call)
    fast = not use_flex and _fast_path(q, call, n, m)
    if k.shape[1] not in (h, 0) and not ((fast or use_flex) and _grouped_fused(score_fn, mask, bias)):
        # grouped keys / values, repeated to H heads: key head g serves query heads g r .. g r + r - 1
        r = h // k.shape[1]
        k, v = k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1)
    check = getattr(score_fn, "check", None)
    if check is not None:
        check(q, k)

    if n == 0 or m == 0 or b * h == 0:
        weights = q.new_zeros(b, h, n, m)
        if v.shape[1] not in (h, 0):  # grouped values left for the fused kernel: repeat them here
            v = v.repeat_interleave(h // v.shape[1], dim=1)
        return AttentionResult(weights @ v, weights if return_weights else None)

    if use_flex:
        qp, kp = score_fn.prepare(q, k)
        bmap = flex.flex_map(mask, b, h, n, m, q.device, block_size)
        return AttentionResult(flex.flex_attend(qp, kp, v, bmap, score_fn.dot_scale(qp.shape[-1])), None)
    if fast:
        inner = mask.mask if isinstance(mask, BlockMap) else mask
        if inner is None or isinstance(inner, torch.Tensor):
            tensor_mask, causal = inner, _is_causal(inner)
        else:
            inner = as_mask(inner)
            causal = bias is None and inner.is_causal(n, m)
            tensor_mask = None if causal else inner.dense(n, m, batch=b, heads=h, device=q.device)
        if tensor_mask is not None and not causal:
            k, v = _zero_hidden(k, v, tensor_mask)
        qp, kp = score_fn.prepare(q, k)
        scale = score_fn.dot_scale(qp.shape[-1])
        out = _sdpa(qp, kp, v, None if causal else tensor_mask, bias, dropout_p, scale=scale, causal=causal)
        return AttentionResult(out, None)
    if backend == "sdpa":
        raise ValueError(
            "backend='sdpa' needs softmax over a dot-product score (dot, scaled_dot, cosine, bilinear), no score_mod "
            "and return_weights=False"
        )
    return _block_sparse(q, k, v, call)


@dataclass(frozen=True)
class _Call:
    """The options of one :func:`attend` call, resolved, as its backend choice and the block-sparse
    path read them: the score and normaliser functions, then :func:`attend`'s arguments of the same names."""

    score_fn: Any
    norm_fn: Callable
    mask: Any
    score_mod: Callable | None
    bias: torch.Tensor | None
    dropout_p: float
    return_weights: bool
    backend: str
    block_size: Any


def _use_flex(q, k, v, call: _Call) -> bool:
    """Whether FlexAttention computes this call: asked for (``backend="flex"``; refused with the
    reason where it cannot), or, under ``"auto"`` on a device FlexAttention serves (CUDA; :func:`attend` asks only
    there), where it applies and :data:`FLEX` serves."""
    score_fn, norm_fn, mask, score_mod, backend = call.score_fn, call.norm_fn, call.mask, call.score_mod, call.backend
    bias, dropout_p, return_weights, block_size = call.bias, call.dropout_p, call.return_weights, call.block_size
    why = flex.unfit(q, v, dot=_sdpa_scale(score_fn, norm_fn, 1, False) is not None, mask=mask, score_mod=score_mod,
                     bias=bias, dropout_p=dropout_p, return_weights=return_weights, block_size=block_size,
                     auto=backend == "auto")
    if backend == "flex" and why is not None:
        raise ValueError(f"backend='flex' needs {why}")
    if why is not None or backend == "flex":
        return why is None
    return serves(FLEX, q.device, q.dtype, backward=needs_grad(q, k, v, *learnable_tensors(score_fn)))


def _fast_path(q, call: _Call, n: int, m: int) -> bool:
    """Whether PyTorch's fused kernel computes this call: softmax over a dot-product score, no
    score function, and no mask, a dense tensor or the plain causal mask (or ``backend="sdpa"``)."""
    score_fn, norm_fn, mask, bias, score_mod = call.score_fn, call.norm_fn, call.mask, call.bias, call.score_mod
    return_weights, backend, block_size = call.return_weights, call.backend, call.block_size
    if backend == "chunked" or score_mod is not None or _sdpa_scale(score_fn, norm_fn, 1, return_weights) is None:
        return False
    if backend == "sdpa" or mask is None or isinstance(mask, torch.Tensor):
        return True
    if not isinstance(mask, BlockMap) and block_size is None and n * m <= DENSE_PAIRS and not spanning.spans(mask):
        return True  # small (and no tile asked for): the dense mask on the fused kernel
    if bias is not None:
        return False
    inner = mask.mask if isinstance(mask, BlockMap) else mask
    return isinstance(inner, Mask) and inner.is_causal(n, m)


def _grouped_fused(score_fn, mask, bias) -> bool:
    """Whether grouped keys / values (G < H heads) go to PyTorch's fused kernel as they are
    (``enable_gqa``): a plain scaled dot product, no bias, a mask without a head axis."""
    if bias is not None or type(score_fn).prepare is not Score.prepare:
        return False
    return not (isinstance(mask, torch.Tensor) and mask.dim() >= 3 and mask.shape[-3] != 1)


def _is_causal(mask: torch.Tensor | None) -> bool:
    """Whether ``mask`` is the square causal mask ``j <= i`` (any leading dimensions of size 1),
    which PyTorch's fused kernel computes without reading a mask (``is_causal=True``)."""
    if (mask is None or mask.dim() < 2 or mask.shape[-1] != mask.shape[-2] or mask.shape[-1] < 2
            or any(s != 1 for s in mask.shape[:-2])):
        return False
    n = mask.shape[-1]
    return torch.equal(mask.reshape(n, n), torch.ones(n, n, dtype=torch.bool, device=mask.device).tril())


def _zero_hidden(k, v, hidden_or_mask: torch.Tensor, is_hidden: bool = False):
    """k, v with the keys no query may see set to 0 (so NaN or inf there cannot leak); the same
    tensors when there are none. ``hidden_or_mask``: a ``(B, H, N, M)``-broadcastable bool mask,
    or (``is_hidden``) ``(B|1, M)`` flags of hidden keys."""
    if is_hidden:
        hidden = hidden_or_mask[:, None, :, None]  # (B|1, 1, M, 1)
    else:
        hidden = ~hidden_or_mask.any(-2).unsqueeze(-1)  # (…, M, 1)
    if not bool(hidden.any()):
        return k, v
    zero = torch.zeros((), dtype=v.dtype, device=v.device)
    return torch.where(hidden, zero, k), torch.where(hidden, zero, v)


def _sdpa(q, k, v, mask, bias, dropout_p, *, scale, causal: bool = False) -> torch.Tensor:
    # grouped keys / values, on the fused kernel
    gqa: dict[str, Any] = {"enable_gqa": True} if k.shape[1] != q.shape[1] else {}
    if bias is None and causal:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale, is_causal=True, **gqa)
    if causal:
        mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
    row_ok = None
    if mask is not None:
        row_ok = mask.any(-1, keepdim=True)  # (…, N, 1)
        if bool(row_ok.all()):
            row_ok = None
        else:
            # a row with no allowed key attends everywhere, then is zeroed: no NaN, zero gradients
            mask = mask | ~row_ok
    attn_mask = mask
    if bias is not None:
        attn_mask = bias.to(q.dtype)
        if mask is not None:
            attn_mask = attn_mask.masked_fill(~mask, float("-inf"))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale, **gqa)
    if row_ok is not None:
        out = out.masked_fill(~row_ok, 0.0)
    return out


def _block_sparse(q, k, v, call: _Call) -> AttentionResult:
    """The block-sparse path: a block map of the mask, then :mod:`attnlab.core.sparse`."""
    score_fn, norm_fn, mask, score_mod = call.score_fn, call.norm_fn, call.mask, call.score_mod
    bias, dropout_p, return_weights, block_size = call.bias, call.dropout_p, call.return_weights, call.block_size
    b, h, n, _ = q.shape
    m = k.shape[2]
    bmap = mask if isinstance(mask, BlockMap) else block_map(
        mask if mask is not None else _FULL, n, m, batch=b, heads=h, block_size=block_size, device=q.device)
    if bmap.index.device != q.device:
        bmap = bmap.to(q.device)
    k, v = _zero_hidden(k, v, bmap.hidden_keys(), is_hidden=True)
    qp, kp = score_fn.prepare(q, k)
    scale = score_fn.dot_scale(qp.shape[-1]) if norm_fn is softmax else None
    # weights: plain autograd reaches all
    params = learned_params(score_fn, score_mod, q.dtype, q.device, check=not return_weights)
    if norm_fn is softmax and not dropout_p and not return_weights:
        fused = (FUSED and q.device.type == "cpu" and scale is not None and score_mod is None and bias is None
                 and v.shape[-1] == qp.shape[-1] and q.dtype in (torch.float32, torch.float64, torch.bfloat16,
                                                                 torch.float16))
        kind = "fused" if fused else "softmax"
    else:
        kind = "generic"
    seed = int(torch.randint(0, 2**62, (1,))) if dropout_p > 0 else 0
    setup = SparseSetup(bmap, bmap.chunks(*chunk_limits(kind, bmap, b, h, score_fn)), b, h, score_fn, norm_fn,
                        score_mod, scale, kind, float(dropout_p), seed, params=params)
    if return_weights:
        out, w = sparse_weights(setup, qp, kp, v, bias)
        return AttentionResult(out, w)
    return AttentionResult(sparse_attention(setup, qp, kp, v, bias), None)


def learned_params(score_fn, score_mod, dtype: torch.dtype, device, check: bool = True) -> list[torch.Tensor]:
    """The tensors the score and the score function learn, each once: whatever
    :func:`attnlab.core.score_mods.learnable_tensors` reaches from them (a module's parameters, a
    :class:`~attnlab.core.score_mods.ScoreMod`'s ``params``, the tensors a function captures).
    With ``check``, a score function whose result depends on a learnable tensor it does not
    reach is refused (:func:`~attnlab.core.score_mods.check_learnable`): it would get no gradient."""
    params = learnable_tensors(score_fn)
    if score_mod is not None:
        mod_params = learnable_tensors(score_mod)
        if check:
            check_learnable(score_mod, mod_params, dtype, device)
        params += [p for p in mod_params if all(p is not other for other in params)]
    return params


def _chunked(q, k, v, bmap) -> torch.Tensor:
    """attnlab's own form of :data:`FLEX`: the block-sparse path under the same block map."""
    return attend(q, k, v, mask=bmap, backend="chunked").output


FLEX: Kernel = register(flex.kernel(_chunked))
"""FlexAttention for the masks on CUDA (:mod:`attnlab.core.flex`), checked against :func:`_chunked`."""

from .maskfn import Everything  # noqa: E402

_FULL = Everything()
