"""The attention step: the object a layer holds, run on its heads.

A :class:`attnlab.MultiHeadAttention` holds one step: the projections, then
``layer.step(q, k, v, call)`` on the heads, then ``W^o``. A variant of :mod:`attnlab.efficient`
is a step class (:class:`AttentionStep`), usable alone on heads as :func:`attnlab.attend` is
(:func:`attnlab.efficient.step`), or a sequence mixer, the layer itself
(:mod:`attnlab.layers.mixer`). What a step accepts is not found by
trying it: its class declares it as ``capabilities`` (:class:`Capabilities`), and every refusal
follows from the declaration in one place (:func:`check_call`), as does every list of variants
(the arena's presets, the benchmarks, ``attnlab list variants``, the transformers integration,
the docs' tables: :func:`attnlab.efficient.select`).

What one call of a step receives besides the heads is one typed value, :class:`StepCall`: the
mask, a score bias, a score function, whether to return the weights and a decoding state. The
call reads the mask for the step (:meth:`StepCall.valid_keys`, :meth:`StepCall.documents`), so
no step dispatches on the mask's type.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from ..core import spanning
from ..core.attend import AttentionResult, check_mask_or_bias
from ..core.blockmap import BlockMap
from ..core.documents import Documents
from ..core.maskfn import as_mask
from ..core.masks import causal as causal_mask
from ..core.masks import valid_key_flags
from ..validate import ArgumentTypeError, positive_int

__all__ = ["CACHES", "CAUSAL_FORMS", "AttentionStep", "Capabilities", "MASK_KINDS", "StepCall", "check_call",
           "check_decodes"]

CAUSAL_FORMS = ("mask", "option")
"""How a step is causal: ``"mask"`` — it takes any mask, so ``masks.causal()`` (exact attention), and
its option ``causal=True`` adds that mask to every call's; ``"option"`` — its method changes (a
running sum, a recurrence), so the step's option ``causal=True``."""

MASK_KINDS = ("any", "key_padding")
"""The masks a step takes: ``"any"`` mask function or tensor; ``"key_padding"``: key padding and
packed documents (:class:`attnlab.masks.Documents`) only."""

CACHES = ("kv", "window", "recurrent", "matrix", "forget")
"""What a step decodes with: ``"kv"`` — any :class:`attnlab.layers.cache.KVCache`; ``"window"`` —
the bounded KVCache that is exactly its causal pattern; ``"recurrent"`` — running sums
(:class:`attnlab.layers.cache.RecurrentState`); ``"matrix"`` — a matrix state and short
convolution (:class:`attnlab.efficient.MatrixState`); ``"forget"`` — every key and value with
its cumulative log forget gate (:class:`attnlab.layers.cache.ForgetKVCache`, FoX)."""


@dataclass(frozen=True)
class Capabilities:
    """What a variant declares it can do (a class attribute of its step or mixer, read without building it).

    Attributes:
        causal: its causal form, one of :data:`CAUSAL_FORMS`, or None (no causal form: its method
            mixes every key into every query).
        masks: the masks it takes (:data:`MASK_KINDS`).
        forms_scores: it computes every allowed score, so a score bias, a score function (bias
            encodings) and ``return_weights`` work.
        cache: what it decodes with (:data:`CACHES`), or None (no cached decoding).
        grouped_kv: it takes G < H key / value heads itself (else they arrive repeated to H).
        exact: it computes exact attention (under its pattern, for the sparse patterns).
        mixer: it is a sequence mixer (:class:`attnlab.layers.mixer.SequenceMixer`): a layer ``x -> y`` owning its
            projections (its gates read the input), self-attention only; else an attention step on heads.
        shared_qk: its keys are its queries (Reformer): no key projection, no grouped keys.
        reference: a slow reference of another variant (``dense_naive``): left out of grids.
        family: its family, for tables and grids (``"exact"``, ``"pattern"``, ``"low rank"``,
            ``"kernel"``, ``"hashing"``, ``"landmarks"``, ``"gated"``).
    """

    causal: Literal["mask", "option"] | None = "mask"
    masks: Literal["any", "key_padding"] = "any"
    forms_scores: bool = True
    cache: Literal["kv", "window", "recurrent", "matrix", "forget"] | None = "kv"
    grouped_kv: bool = True
    exact: bool = True
    mixer: bool = False
    shared_qk: bool = False
    reference: bool = False
    family: str = "exact"

    def __post_init__(self):
        if self.causal not in (*CAUSAL_FORMS, None):
            raise ValueError(f"causal must be one of {CAUSAL_FORMS} or None, got {self.causal!r}")
        if self.masks not in MASK_KINDS:
            raise ValueError(f"masks must be one of {MASK_KINDS}, got {self.masks!r}")
        if self.cache not in (*CACHES, None):
            raise ValueError(f"cache must be one of {CACHES} or None, got {self.cache!r}")

    def with_changes(self, **changes) -> Capabilities:
        """A copy with ``changes`` (a step declaring what differs from its family's)."""
        return replace(self, **changes)

    def describe(self) -> dict[str, object]:
        """The declaration as plain values (``attnlab list variants --json``)."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(frozen=True)
class StepCall:
    """What one call of an attention step receives besides the heads, in one typed value.

    Attributes:
        mask: True = may attend: a mask function (:mod:`attnlab.masks`), a block map, a bool
            tensor broadcastable to ``(B, H, N, M)``, or None. A step reads it through the call
            (:meth:`valid_keys`, :meth:`documents`), never by its type.
        bias: float, broadcastable to ``(B, H, N, M)``, added to the scores (or None).
        score_mod: a score function ``(score, b, h, q_idx, kv_idx) -> score`` (a bias encoding's), or None.
        return_weights: also return the ``(B, H, N, M)`` weights.
        state: the cache of a decoding call (a :class:`attnlab.layers.cache.KVCache` holds the
            keys given; a recurrent state is updated in place), or None.
    """

    mask: object = None
    bias: torch.Tensor | None = None
    score_mod: Callable | None = None
    return_weights: bool = False
    state: Any = None

    def kwargs(self) -> dict:
        """The call as keyword arguments (what a step hook receives; ``step(q, k, v, **kwargs)`` repeats it)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def documents(self) -> Documents | None:
        """The packed documents the mask is (:class:`attnlab.masks.Documents`: each attended alone), or None."""
        return self.mask if isinstance(self.mask, Documents) else None

    def combined(self, own, q: torch.Tensor):
        """The step's own mask ``own`` (a pattern, the causal rule) and the call's: a tensor checked
        first as exact attention reads it, ``(B, H, N, M)`` for the queries ``q`` (self-attention)."""
        mask = self.mask
        if mask is None:
            return own
        if isinstance(mask, torch.Tensor):  # read as exact attention reads it before it joins the step's own
            check_mask_or_bias("mask", mask, (q.shape[0], q.shape[1], q.shape[2], q.shape[2]), q.device)
        return mask if own is None else own & (mask.mask if isinstance(mask, BlockMap) else mask)

    def hidden_keys(self, b: int, n: int, device) -> torch.Tensor | None:
        """``(B, N)`` True for the tokens no query may see (padding: :func:`attnlab.masks.padding`,
        :func:`attnlab.masks.valid_keys`, the tail of :class:`attnlab.masks.Documents`, a bool tensor's
        unseen keys), or None when the mask does not say (a plain callable) or there is none."""
        if self.mask is None:
            return None
        hidden = as_mask(self.mask.mask if isinstance(self.mask, BlockMap) else self.mask).hidden_keys(n, device)
        return None if hidden is None else hidden.to(device).expand(b, n)

    def valid_keys(self, b: int, m: int, name: str, device) -> torch.Tensor | None:
        """The ``(B, M)`` "key is real" flags of a key-padding mask, or None for no mask; a mask
        that depends on the query (causal, window, graph) is refused, naming the step ``name``."""
        return valid_key_flags(self.mask, b, m, device, refuse=(
            f"the {name!r} attention takes key-padding masks only (attnlab.masks.padding makes them); for causal "
            "attention create it with causal=True, for any other mask use the 'dense' attention"))


def check_decodes(step: AttentionStep) -> None:
    """Refuse cached decoding where the step declares none, or where its cache needs the causal
    form (every kind but ``"kv"``: a state or a window rule only causal attention has) and the step
    is not causal."""
    if step.capabilities.cache is None:
        raise ValueError(f"the {step.name!r} attention has no cached decoding ({step.no_cache_reason}); "
                         "attnlab.efficient.select(decodes=True) names the variants that decode")
    if step.capabilities.cache != "kv" and not step.causal:
        raise ValueError(f"cached decoding needs a causal {step.name!r} attention (create it with causal=True)")


def check_call(step: AttentionStep, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: StepCall) -> None:
    """Refuse what ``step`` declares it cannot take (its ``capabilities``), one message per rule:
    the weights, a score bias or function without ``forms_scores``; a sharded sequence unless
    ``exact``; a decoding state without a declared ``cache`` (the layer's caches check their own
    kind as they begin, :meth:`attnlab.MultiHeadAttention.check_cache`) or with a score bias; other queries than keys
    where it is causal (outside decoding);
    a mask other than key padding or packed documents where it takes ``key_padding`` only."""
    caps, name = step.capabilities, step.name
    if call.return_weights and not caps.forms_scores:
        raise ValueError(f"the {name!r} attention never builds the N x M weights; use the 'dense' attention to get "
                         "them")
    if (call.bias is not None or call.score_mod is not None) and not caps.forms_scores:
        raise ValueError(f"the {name!r} attention cannot add a score bias; use the 'dense' attention")
    if call.mask is not None and spanning.spans(call.mask) and not caps.exact:
        raise ValueError(f"the {name!r} attention is not exact dense attention: ring attention (mask=ShardedMask) runs "
                         "the exact steps (attnlab.efficient.select(exact=True, reference=False))")
    if call.state is not None:
        check_decodes(step)
    if call.state is not None and call.bias is not None:
        raise ValueError("a score bias cannot be combined with a cache (a bias encoding is applied by the layer "
                         "itself)")
    if step.causal and call.state is None and q.shape[2] != k.shape[2]:
        raise ValueError(f"causal {name!r} attention needs as many queries as keys, got N={q.shape[2]}, M={k.shape[2]}")
    if caps.masks == "key_padding" and call.state is None and call.mask is not None and call.documents is None:
        call.valid_keys(q.shape[0], k.shape[2], name, q.device)  # refuses a mask that depends on the query


class AttentionStep(nn.Module):
    """An attention step: ``step(q, k, v, call)`` on heads q ``(B, H, N, D)``, k ``(B, H|G, M, D)``,
    v ``(B, H|G, M, Dv)`` -> :class:`attnlab.AttentionResult` with output ``(B, H, N, Dv)``.

    A step is a module with its own parameters (gates, projections along the sequence, random
    features, a learnable score), held by a layer (:class:`attnlab.MultiHeadAttention`'s
    ``step``) or used alone (:func:`attnlab.efficient.step`). Calling it checks the call against
    the declaration (:func:`check_call`), runs the step hooks (:meth:`register_hook`), whoever
    calls it, then :meth:`attend`, the one method a variant defines.

    Args:
        embed_dim: E, the width of the layer's input (``H x D``).
        num_heads: H.
        causal: query ``i`` sees keys ``j <= i`` only. A step whose causal form is ``"option"``
            changes its method with it; one causal by mask (exact attention) adds
            ``masks.causal()`` to every call's mask (a decoding cache is causal already). Refused
            by a step with no causal form.
    """

    name: str = "step"
    """The variant's registered name (:func:`attnlab.efficient.create`)."""

    capabilities: Capabilities = Capabilities()
    """What this step can do (see :class:`Capabilities`)."""

    no_cache_reason: str = "its pattern is not a causal prefix rule"
    """Why a step without a cache has none (the message of :meth:`attnlab.MultiHeadAttention.new_cache`)."""

    def __init__(self, embed_dim: int, num_heads: int, *, causal: bool = False):
        super().__init__()
        e, h = positive_int("embed_dim", embed_dim), positive_int("num_heads", num_heads)
        if e % h:
            raise ValueError(f"embed_dim must be divisible by num_heads, got embed_dim={e} and num_heads={h}")
        self.embed_dim, self.num_heads, self.head_dim = e, h, e // h
        if not isinstance(causal, bool):
            raise ArgumentTypeError(f"causal must be a bool, got {type(causal).__name__}")
        form = self.capabilities.causal
        if causal and form is None:
            raise ValueError(f"the {self.name!r} attention cannot be causal: its method mixes every key into every "
                             "query")
        self.causal = causal
        self._hooks: OrderedDict[int, tuple] = OrderedDict()

    def extra_repr(self) -> str:
        return f"name={self.name!r}" + (f", causal={self.causal}"
                                        if self.capabilities.causal == "option" or self.causal else "")

    def cache_bounds(self) -> tuple[int, int]:
        """``(window, sinks)`` of the bounded :class:`attnlab.layers.cache.KVCache` that is exactly
        this step's causal pattern (steps whose ``capabilities.cache`` is ``"window"``)."""
        raise NotImplementedError

    # ---------------------------------------------------------------- hooks
    def __setstate__(self, state: dict) -> None:  # a step pickled before hooks existed has none
        super().__setstate__({"_hooks": OrderedDict(), **state})

    def register_hook(self, hook: Callable, owner=None) -> RemovableHandle:
        """Call ``hook(owner, q, k, v, kwargs)`` before each call of this step, with its heads and a
        copy of its call as keyword arguments (:meth:`StepCall.kwargs`), whoever calls it (the
        layer, the transformers integration, a study). ``owner``: what the hook receives first
        (default the step; :meth:`attnlab.MultiHeadAttention.register_step_hook` passes the
        layer). The return value is ignored; the handle's ``remove()`` removes it."""
        if not callable(hook):
            raise ArgumentTypeError(f"a step hook is a callable (layer, q, k, v, kwargs), got {type(hook).__name__}")
        handle = RemovableHandle(self._hooks)
        self._hooks[handle.id] = (self if owner is None else owner, hook)
        return handle

    def clear_hooks(self) -> None:
        """Remove every step hook."""
        self._hooks.clear()

    # ---------------------------------------------------------------- the call
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: StepCall | None = None,
                **options) -> AttentionResult:
        """The step on heads: ``call`` (or its fields as keyword ``options``) checked against the
        declaration (a step causal by mask created with ``causal=True``: the causal mask joined to
        the call's), the hooks, then :meth:`attend`."""
        if call is None:
            call = StepCall(**options)
        elif options:
            raise ArgumentTypeError("give the step a StepCall or keyword options, not both")
        check_call(self, q, k, v, call)
        # causal by mask: the rule joins the call's
        if self.causal and self.capabilities.causal == "mask" and call.state is None:
            call = replace(call, mask=call.combined(causal_mask(), q))
        for owner, hook in self._hooks.values():
            hook(owner, q, k, v, call.kwargs())
        return self.attend(q, k, v, call)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: StepCall) -> AttentionResult:
        """The variant's attention on heads (the one method a variant defines); the call is checked."""
        raise NotImplementedError
