"""The Forgetting Transformer's attention (FoX): softmax attention whose scores decay through a
data-dependent forget gate, computed exactly on the block-sparse engine of :func:`attnlab.attend`."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..core import masks
from ..core.amp import upcast
from ..core.attend import AttentionResult
from ..core.score_mods import ScoreMod, compose
from ..layers.cache import ForgetKVCache
from ..layers.exact import DenseStep
from ..layers.mixer import SequenceMixer, Tokens
from ..layers.step import Capabilities, StepCall
from .base import Budget, register

__all__ = ["ForgettingAttention", "forget_decay"]


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
        raise ValueError("forget_decay takes the queries' own gates in the causal form only (it orders query and key "
                         "by index)")
    cq_all = c if queries is None else queries

    def decay(score, b, h, q_idx, kv_idx):
        cq, ck = cq_all[b, h, q_idx], c[b, h, kv_idx]
        d = cq - ck if causal else torch.where(kv_idx <= q_idx, cq - ck, ck - cq)
        return score + d

    return ScoreMod(decay, params=[c] if queries is None else [c, queries],
                    name="forget_gate" if causal else "forget_gate(both directions)")


@register("fox")
class ForgettingAttention(SequenceMixer):
    """Forgetting attention (FoX): softmax attention with a data-dependent forget gate (Lin et al. 2025,
    https://arxiv.org/abs/2503.02130).

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

    Masks: any. A padded token (one no query may see: :meth:`attnlab.layers.mixer.Tokens.hidden_keys`) does not forget
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
        score, score_options, normalize, dropout: the exact attention's (:class:`attnlab.layers.exact.DenseStep`,
            held as :attr:`attention`).
        **options: every mixer's (:class:`attnlab.layers.mixer.SequenceMixer`): any positional encoding, grouped keys.

    Decoding (causal form): ``new_cache()`` gives a :class:`attnlab.layers.cache.ForgetKVCache`,
    every held key and value with its ``c_j``; ``n`` new tokens continue the sum,
    ``c_i = c_{seen - 1} + sum log f`` over them, and each new query scores every held key with
    ``c_i - c_j``: the outputs of the whole sequence, token by token or a few at a time, key
    padding included (:meth:`decode_heads`).

    Refuses, as its declaration says: a key or value (it is self-attention: the gates come from the
    query's tokens), a cache for the bidirectional form (a new token would change the decay of the held
    queries) or a cache of another kind, and ring attention
    (:class:`attnlab.distributed.ShardedMask`: the cumulative gates span the whole sequence; the
    mixer declares ``exact=False``, it is not dense attention).
    """

    capabilities = Capabilities(causal="option", masks="any", forms_scores=True, cache="forget", grouped_kv=True,
                                exact=False, mixer=True, family="gated softmax")
    budget = Budget()  # exact in its own terms, no knob: not a point of the approximation table
    no_cache_reason = "its bidirectional form's decay changes with every new token"
    renamed_keys = (("step.score.", "attention.score."), ("score.", "attention.score."), ("step.", ""))

    def __init__(self, embed_dim: int, num_heads: int, *, causal: bool = False, score="scaled_dot",
                 score_options: dict | None = None, normalize="softmax", dropout: float = 0.0, **options):
        super().__init__(embed_dim, num_heads, causal=causal, **options)
        self.attention = DenseStep(self.embed_dim, self.num_heads, score=score, score_options=score_options,
                                   normalize=normalize, dropout=dropout)
        self.fgate_proj = nn.Linear(self.embed_dim, self.num_heads, bias=True)
        self.reset_gate()

    def extra_repr(self) -> str:
        """As every mixer's, with the exact attention's score and normaliser."""
        return f"{super().extra_repr()}, score={self.attention.score_name!r}, normalize={self.attention.normalize!r}"

    def reset_gate(self) -> None:
        """The paper's initialisation of the forget gate: weights ``N(0, 0.02^2)``, bias 0 (``f`` near 1/2)."""
        nn.init.normal_(self.fgate_proj.weight, std=0.02)
        nn.init.zeros_(self.fgate_proj.bias)

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

    def _rotate(self, q, k, positions):
        pe = self.positional
        if pe is None or pe.kind != "rotation":
            return q, k
        return pe.rotate(q, k, positions, positions)

    def _score_mod(self, q_positions, k_positions):
        pe = self.positional
        return pe.score_mod(q_positions, k_positions) if pe is not None and pe.kind == "bias" else None

    def mix(self, q, k, v, tokens: Tokens, *, bias=None, return_weights: bool = False) -> AttentionResult:
        """Forgetting attention on the projected heads: the gates from ``tokens.x``, ``rope`` at
        ``tokens.positions``, then :func:`attnlab.attend` with the decay composed after the bias
        encoding's score function (under the causal mask and the call's when causal); with a
        cache, :meth:`decode_heads`."""
        tokens.check_heads(self.name, q, k, v)
        if tokens.cache is not None:
            return self.decode_heads(q, k, v, tokens, return_weights=return_weights)
        call = StepCall(mask=tokens.mask)
        mask = call.combined(masks.causal(), q) if self.causal else call.combined(None, q)
        c = self.log_forget(tokens.x, tokens.hidden_keys()).cumsum(-1)  # (B, H, N)
        pos = tokens.positions
        q, k = self._rotate(q, k, pos)
        mod = compose(self._score_mod(pos, pos), forget_decay(c, causal=self.causal))
        return self.attention.exact(q, k, v, call, mask=mask, bias=bias, return_weights=return_weights, score_mod=mod)

    def decode_heads(self, q, k, v, tokens: Tokens, *, return_weights: bool = False) -> AttentionResult:
        """Cached decoding: ``n`` new tokens' heads ``(B, H|G, n, D)`` after the ``seen`` held ones.

        ``tokens.cache`` is the :class:`attnlab.layers.cache.ForgetKVCache`. Their gates ``log f``
        from ``tokens.x`` (0 at their key padding), ``rope`` at ``tokens.positions``
        (``seen .. seen + n - 1``), then :meth:`attnlab.layers.cache.ForgetKVCache.write` keeps
        the keys, values and ``c = c_{seen - 1} + cumsum(log f)``, and every new query ``i``
        attends to the held keys ``j <= i`` (not padding) with ``score + c_i - c_j``: for the
        query, what the whole sequence gives it; a bias encoding at the new and the held positions."""
        cache = tokens.cache
        assert isinstance(cache, ForgetKVCache)  # checked: the cache its declaration names
        n = q.shape[2]
        valid = tokens.valid_keys(self.name)
        log_f = self.log_forget(tokens.x, None if valid is None else ~valid)  # (B, H, n)
        pos = tokens.positions
        q, k = self._rotate(q, k, pos)  # the keys enter the cache rotated, as a KVCache's
        keys, values, key_valid, kpos, c = cache.write(k, v, log_f, valid)  # c: (B, H, S), the new queries' the last n
        mod = compose(self._score_mod(pos, torch.arange(cache.seen, device=q.device)),
                      forget_decay(c, causal=True, queries=c[..., c.shape[-1] - n :]))
        call = StepCall(state=cache, return_weights=return_weights)
        return self.attention.exact(q, keys, values, call, mask=cache.mask(pos, kpos, key_valid), score_mod=mod)
