"""The sequence mixer: a layer ``x -> y`` that owns everything between its input and its output.

attnlab's variants come in two kinds, created by name alike (:func:`attnlab.efficient.create`):

* an **attention step** (:class:`attnlab.layers.step.AttentionStep`): ``q, k, v -> o`` on heads,
  held by :class:`attnlab.MultiHeadAttention`, which projects the heads and merges them;
* a **sequence mixer** (:class:`SequenceMixer`): the layer itself, for the variants that compute
  more than attention from the input (gates, a short convolution, an output norm): the gated
  linear-attention family, DeltaProduct, FoX. It projects its input to heads, runs its method
  (:meth:`SequenceMixer.mix`) and merges the heads with ``W^o``, as fla's layers and every hybrid
  model's mixers do.

Both take the same call (``layer(x, mask=..., positions=..., cache=...)``) and give an
:class:`attnlab.AttentionResult`; a mixer is self-attention (no ``key`` or ``value``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.hooks import RemovableHandle

from ..core import spanning
from ..core.attend import AttentionResult
from ..core.documents import Documents
from ..core.masks import positions_of
from ..positional.base import check_positions
from ..validate import ArgumentTypeError, positive_int
from . import checks, migration, projection
from .budget import Budget
from .decoding import new_tokens, seen_positions
from .padding import silence_padding
from .state import check_kind, make_cache
from .step import Capabilities, StepCall

__all__ = ["SequenceMixer", "Tokens"]


@dataclass
class Tokens:
    """What one call of a mixer mixes besides its heads.

    Attributes:
        x: ``(B, N, E)`` the input (rows no query may see: non-finite entries zeroed).
        positions: ``(N,)`` or ``(B, N)`` the tokens' positions (given, the mask's, a cache's, or ``0..N-1``).
        mask: the call's mask; with a cache, the new tokens' key padding ``(B, 1, 1, N)`` or None.
        cache: the decoding cache (written in place), or None.
    """

    x: torch.Tensor
    positions: torch.Tensor
    mask: Any = None
    cache: Any = None

    @property
    def documents(self) -> Documents | None:
        """The packed documents the mask is (each mixed alone), or None."""
        return self.mask if isinstance(self.mask, Documents) else None

    def valid_keys(self, name: str) -> torch.Tensor | None:
        """The ``(B, N)`` "token is real" flags of a key-padding mask, or None; another mask is
        refused, naming ``name``."""
        if self.mask is None:
            return None
        b, n = self.x.shape[:2]
        return StepCall(mask=self.mask).valid_keys(b, n, name, self.x.device)  # a step's reading, its refusal

    def check_heads(self, name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Refuse heads that are not these tokens' (a mixer is self-attention: its input and its heads share B and N),
        naming ``name``."""
        b, n = self.x.shape[:2]
        if (q.shape[0], q.shape[2]) != (b, n) or k.shape[2] != n or v.shape[2] != n:
            raise ValueError(f"the {name!r} attention is self-attention: the input (B, N, E) and the heads must "
                             f"share B and N, got input {tuple(self.x.shape)}, q {tuple(q.shape)}, "
                             f"k {tuple(k.shape)}, v {tuple(v.shape)}")

    def hidden_keys(self) -> torch.Tensor | None:
        """``(B, N)`` True for the tokens no query may see (padding), or None when the mask does not say."""
        b, n = self.x.shape[:2]
        return StepCall(mask=self.mask).hidden_keys(b, n, self.x.device)


class SequenceMixer(nn.Module):
    """Base class of the sequence mixers (see the module): the projections ``W^q, W^k, W^v, W^o``
    (drawn as :class:`attnlab.MultiHeadAttention` draws them, so a seeded layer's weights do not
    depend on its kind), the positional encoding, the checks of a call, the step hooks; a
    subclass defines :meth:`mix` and declares ``capabilities``.

    Args:
        embed_dim: E, the width of the input and the output.
        num_heads: H; must divide E.
        causal: query ``i`` mixes tokens ``j <= i`` only (the variant's causal form); refused by a
            mixer with none.
        bias: learn additive biases in the projections.
        positional: a positional encoding by name or a :class:`attnlab.positional.PositionalEncoding`:
            an input encoding is added to the input before the projections; ``rope`` is applied by
            the mixer where its method says (after a short convolution).
        positional_options: keyword options for an encoding given by name.
        max_len: the longest sequence, for encodings bounded by it (``learned``).
        num_kv_heads: G, the key / value heads (default H; must divide H), repeated to H unless
            the mixer takes them grouped.
    """

    name: str = "mixer"
    """The variant's registered name (:func:`attnlab.efficient.create`)."""

    capabilities: Capabilities = Capabilities(causal="option", masks="key_padding", forms_scores=False, cache=None,
                                              grouped_kv=False, exact=False, mixer=True, family="mixer")
    """What this mixer can do (see :class:`attnlab.layers.step.Capabilities`)."""

    budget: Budget = Budget()
    """Not an approximation of softmax: no budget (see :class:`attnlab.layers.budget.Budget`)."""

    no_cache_reason: str = "its method is not causal"
    """Why a mixer without a cache has none (the message of :meth:`new_cache`)."""

    head_mode = "split"  # one projection of width E, split into H heads (the only form a mixer has)

    renamed_keys: tuple[tuple[str, str], ...] = (("step.scan.", ""), ("step.", ""))
    """How the keys of a checkpoint written when a layer held this mixer's parameters as its ``step``
    are renamed (:func:`attnlab.layers.migration.mixer_keys`)."""

    def __init__(self, embed_dim: int, num_heads: int, *, causal: bool = False, bias: bool = True,
                 positional=None, positional_options: dict | None = None, max_len: int | None = None,
                 num_kv_heads: int | None = None):
        super().__init__()
        e, h = positive_int("embed_dim", embed_dim), positive_int("num_heads", num_heads)
        if e % h:
            raise ValueError(f"embed_dim must be divisible by num_heads, got embed_dim={e} and num_heads={h}")
        g = h if num_kv_heads is None else positive_int("num_kv_heads", num_kv_heads)
        if h % g:
            raise ValueError(f"num_kv_heads must divide num_heads, got num_kv_heads={g} and num_heads={h}")
        if not isinstance(causal, bool):
            raise ArgumentTypeError(f"causal must be a bool, got {type(causal).__name__}")
        if causal and self.capabilities.causal is None:
            raise ValueError(f"the {self.name!r} attention cannot be causal: its method mixes every key into every "
                             "query")
        self.embed_dim, self.num_heads, self.head_dim, self.num_kv_heads = e, h, e // h, g
        self.kdim = self.vdim = e
        self.query_heads = h  # the heads q_proj and k_proj give (Mamba-2's grouped B and C: its groups)
        self.positional = checks.make_positional(self, positional, positional_options, max_len)
        checks.check_positional(self, self.positional)
        self.q_proj = nn.Linear(e, e, bias=bias)
        self.k_proj = nn.Linear(e, g * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(e, g * self.head_dim, bias=bias)
        self.out_proj = nn.Linear(e, e, bias=bias)
        self.reset_parameters()
        self.causal = causal
        self._hooks: OrderedDict[int, tuple] = OrderedDict()
        self.register_load_state_dict_pre_hook(migration.mixer_keys)

    def reset_parameters(self) -> None:
        """Xavier-uniform projections and zero biases, as ``torch.nn.MultiheadAttention``."""
        projection.init_projections(self.q_proj, self.k_proj, self.v_proj, self.out_proj)

    def extra_repr(self) -> str:
        """The mixer's name and causal form, in its ``repr``."""
        return f"name={self.name!r}, causal={self.causal}"

    def __setstate__(self, state: dict) -> None:  # a mixer pickled without hooks has none
        super().__setstate__({"_hooks": OrderedDict(), **state})

    # ---------------------------------------------------------------- the call
    def forward(self, query: torch.Tensor, key: torch.Tensor | None = None, value: torch.Tensor | None = None, *,
                mask=None, bias: torch.Tensor | None = None, return_weights: bool = False,
                positions: torch.Tensor | None = None, key_positions: torch.Tensor | None = None,
                cache=None) -> AttentionResult:
        """Mix the tokens of ``query`` ``(B, N, E)``: the projections, :meth:`mix`, then ``W^o``.

        Args:
            query: ``(B, N, E)``; key, value: refused (a mixer is self-attention).
            mask: key padding (:func:`attnlab.masks.padding`), packed documents
                (:class:`attnlab.masks.Documents`), or what the mixer's ``capabilities.masks`` take.
            bias, return_weights: for a mixer that forms scores (``capabilities.forms_scores``).
            positions: ``(N,)`` or ``(B, N)`` the tokens' positions (default: the mask's, else ``0..N-1``).
            key_positions: must equal ``positions`` (its keys are its queries), or be left out.
            cache: decode with a cache from :meth:`new_cache` (``query``: the new tokens only).
        """
        if key is not None or value is not None:
            raise ValueError(f"the {self.name!r} attention is self-attention: pass neither key nor value (it mixes the "
                             "tokens of its input)")
        projection.check_input(self, "query", query, self.embed_dim, None)
        if not self.capabilities.forms_scores and (return_weights or bias is not None):
            self._refuse_scores(return_weights)
        tokens = self.tokens(query, mask, positions, key_positions, bias, cache)
        q, k, v = self.heads(tokens.x, tokens.positions)
        for _, hook in self._hooks.values():
            hook(self, q, k, v, {"mask": tokens.mask, "bias": bias, "score_mod": None, "return_weights": return_weights,
                                 "state": cache})
        res = self.mix(q, k, v, tokens, bias=bias, return_weights=return_weights)
        return AttentionResult(self.merge_heads(res.output), res.weights)

    def _refuse_scores(self, return_weights: bool) -> None:
        if return_weights:
            raise ValueError(f"the {self.name!r} attention never builds the N x M weights; use the 'dense' attention "
                             "to get them")
        raise ValueError(f"the {self.name!r} attention cannot add a score bias; use the 'dense' attention")

    def tokens(self, query, mask, positions, key_positions, bias, cache) -> Tokens:
        """The call's :class:`Tokens`: the input with its padding rows silenced and the positions; with a cache, the
        new tokens after the ``cache.seen`` held ones (their mask: their key padding, ``(B, 1, 1, n)``)."""
        if cache is not None:
            valid = new_tokens(self, query, None, None, mask, positions, key_positions, bias, refuse=(
                "with a cache, mask is the new tokens' key padding (causal order is the cache's)"))
            self.check_cache(cache)
            at = seen_positions(cache.seen, query.shape[1], query.device)
            mask = None if valid is None else valid[:, None, None, :]
            return Tokens(silence_padding(query, None, None, mask)[0], at, mask, cache)
        if mask is not None and spanning.spans(mask) and not self.capabilities.exact:
            raise ValueError(f"the {self.name!r} attention is not exact dense attention: ring attention "
                             "(mask=ShardedMask) runs the exact steps (attnlab.efficient.select(exact=True, "
                             "reference=False))")
        n = query.shape[1]
        if key_positions is not None and (positions is None or not torch.equal(positions, key_positions)):
            raise ValueError(f"the {self.name!r} attention is self-attention: its keys are its queries, so "
                             "key_positions must equal positions (or be left out)")
        if positions is not None:  # the positions given, else the mask's, else 0..N-1
            at = check_positions(positions, n, "positions").to(query.device)
        else:
            found = None if mask is None else positions_of(mask, n, query.device)
            at = torch.arange(n, device=query.device) if found is None else found
        if mask is None:
            return Tokens(query, at)
        return Tokens(silence_padding(query, None, None, mask)[0], at, mask)

    def heads(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q ``(B, H, N, D)``, k and v ``(B, H, N, D)`` (``(B, G, N, D)`` where the mixer takes grouped keys; q and k of
        the widths of ``q_proj`` and ``k_proj``) from the input, in one product ``x [W^q; W^k; W^v]^T``, an input
        encoding added first; no rotation (the mixer rotates where its method says)."""
        pe = self.positional
        if pe is not None and pe.kind == "input":
            x = pe.add_to(x, positions)
        b, n, _ = x.shape
        projs = [self.q_proj, self.k_proj, self.v_proj]
        w, bias = projection.fused_weights(self, projs)
        q, k, v = F.linear(x, w, bias).split([p.out_features for p in projs], dim=-1)
        qh = self.query_heads
        kh = self.num_kv_heads if qh == self.num_heads else qh
        q, k, v = (t.view(b, n, h, t.shape[-1] // h).transpose(1, 2)
                   for t, h in ((q, qh), (k, kh), (v, self.num_kv_heads)))
        r = self.num_heads // self.num_kv_heads
        if r > 1 and not self.capabilities.grouped_kv:
            k, v = k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1)
        return q, k, v

    def mix(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tokens: Tokens, *, bias=None,
            return_weights: bool = False) -> AttentionResult:
        """The mixer's method on its heads: q ``(B, H, N, D)``, k and v, and the call's :class:`Tokens` -> the heads'
        outputs ``(B, H, N, Dv)`` (and the weights, for a mixer that forms scores)."""
        raise NotImplementedError

    merge_heads = projection.merge_heads

    def check_input(self, name: str, x, width: int, batch: int | None) -> None:
        """Refuse an input that is not a ``(B, N, width)`` tensor of this layer's dtype."""
        projection.check_input(self, name, x, width, batch)

    # ---------------------------------------------------------------- decoding and hooks
    def new_cache(self, *, window: int | None = None, sinks: int = 0, positions: str = "absolute"):
        """An empty cache for decoding, of the kind the mixer declares (``capabilities.cache``): pass it as
        ``layer(x_new, cache=cache)``; ``window``, ``sinks`` and ``positions`` are refused (its state is its own)."""
        return make_cache(self, window, sinks, positions)

    def check_cache(self, cache) -> None:
        """Refuse a cache other than the kind :meth:`new_cache` makes."""
        check_kind(self, cache)

    def register_step_hook(self, hook: Callable) -> RemovableHandle:
        """Call ``hook(layer, q, k, v, kwargs)`` before each call's method, with the projected heads (before any short
        convolution and rotation) and the call as keyword arguments (``mask``, ``bias``, ``score_mod``: None, a mixer
        applies its positional encoding in its method; ``return_weights``, ``state``). The handle's ``remove()``
        removes it."""
        if not callable(hook):
            raise ArgumentTypeError(f"a step hook is a callable (layer, q, k, v, kwargs), got {type(hook).__name__}")
        handle = RemovableHandle(self._hooks)
        self._hooks[handle.id] = (self, hook)
        return handle

    def clear_step_hooks(self) -> None:
        """Remove every step hook."""
        self._hooks.clear()
