"""The Forgetting Transformer's attention (FoX): softmax attention whose scores decay through a
data-dependent forget gate, computed exactly on the block-sparse engine of :func:`attnlab.attend`."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..core import masks
from ..core.amp import upcast
from ..core.attend import AttentionResult, attend, check_mask_or_bias
from ..core.blockmap import BlockMap
from ..core.maskfn import as_mask
from ..core.masks import key_padding_flags
from ..core.score_mods import ScoreMod, compose
from ..layers.cache import ForgetKVCache
from ..layers.multihead import MultiHeadAttention
from ..layers.step import StepInputs
from ..validate import ArgumentTypeError
from .base import Budget, check_step, register

__all__ = ["ForgettingAttention", "forget_decay", "padding_of"]


def forget_decay(c: torch.Tensor, *, causal: bool, queries: torch.Tensor | None = None) -> ScoreMod:
    """The score function ``score + D_ij`` of forgetting attention, from the cumulative log forget
    gates ``c`` ``(B, H, M)`` of the keys (``c_t = sum_{l <= t} log f_l``, per batch row and head).

    Causal: ``D_ij = c_i - c_j = sum_{l = j+1 .. i} log f_l`` (the pairs ``j > i`` are masked by
    the caller). Otherwise the same decay over the tokens between key and query in either
    direction: ``c_i - c_j`` for ``j <= i``, ``c_j - c_i`` for ``j > i`` (``-|c_i - c_j|``, as
    ``log f <= 0``). Indexed by the tokens' places in the row (``q_idx``, ``kv_idx``), so the
    gradient reaches ``c`` (and through it the gates) block by block. ``queries``: the queries'
    gates ``(B, H, N)`` where they are not the keys' (causal decoding: the new tokens, the last N
    of the held keys; the caller's mask orders them by position)."""
    if queries is not None and not causal:
        raise ValueError("forget_decay takes the queries' own gates in the causal form only (it orders query and key by index)")
    cq_all = c if queries is None else queries

    def decay(score, b, h, q_idx, kv_idx):
        cq, ck = cq_all[b, h, q_idx], c[b, h, kv_idx]
        d = cq - ck if causal else torch.where(kv_idx <= q_idx, cq - ck, ck - cq)
        return score + d

    return ScoreMod(decay, params=[c] if queries is None else [c, queries],
                    name="forget_gate" if causal else "forget_gate(both directions)")


def padding_of(mask, b: int, n: int, device) -> torch.Tensor | None:
    """``(B, N)`` True for the tokens no query may see (padding: :func:`attnlab.masks.padding`,
    :func:`attnlab.masks.valid_keys`, the tail of :class:`attnlab.masks.Documents`, a bool tensor's
    unseen keys), or None when the mask does not say (a plain callable) or there is no mask."""
    if mask is None:
        return None
    hidden = as_mask(mask.mask if isinstance(mask, BlockMap) else mask).hidden_keys(n, device)
    return None if hidden is None else hidden.to(device).expand(b, n)


@register("fox")
class ForgettingAttention(MultiHeadAttention):
    """Forgetting attention (FoX): softmax attention with a data-dependent forget gate (Lin et al. 2025, https://arxiv.org/abs/2503.02130).

    Each head ``h`` computes a forget gate per token from the layer's input,
    ``f_t = sigmoid(w_h . x_t + b_h)`` (one ``Linear(E, H)`` with bias, :attr:`fgate_proj`), and
    adds to each score the log of the product of the gates since the key:

    ``o_i = sum_{j <= i} softmax_j(q_i . k_j / sqrt(D) + sum_{l = j+1 .. i} log f_l) v_j``

    i.e. ``score + c_i - c_j`` with ``c = cumsum(log f)`` along the row (computed in at least
    float32, as the paper's code does; ``log f`` by :func:`torch.nn.functional.logsigmoid`). No
    positional encoding is needed (the decay orders the tokens), but any combines: ``rope`` is
    applied to q and k, a bias encoding's score function and a score ``bias`` add to the score
    before the decay. It is softmax attention with a score function (:func:`forget_decay`),
    computed exactly, block-sparse, by :func:`attnlab.attend` (any score, normaliser,
    mask, dropout, grouped keys; ``return_weights`` gives the weights), and equal to the
    causal ``dense`` layer in the limit ``f -> 1``.

    Masks: any. A padded token (one no query may see: :func:`padding_of`) does not forget
    (``log f = 0`` there), so padding anywhere in a row, even between real tokens, changes nothing
    for the real ones. The decay counts the tokens between key and query in the row, not their
    position values: packed documents (:class:`attnlab.masks.Documents`, positions restarting)
    need nothing more, a document being contiguous and pairs across documents masked. Positions
    are used by ``rope`` alone.

    Args:
        embed_dim, num_heads: E and H.
        causal: the paper's form: token ``i`` sees ``j <= i`` (the causal mask is combined with
            the caller's; :class:`attnlab.models.Encoder` passes ``causal=True`` to every
            non-exact variant). ``False`` (an encoder's default): every query sees every key,
            with the decay over the tokens between them in either direction (attnlab's
            bidirectional form, not in the paper; it equals the causal form for ``j <= i``).
        **options: as for :class:`attnlab.MultiHeadAttention` (``score``, ``normalize``,
            ``head_mode``, ``dropout``, ``positional``, ``max_len``, ``num_kv_heads``, ``bias``).

    Decoding (causal form): ``new_cache()`` gives a :class:`attnlab.layers.cache.ForgetKVCache`,
    every held key and value with its ``c_j``; ``n`` new tokens continue the sum,
    ``c_i = c_{seen - 1} + sum log f`` over them, and each new query scores every held key with
    ``c_i - c_j``: the outputs of the whole sequence, token by token or a few at a time, key
    padding included (:meth:`decode_heads`).

    Refuses: a key or value (it is self-attention: the gates come from the query's tokens),
    ``kdim`` / ``vdim`` other than E, a cache for the bidirectional form (a new token would change
    the decay of the held queries) or a cache of another kind, and ring attention
    (:class:`attnlab.distributed.ShardedMask`: the cumulative gates span the whole sequence; the
    step declares ``exact=False``, it is not dense attention, so
    :func:`attnlab.efficient.base.check_step` refuses it as for every such step).
    """

    name = "fox"
    capabilities = MultiHeadAttention.capabilities.but(causal="flag", cache="forget", exact=False, needs_input=True,
                                                       family="gated softmax")
    budget = Budget()  # exact in its own terms, no knob: not a point of the approximation table

    def __init__(self, embed_dim: int, num_heads: int, *, causal: bool = False, **options):
        for what in ("kdim", "vdim"):
            if options.get(what) not in (None, embed_dim):
                raise ValueError(f"the 'fox' attention is self-attention: {what} must equal embed_dim ({embed_dim}), "
                                 f"got {options[what]!r}")
        super().__init__(embed_dim, num_heads, **options)
        if not isinstance(causal, bool):
            raise ArgumentTypeError(f"causal must be a bool, got {type(causal).__name__}")
        self.causal = causal
        self.fgate_proj = nn.Linear(self.embed_dim, self.num_heads, bias=True)
        self.reset_gate()

    def reset_gate(self) -> None:
        """The paper's initialisation of the forget gate: weights ``N(0, 0.02^2)``, bias 0 (``f`` near 1/2)."""
        nn.init.normal_(self.fgate_proj.weight, std=0.02)
        nn.init.zeros_(self.fgate_proj.bias)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if getattr(self, "fgate_proj", None) is not None:  # the base constructor resets before the gate exists
            self.reset_gate()

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, causal={self.causal}"

    # ---------------------------------------------------------------- the step
    def log_forget(self, x: torch.Tensor, padding: torch.Tensor | None) -> torch.Tensor:
        """``log f`` ``(B, H, N)`` from the inputs ``x`` ``(B, N, E)``, in at least float32; 0 (no
        forgetting) at ``padding`` ``(B, N)`` (whose inputs are zeroed first, so that NaN there
        reaches neither the gates nor their gradients)."""
        if padding is not None:
            x = torch.where(padding[..., None], torch.zeros((), dtype=x.dtype, device=x.device), x)
        log_f = F.logsigmoid(upcast(self.fgate_proj(x))).transpose(1, 2)  # (B, H, N)
        if padding is not None:
            log_f = torch.where(padding[:, None, :], torch.zeros((), dtype=log_f.dtype, device=log_f.device), log_f)
        return log_f

    def attend_heads(self, q, k, v, *, mask=None, bias=None, score_mod=None, return_weights=False, state=None,
                     inputs: StepInputs | None = None) -> AttentionResult:
        """Forgetting attention on the projected heads: the gates from ``inputs.x``, ``rope`` at
        ``inputs.positions``, then :func:`attnlab.attend` with the decay composed after
        ``score_mod`` (under the causal mask and the caller's when causal); with a cache
        (``state``), :meth:`decode_heads`."""
        check_step(self, mask, bias, score_mod, return_weights)  # ring attention: refused, as for every non-exact step
        if inputs is None:
            raise ValueError("the 'fox' attention computes its forget gates from the layer's input: call the layer, "
                             "or pass inputs=StepInputs(x, positions)")
        x, pos = inputs.x, inputs.positions
        b, h, n = q.shape[0], q.shape[1], q.shape[2]
        if x.dim() != 3 or x.shape[:2] != (b, n) or k.shape[2] != n:
            raise ValueError(f"the 'fox' attention is self-attention: the input (B, N, E) and the heads must share B and N, got "
                             f"input {tuple(x.shape)}, q {tuple(q.shape)}, k {tuple(k.shape)}")
        if state is not None:
            return self.decode_heads(q, k, v, state, inputs, mask=mask, bias=bias, score_mod=score_mod,
                                     return_weights=return_weights)
        if mask is not None:
            check_mask_or_bias("mask", mask, (b, h, n, n), q.device)
        c = self.log_forget(x, padding_of(mask, b, n, x.device)).cumsum(-1)  # (B, H, N)
        pe = self.positional
        if pe is not None and pe.kind == "rotation":
            q, k = pe.rotate(q, k, pos, pos)
        if self.causal:
            mask = masks.causal() if mask is None else masks.causal() & (mask.mask if isinstance(mask, BlockMap) else mask)
        return attend(q, k, v, score=self.score, normalize=self.normalize, mask=mask,
                      score_mod=compose(score_mod, forget_decay(c, causal=self.causal)), bias=bias,
                      dropout_p=self.dropout if self.training else 0.0, return_weights=return_weights)

    def decode_heads(self, q, k, v, cache: ForgetKVCache, inputs: StepInputs, *, mask=None, bias=None, score_mod=None,
                     return_weights=False) -> AttentionResult:
        """Cached decoding: ``n`` new tokens' heads ``(B, H|G, n, D)`` after the ``seen`` held ones.

        Their gates ``log f`` from ``inputs.x`` (0 at the padding ``mask`` gives: their key padding,
        ``(B, 1, 1, n)`` or :func:`attnlab.masks.valid_keys`), ``rope`` at ``inputs.positions``
        (``seen .. seen + n - 1``), then :meth:`attnlab.layers.cache.ForgetKVCache.write` keeps
        the keys, values and ``c = c_{seen - 1} + cumsum(log f)``, and every new query ``i``
        attends to the held keys ``j <= i`` (not padding) with ``score + c_i - c_j``: for the
        query, what the whole sequence gives it. ``score_mod``: at the new and the held
        positions (the cache's bias encoding)."""
        self.check_cache(cache)  # a causal layer, and the cache its new_cache() makes
        if bias is not None:
            raise ValueError("a score bias cannot be combined with a cache (a bias encoding is applied by the layer itself)")
        b, n = q.shape[0], q.shape[2]
        valid = key_padding_flags(mask, b, n, q.device, refuse="with a cache, mask is the new tokens' key padding "
                                  "(causal order is the cache's)")
        log_f = self.log_forget(inputs.x, None if valid is None else ~valid)  # (B, H, n)
        pos = inputs.positions
        pe = self.positional
        if pe is not None and pe.kind == "rotation":  # the keys enter the cache rotated, as a KVCache's
            q, k = pe.rotate(q, k, pos, pos)
        keys, values, key_valid, kpos, c = cache.write(k, v, log_f, valid)  # c: (B, H, S), the new queries' the last n
        return attend(q, keys, values, score=self.score, normalize=self.normalize, mask=cache.mask(pos, kpos, key_valid),
                      score_mod=compose(score_mod, forget_decay(c, causal=True, queries=c[..., c.shape[-1] - n :])),
                      dropout_p=self.dropout if self.training else 0.0, return_weights=return_weights)
