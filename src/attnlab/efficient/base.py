"""The interface of the efficient (approximate or sparse) attention variants, and their registry.

Every variant is a :class:`attnlab.MultiHeadAttention` whose attention step is replaced: the
same projections ``W^q, W^k, W^v, W^o`` (so weights load from a dense layer, and the exact
limits can be tested with identical weights), the same call signature and the same
:class:`attnlab.AttentionResult` output. What a variant cannot do it refuses with a clear error
instead of silently computing something else:

* masks: a key-padding mask (:func:`attnlab.masks.padding`, a ``(B, 1, 1, M)`` tensor) is
  accepted by every variant, and packed documents (:class:`attnlab.masks.Documents`: each
  document attended alone); causal attention is a constructor option (``causal=True``) for the
  variants whose method allows it (their method changes with it: causal linear attention is a
  running sum); any other mask needs exact attention. The sparse patterns (``local``,
  ``longformer``, ``bigbird``) are exact attention under their pattern's mask
  (:class:`PatternAttention`): they take any mask, score function and return their weights;
* a score bias (ALiBi, relative): refused by the approximations — rotation (``rope``) and input
  encodings work;
* ``return_weights=True``: refused by the approximations — they never build the ``N x M`` weights.

Each variant declares what its step can do as its class attribute ``capabilities``
(:class:`attnlab.layers.step.Capabilities`): its causal form, the masks it takes, whether it
forms scores, what it decodes with, grouped keys, exactness, whether it reads the layer's input.
The refusals above follow from the declaration (:func:`check_step`), and so does every list of
variants: :func:`select` filters the registry by it.

Each variant also carries its :class:`Budget` (the class attribute ``budget``): the settings
that make it efficient at short and at long lengths and the budget axis the approximation
table sweeps. The arena, the scaling benchmark and the approximation table read them from
here (:func:`budget`, :func:`budgets`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import torch

from ..core import spanning
from ..core.attend import AttentionResult, attend, check_mask_or_bias
from ..core.documents import Documents
from ..core.masks import key_padding_flags
from ..layers.cache import KVCache
from ..layers.multihead import HeadMode, MultiHeadAttention
from ..layers.state import RecurrentState
from ..layers.step import Capabilities
from ..registry import Registry
from ..validate import ArgumentTypeError

__all__ = ["VARIANTS", "Budget", "DenseAttention", "EfficientAttention", "PatternAttention", "Sweep", "budget", "budgets",
           "capabilities", "check_documents", "check_step", "create", "documents", "key_padding", "names", "per_document", "register",
           "select"]


@dataclass(frozen=True)
class Sweep:
    """A variant's budget axis in the approximation table (:mod:`attnlab.studies.approximation`).

    Args:
        option: the option swept; None for a variant without a budget (one point, value 0).
        values: the values measured (the table caps them at N).
        label: the table's name for the axis, with the settings held fixed.
        fixed: the other options, held fixed along the axis.
        seeded: the variant draws random features, hashes or blocks: each draw passes ``seed=``.
    """

    option: str | None
    values: tuple[int, ...]
    label: str
    fixed: Mapping[str, object] = field(default_factory=dict)
    seeded: bool = False

    def __post_init__(self):
        object.__setattr__(self, "values", tuple(self.values))
        object.__setattr__(self, "fixed", MappingProxyType(dict(self.fixed)))

    def options(self, value: int, seed: int) -> dict:
        """The variant's options at one point ``value`` of the axis, for the draw ``seed``."""
        out = dict(self.fixed)
        if self.option is not None:
            out[self.option] = value
        if self.seeded:
            out["seed"] = seed
        return out


@dataclass(frozen=True)
class Budget:
    """What makes a variant efficient, in one place: read by the arena (``short``), the scaling
    benchmark (``long``) and the approximation table (``sweep``).

    Args:
        short: options at short lengths (the arena's tasks, 16-130 vectors): short windows and
            small budgets, so that the variant is cheaper than dense there and its trade-off shows.
        long: options at long lengths (the scaling benchmark, N in the thousands); None leaves
            the variant out of that benchmark (``dense_naive``: its N x N weights do not fit there).
        sweep: the budget axis of the approximation table; None leaves the variant out of it.
        max_len: the variant is built for a fixed longest sequence: the benchmarks pass
            ``max_len`` (their longest N) with ``long`` and ``sweep`` (the arena's models pass
            their own).
    """

    short: Mapping[str, object] = field(default_factory=dict)
    long: Mapping[str, object] | None = field(default_factory=dict)
    sweep: Sweep | None = None
    max_len: bool = False

    def __post_init__(self):
        object.__setattr__(self, "short", MappingProxyType(dict(self.short)))
        if self.long is not None:
            object.__setattr__(self, "long", MappingProxyType(dict(self.long)))

    def long_options(self, max_len: int) -> dict:
        """``long`` as keyword options for sequences up to ``max_len``."""
        if self.long is None:
            raise ValueError("this variant has no settings for long sequences (Budget.long is None)")
        out = dict(self.long)
        if self.max_len:
            out["max_len"] = max_len
        return out

    def sweep_options(self, value: int, *, n: int, seed: int) -> dict:
        """The options at point ``value`` of ``sweep`` for sequences of length ``n`` and the draw
        ``seed`` (``{}`` without a sweep)."""
        if self.sweep is None:
            return {}
        out = {"max_len": n} if self.max_len else {}
        out.update(self.sweep.options(value, seed))
        return out


def key_padding(mask: torch.Tensor | None, b: int, m: int, name: str, device) -> torch.Tensor | None:
    """The ``(B, M)`` bool "key is real" tensor of a key-padding mask, or None for no mask.

    Raises ``ValueError`` for a mask that depends on the query (causal, window, graph): the
    variant ``name`` cannot apply it.
    """
    return key_padding_flags(mask, b, m, device, refuse=(
        f"the {name!r} attention takes key-padding masks only (attnlab.masks.padding makes them); for causal attention "
        "create it with causal=True, for any other mask use the 'dense' attention"))


def check_step(layer, mask, bias, score_mod, return_weights) -> None:
    """Refuse what ``layer``'s step declares it cannot take (its ``capabilities``): a score bias, a
    score function and the weights without ``forms_scores``, a sharded sequence unless exact."""
    caps, name = layer.capabilities, layer.name
    if return_weights and not caps.forms_scores:
        raise ValueError(f"the {name!r} attention never builds the N x M weights; use the 'dense' attention to get them")
    if (bias is not None or score_mod is not None) and not caps.forms_scores:
        raise ValueError(f"the {name!r} attention cannot add a score bias; use the 'dense' attention")
    if spanning.spans(mask) and not caps.exact:
        raise ValueError(f"the {name!r} attention is not exact dense attention: ring attention (mask=ShardedMask) runs the "
                         f"exact layers ({', '.join(select(exact=True, reference=False))})")


def documents(mask) -> bool:
    """Whether ``mask`` is packed documents (:class:`attnlab.masks.Documents`): each attended alone."""
    return isinstance(mask, Documents)


def check_documents(layer, docs) -> None:
    """``ValueError`` unless packed documents ask for the layer's own pattern (causal as the layer,
    no window): a variant attends each document with its method, not the mask's rule."""
    causal = getattr(layer, "causal", False)
    if docs.window is not None or docs.causal != causal:
        raise ValueError(f"the {layer.name} layer (causal={causal}) attends packed documents with its own pattern: "
                         f"give Documents(causal={causal}) without a window")


def per_document(layer, run: Callable, docs, heads: tuple[torch.Tensor, ...], x: torch.Tensor | None = None) -> torch.Tensor:
    """Packed documents, each alone: ``run(*heads, x)`` on every document's positions (documents of
    one length stacked into one call), padding left at zero. ``heads``: ``(B, ., N, .)`` tensors
    (the first is the queries, the last the values: the output has the values' heads, as many as
    ``run`` returns, where the queries may come in fewer, grouped); ``x``: ``(B, N, .)`` or None,
    sliced alike."""
    check_documents(layer, docs)
    q = heads[0]
    out = None
    by_length: dict[int, list[tuple[int, int]]] = {}
    for row, start, n in docs.segments(q.shape[2]):
        by_length.setdefault(n, []).append((row, start))
    for n, where in by_length.items():
        def take(t, dim, n=n, where=where):
            return torch.stack([t.narrow(dim - 1, s, n)[r] for r, s in where])

        res = run(*(take(t, 3) for t in heads), None if x is None else take(x, 2))
        if out is None:
            out = q.new_zeros(q.shape[0], res.shape[1], q.shape[2], res.shape[-1])
        for j, (r, s) in enumerate(where):
            out[r, :, s : s + n] = res[j]
    return q.new_zeros(q.shape[0], heads[-1].shape[1], q.shape[2], heads[-1].shape[-1]) if out is None else out


class EfficientAttention(MultiHeadAttention):
    """Base class: multi-head attention whose attention step is an efficient variant.

    Subclasses declare ``capabilities`` and implement :meth:`efficient` on projected heads (and,
    with ``capabilities.cache == "recurrent"``, :meth:`recurrent_attend`); :meth:`attend_heads`
    around them refuses what the declaration excludes, runs packed documents one by one and
    silences padded keys.

    Args:
        embed_dim, num_heads, kdim, vdim, bias, head_mode, positional, positional_options, max_len: as for
            :class:`attnlab.MultiHeadAttention` (the score is the scaled dot product and the
            normaliser softmax, which the variants approximate).
        causal: each query attends only to keys at or before its position.
    """

    name: str = "efficient"
    capabilities = Capabilities(causal="flag", masks="key_padding", forms_scores=False, cache=None, grouped_kv=False, exact=False,
                                family="approximation")

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        causal: bool = False,
        kdim: int | None = None,
        vdim: int | None = None,
        bias: bool = True,
        head_mode: HeadMode = "split",
        positional=None,
        positional_options: dict | None = None,
        max_len: int | None = None,
        num_kv_heads: int | None = None,
    ):
        super().__init__(
            embed_dim,
            num_heads,
            kdim=kdim,
            vdim=vdim,
            bias=bias,
            head_mode=head_mode,
            positional=positional,
            positional_options=positional_options,
            max_len=max_len,
            num_kv_heads=num_kv_heads,
        )
        if causal and self.capabilities.causal is None:
            raise ValueError(f"the {self.name!r} attention cannot be causal: its method mixes every key into every query")
        self.causal = bool(causal)
        if self.positional is not None and self.positional.kind == "bias" and not self.capabilities.forms_scores:
            raise ValueError(
                f"the {self.name!r} attention never forms the scores a bias encoding would add to; "
                f"use rope or an input encoding, or the 'dense' attention for {self.positional.name!r}"
            )

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, causal={self.causal}"

    def attend_heads(self, q, k, v, *, mask=None, bias=None, score_mod=None, return_weights=False, state=None,
                     inputs=None) -> AttentionResult:
        check_step(self, mask, bias, score_mod, return_weights)
        b, _, n, _ = q.shape
        m = k.shape[2]
        if isinstance(state, RecurrentState):  # decoding: the new tokens' key padding only
            return AttentionResult(self.recurrent_attend(q, k, v, state, key_padding_flags(mask, b, m, q.device)))
        if self.causal and n != m:
            raise ValueError(f"causal {self.name!r} attention needs as many queries as keys, got N={n}, M={m}")
        if documents(mask):
            return AttentionResult(per_document(self, lambda q, k, v, _: self.efficient(q, k, v, None), mask, (q, k, v)))
        valid = key_padding(mask, b, m, self.name, q.device)
        if n == 0 or m == 0:
            return AttentionResult(q.new_zeros(b, q.shape[1], n, v.shape[-1]))
        if valid is not None:  # padded keys and values: zeroed, so that NaN there cannot leak
            keep = valid[:, None, :, None]
            zero = torch.zeros((), dtype=k.dtype, device=k.device)
            k, v = torch.where(keep, k, zero), torch.where(keep, v, zero)
        out = self.efficient(q, k, v, valid)
        if valid is not None:  # a set with no real key: zeros, as everywhere in attnlab
            out = out.masked_fill(~valid.any(-1)[:, None, None, None], 0.0)
        return AttentionResult(out)

    def efficient(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
        """The variant's attention: q ``(B, H, N, D)``, k ``(B, H, M, D)``, v ``(B, H, M, Dv)``,
        ``valid`` ``(B, M)`` bool or None -> ``(B, H, N, Dv)``. ``self.causal`` says whether
        query ``i`` may see only keys ``j <= i``."""
        raise NotImplementedError

    def recurrent_attend(self, q, k, v, state: RecurrentState, valid) -> torch.Tensor:
        """Decoding over a :class:`attnlab.layers.state.RecurrentState` (``capabilities.cache ==
        "recurrent"``): q ``(B, H, n, D)``, k, v of the new tokens, ``valid`` their padding; the
        state is updated in place."""
        raise NotImplementedError


class PatternAttention(EfficientAttention):
    """Exact attention under a fixed sparse pattern: ``local``, ``longformer``, ``bigbird``.

    The pattern is a mask (:meth:`pattern_mask`, plus causal when ``causal=True``) combined with
    the caller's, and attention is :func:`attnlab.attend` over it: block-sparse, so the tiles
    outside the pattern are never computed, any score, normaliser, score function or mask works,
    and ``return_weights`` gives the (mostly zero) weights. Subclasses define
    :meth:`pattern_mask` (and :meth:`cache_bounds`, the bounded cache that is their causal pattern).
    """

    capabilities = Capabilities(causal="flag", masks="any", forms_scores=True, cache="window", grouped_kv=True, exact=True,
                                family="pattern")

    def pattern_mask(self):
        """The pattern as a mask (:mod:`attnlab.masks`), without the causal part."""
        raise NotImplementedError

    def full_pattern(self):
        """The pattern with the causal rule when the layer is causal."""
        from ..core import masks

        pat = self.pattern_mask()
        return masks.causal() & pat if self.causal else pat

    def pattern(self, n: int) -> torch.Tensor:
        """The ``(n, n)`` bool mask of who attends to whom at length n."""
        return self.full_pattern().dense(n)

    def attend_heads(self, q, k, v, *, mask=None, bias=None, score_mod=None, return_weights=False, state=None,
                     inputs=None) -> AttentionResult:
        if isinstance(state, KVCache):  # decoding: the cache holds exactly what the causal pattern keeps, its mask says the rest
            return MultiHeadAttention.attend_heads(self, q, k, v, mask=mask, score_mod=score_mod, return_weights=return_weights)
        n, m = q.shape[2], k.shape[2]
        if n != m:
            raise ValueError(f"this attention relates positions: it needs as many keys as queries, got N={n}, M={m}")
        if isinstance(mask, torch.Tensor):  # the caller's tensor read as exact attention reads it, checked before it joins the pattern
            check_mask_or_bias("mask", mask, (q.shape[0], q.shape[1], n, m), q.device)
        pat = self.full_pattern()
        return attend(q, k, v, score=self.score, normalize=self.normalize, mask=pat if mask is None else pat & mask, score_mod=score_mod,
                      bias=bias, dropout_p=self.dropout if self.training else 0.0, return_weights=return_weights, block_size=self.block)


# ---------------------------------------------------------------------------- registry
VARIANTS: Registry[type[MultiHeadAttention]] = Registry("attention")
"""Every attention variant by name (``"dense"`` is the exact layer)."""

class DenseAttention(MultiHeadAttention):
    """The exact layer as the registry's ``"dense"`` variant: :class:`attnlab.MultiHeadAttention`
    unchanged, with the :class:`Budget` every variant carries (exact: nothing to budget)."""

    budget = Budget()


VARIANTS.add("dense", DenseAttention)


def register(name: str):
    """Class decorator: make a variant available as ``create(name, ...)``."""
    return VARIANTS.register(name)


def names() -> list[str]:
    """The names :func:`create` accepts, sorted (``"dense"`` is the exact layer)."""
    return VARIANTS.names()


def capabilities(name: str) -> Capabilities:
    """What the variant ``name``'s attention step declares it can do (its class's ``capabilities``)."""
    found = getattr(VARIANTS.get(name), "capabilities", None)
    if not isinstance(found, Capabilities):
        raise ArgumentTypeError(f"the {name!r} attention declares no capabilities: give its class a Capabilities as the "
                                "attribute 'capabilities'")
    return found


def select(*, causal: bool | None = None, decodes: bool | None = None, exact: bool | None = None, forms_scores: bool | None = None,
           needs_input: bool | None = None, reference: bool | None = None, family: str | None = None) -> list[str]:
    """The registered variants whose declared :class:`attnlab.layers.step.Capabilities` match, in
    the order they were registered (``"dense"`` first); every criterion left None matches all.

    Args:
        causal: has a causal form (either by mask or by ``causal=True``).
        decodes: has cached decoding (``capabilities.cache`` is set).
        exact: computes exact attention (under its pattern).
        forms_scores: forms every allowed score (bias, score functions, weights).
        needs_input: its step reads the layer's input (gates).
        reference: a slow reference of another variant (``dense_naive``).
        family: its family (``"exact"``, ``"pattern"``, ``"gated"``, ...).
    """
    def keep(c: Capabilities) -> bool:
        return all(want is None or have == want for want, have in (
            (causal, c.causal is not None), (decodes, c.cache is not None), (exact, c.exact), (forms_scores, c.forms_scores),
            (needs_input, c.needs_input), (reference, c.reference), (family, c.family)))

    return [n for n in VARIANTS.in_order() if keep(capabilities(n))]


def budget(name: str) -> Budget:
    """The :class:`Budget` of the variant ``name`` (its class attribute ``budget``)."""
    found = getattr(VARIANTS.get(name), "budget", None)
    if not isinstance(found, Budget):
        raise ArgumentTypeError(f"the {name!r} attention has no budget: give its class a Budget as the attribute 'budget'")
    return found


def budgets() -> dict[str, Budget]:
    """Every variant's :class:`Budget` by name, in the order the variants were registered
    (dense first, then the sparse patterns, low rank, kernels, hashing, landmarks): the order of
    the arena's, the scaling benchmark's and the approximation table's variants."""
    return {n: budget(n) for n in VARIANTS.in_order()}


def create(name: str, *, embed_dim: int, num_heads: int, **options) -> MultiHeadAttention:
    """Create the attention ``name`` (see :func:`names`).

    ``"dense"`` is :class:`DenseAttention`, the exact :class:`attnlab.MultiHeadAttention` (its
    options apply; ``causal=True`` is not one: give it a causal mask). Every other name is an :class:`EfficientAttention` with
    the same call signature and output.

    Args:
        name: the variant.
        embed_dim: E. num_heads: H.
        **options: the variant's keyword options (``causal=``, ``window=``, ``num_features=``, ...).
    """
    return VARIANTS.create(name, embed_dim, num_heads, **options)
