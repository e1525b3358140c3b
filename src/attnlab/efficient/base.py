"""The interface of the efficient (approximate or sparse) attention variants, and their registry.

A variant is one of two kinds (:mod:`attnlab.layers.mixer`). An attention step
(:class:`attnlab.layers.step.AttentionStep`) is held by a :class:`attnlab.MultiHeadAttention`:
the same projections ``W^q, W^k, W^v, W^o`` around it (so weights load from a dense layer, and
the exact limits can be tested with identical weights). A sequence mixer
(:class:`attnlab.layers.mixer.SequenceMixer`: the gated family, DeltaProduct, FoX) is the layer
itself, owning its projections, gates and norm. Both take the same call and give the same
:class:`attnlab.AttentionResult`. :func:`create` builds the layer, :func:`step` a step alone,
usable on heads.
What a variant cannot do it refuses with a clear error instead of silently computing something
else, from its declaration (:func:`attnlab.layers.step.check_call`):

* masks: a key-padding mask (:func:`attnlab.masks.padding`, a ``(B, 1, 1, M)`` tensor) is
  accepted by every variant, and packed documents (:class:`attnlab.masks.Documents`: each
  document attended alone); causal attention is a step option (``causal=True``) for the
  variants whose method allows it (their method changes with it: causal linear attention is a
  running sum); any other mask needs exact attention. The sparse patterns (``local``,
  ``longformer``, ``bigbird``) are exact attention under their pattern's mask
  (:class:`PatternStep`): they take any mask, score function and return their weights;
* a score bias (ALiBi, relative): refused by the approximations — rotation (``rope``) and input
  encodings work;
* ``return_weights=True``: refused by the approximations — they never build the ``N x M`` weights.

Each variant declares what its step can do as its class attribute ``capabilities``
(:class:`attnlab.layers.step.Capabilities`), and every list of variants follows from it:
:func:`select` filters the registry by it. Each also carries its :class:`Budget` (the class
attribute ``budget``): the settings that make it efficient at short and at long lengths and
the budget axis the approximation table sweeps (:func:`budget`, :func:`budgets`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from ..core import masks
from ..core.attend import AttentionResult
from ..layers.budget import Budget, Sweep
from ..layers.exact import DenseStep
from ..layers.mixer import SequenceMixer
from ..layers.multihead import MultiHeadAttention
from ..layers.step import AttentionStep, Capabilities, StepCall
from ..registry import Registry, keyword_options
from ..validate import ArgumentTypeError

__all__ = ["LAYER_OPTIONS", "VARIANTS", "Budget", "EfficientStep", "PatternStep", "Sweep", "VariantRegistry", "budget",
           "budgets", "capabilities", "check_documents", "create", "is_mixer", "names", "per_document", "register",
           "select", "step"]

def is_mixer(cls) -> bool:
    """Whether the registered class ``cls`` is a sequence mixer (the layer itself,
    :class:`attnlab.layers.mixer.SequenceMixer`) rather than an attention step a layer holds."""
    return isinstance(cls, type) and issubclass(cls, SequenceMixer)


def check_documents(step, docs) -> None:
    """``ValueError`` unless packed documents ask for the layer's own pattern (causal as the layer,
    no window): a variant attends each document with its method, not the mask's rule."""
    causal = step.causal
    if docs.window is not None or docs.causal != causal:
        raise ValueError(f"the {step.name} attention (causal={causal}) attends packed documents with its own pattern: "
                         f"give Documents(causal={causal}) without a window")


def per_document(step, run: Callable, docs, heads: tuple[torch.Tensor, ...],
                 x: torch.Tensor | None = None, positions: torch.Tensor | None = None) -> torch.Tensor:
    """Packed documents, each alone: ``run(*heads, x)`` on every document's positions (documents of
    one length stacked into one call), padding left at zero. ``heads``: ``(B, ., N, .)`` tensors
    (the first is the queries, the last the values: the output has the values' heads, as many as
    ``run`` returns, where the queries may come in fewer, grouped); ``x``: ``(B, N, .)`` or None,
    sliced alike; ``positions``: the tokens' ``(N,)`` or ``(B, N)`` positions, sliced alike and passed after ``x``
    (``run(*heads, x, positions)``), or None."""
    check_documents(step, docs)
    q = heads[0]
    out = None
    by_length: dict[int, list[tuple[int, int]]] = {}
    for row, start, n in docs.segments(q.shape[2]):
        by_length.setdefault(n, []).append((row, start))
    for n, where in by_length.items():
        def take(t, dim, n=n, where=where):
            return torch.stack([t.narrow(dim - 1, s, n)[r] for r, s in where])

        given = () if positions is None else (take(positions.expand(q.shape[0], q.shape[2]), 2),)
        res = run(*(take(t, 3) for t in heads), None if x is None else take(x, 2), *given)
        if out is None:
            out = q.new_zeros(q.shape[0], res.shape[1], q.shape[2], res.shape[-1])
        for j, (r, s) in enumerate(where):
            out[r, :, s : s + n] = res[j]
    return q.new_zeros(q.shape[0], heads[-1].shape[1], q.shape[2], heads[-1].shape[-1]) if out is None else out


class EfficientStep(AttentionStep):
    """Base class of the efficient steps that approximate softmax attention on the keys a
    key-padding mask leaves (``linear``, ``performer``, ``linformer``, ``nystrom``, ``reformer``).

    Subclasses declare ``capabilities`` and implement :meth:`compute` on heads (and, with
    ``capabilities.cache == "recurrent"``, :meth:`decode`); :meth:`attend` around them runs
    packed documents one by one and silences padded keys.

    Args:
        embed_dim, num_heads: E and H.
        causal: each query attends only to keys at or before its position.
    """

    name: str = "efficient"
    capabilities = Capabilities(causal="option", masks="key_padding", forms_scores=False, cache=None, grouped_kv=False,
                                exact=False, family="approximation")

    def attend(self, q, k, v, call: StepCall) -> AttentionResult:
        b, _, n, _ = q.shape
        m = k.shape[2]
        if call.state is not None:  # decoding with the declared state: the new tokens' key padding only
            return AttentionResult(self.decode(q, k, v, call.state, call.valid_keys(b, m, self.name, q.device)))
        if call.documents is not None:
            return AttentionResult(per_document(self, lambda q, k, v, _: self.compute(q, k, v, None), call.documents,
                                                (q, k, v)))
        valid = call.valid_keys(b, m, self.name, q.device)
        if n == 0 or m == 0:
            return AttentionResult(q.new_zeros(b, q.shape[1], n, v.shape[-1]))
        if valid is not None:  # padded keys and values: zeroed, so that NaN there cannot leak
            keep = valid[:, None, :, None]
            zero = torch.zeros((), dtype=k.dtype, device=k.device)
            k, v = torch.where(keep, k, zero), torch.where(keep, v, zero)
        out = self.compute(q, k, v, valid)
        if valid is not None:  # a set with no real key: zeros, as everywhere in attnlab
            out = out.masked_fill(~valid.any(-1)[:, None, None, None], 0.0)
        return AttentionResult(out)

    def compute(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
        """The variant's method: q ``(B, H, N, D)``, k ``(B, H, M, D)`` and v ``(B, H, M, Dv)``
        (padded keys and values zeroed), ``valid`` ``(B, M)`` bool or None -> ``(B, H, N, Dv)``.
        ``self.causal`` says whether query ``i`` may see only keys ``j <= i``."""
        raise NotImplementedError

    def decode(self, q, k, v, state, valid) -> torch.Tensor:
        """Decoding with the declared state (``capabilities.cache == "recurrent"``: a
        :class:`attnlab.layers.state.RecurrentState`): q ``(B, H, n, D)``, k, v of the new tokens,
        ``valid`` their padding; the state is updated in place."""
        raise NotImplementedError


class PatternStep(DenseStep):
    """Exact attention under a fixed sparse pattern: ``local``, ``longformer``, ``bigbird``.

    The pattern is a mask (:meth:`pattern_mask`, plus causal when ``causal=True``) combined with
    the caller's, and attention is :func:`attnlab.attend` over it: block-sparse, so the tiles
    outside the pattern are never computed, any mask or score function works, and
    ``return_weights`` gives the (mostly zero) weights. Subclasses define :meth:`pattern_mask`
    (and :meth:`cache_bounds`, the bounded cache that is their causal pattern) and set ``block``.
    """

    capabilities = Capabilities(causal="option", masks="any", forms_scores=True, cache="window", grouped_kv=True,
                                exact=True, family="pattern")
    block: int | None = None

    def __init__(self, embed_dim: int, num_heads: int, *, causal: bool = False):
        super().__init__(embed_dim, num_heads, causal=causal)

    def pattern_mask(self):
        """The pattern as a mask (:mod:`attnlab.masks`), without the causal part."""
        raise NotImplementedError

    def full_pattern(self):
        """The pattern with the causal rule when the step is causal."""
        pat = self.pattern_mask()
        return masks.causal() & pat if self.causal else pat

    def pattern(self, n: int) -> torch.Tensor:
        """The ``(n, n)`` bool mask of who attends to whom at length n."""
        return self.full_pattern().dense(n)

    def attend(self, q, k, v, call: StepCall) -> AttentionResult:
        # decoding: the cache holds exactly what the causal pattern keeps, its mask says the rest
        if call.state is not None:
            return self.exact(q, k, v, call)
        n, m = q.shape[2], k.shape[2]
        if n != m:
            raise ValueError(f"this attention relates positions: it needs as many keys as queries, got N={n}, M={m}")
        return self.exact(q, k, v, call, mask=call.combined(self.full_pattern(), q), block_size=self.block)


# ---------------------------------------------------------------------------- registry
LAYER_OPTIONS = ("kdim", "vdim", "bias", "head_mode", "positional", "positional_options", "max_len", "num_kv_heads")
"""The options of the layer holding a step (:class:`attnlab.MultiHeadAttention`), which
:func:`create` takes beside the step's own."""


class VariantRegistry(Registry):
    """The variants by name, steps and mixers: :meth:`create` builds the layer (holding a step, or
    the mixer), :meth:`options` are a step's and its layer's (:data:`LAYER_OPTIONS`) or a mixer's."""

    def in_order(self) -> list[str]:
        """The names in the order they were registered, the references of another variant
        (``capabilities.reference``: ``dense_naive``) last: the order of every table and grid."""
        names = super().in_order()
        last = [n for n in names if getattr(self.get(n), "capabilities", None) is not None
                and self.get(n).capabilities.reference]
        return [n for n in names if n not in last] + last

    def options(self, name: str) -> list[str] | None:
        """The keyword options of the variant ``name``: a mixer's own (its layer options among them), a step's and
        its layer's (:data:`LAYER_OPTIONS`)."""
        cls = self.get(name)
        own = keyword_options(cls)
        if own is None or is_mixer(cls):
            return own
        return sorted({*own, *LAYER_OPTIONS})

    def create(self, name: str, *args, **options):
        """The layer of the variant ``name``: ``create(name, embed_dim, num_heads, **options)``; a
        sequence mixer is the layer itself, an attention step is held by a
        :class:`attnlab.MultiHeadAttention` (exact attention's score drawn before the layer's
        projections, as a layer building its own draws it; every other step's parameters after)."""
        self.check_options(name, options)
        cls = self.get(name)
        if is_mixer(cls):
            return cls(*args, **options)
        takes = set(keyword_options(cls) or ())
        layer_options = {k: v for k, v in options.items() if k in LAYER_OPTIONS}  # max_len: the layer's and linformer's
        build = functools.partial(cls, *args, **{k: v for k, v in options.items()
                                                 if k in takes or k not in LAYER_OPTIONS})
        return MultiHeadAttention(*args, step=build() if issubclass(cls, DenseStep) else build, **layer_options)


VARIANTS: VariantRegistry = VariantRegistry("attention")
"""Every attention step by name (``"dense"`` is exact attention)."""

VARIANTS.add("dense", DenseStep)


def register(name: str):
    """Class decorator: make a step available as ``create(name, ...)`` and ``step(name, ...)``."""
    return VARIANTS.register(name)


def names() -> list[str]:
    """The names :func:`create` accepts, sorted (``"dense"`` is exact attention)."""
    return VARIANTS.names()


def capabilities(name: str) -> Capabilities:
    """What the variant ``name``'s attention step declares it can do (its class's ``capabilities``)."""
    found = getattr(VARIANTS.get(name), "capabilities", None)
    if not isinstance(found, Capabilities):
        raise ArgumentTypeError(f"the {name!r} attention declares no capabilities: give its class a Capabilities as "
                                "the attribute 'capabilities'")
    return found


def select(*, causal: bool | None = None, decodes: bool | None = None, exact: bool | None = None,
           forms_scores: bool | None = None, mixer: bool | None = None, reference: bool | None = None,
           family: str | None = None) -> list[str]:
    """The registered variants whose declared :class:`attnlab.layers.step.Capabilities` match, in
    the order they were registered (``"dense"`` first); every criterion left None matches all.

    Args:
        causal: has a causal form (either by mask or by the option ``causal=True``).
        decodes: has cached decoding (``capabilities.cache`` is set).
        exact: computes exact attention (under its pattern).
        forms_scores: forms every allowed score (bias, score functions, weights).
        mixer: it is a sequence mixer (a layer ``x -> y`` owning its projections), not an attention step.
        reference: a slow reference of another variant (``dense_naive``).
        family: its family (``"exact"``, ``"pattern"``, ``"gated"``, ...).
    """
    def keep(c: Capabilities) -> bool:
        return all(want is None or have == want for want, have in (
            (causal, c.causal is not None), (decodes, c.cache is not None), (exact, c.exact),
            (forms_scores, c.forms_scores), (mixer, c.mixer), (reference, c.reference), (family, c.family)))

    return [n for n in VARIANTS.in_order() if keep(capabilities(n))]


def budget(name: str) -> Budget:
    """The :class:`Budget` of the variant ``name`` (its class attribute ``budget``)."""
    found = getattr(VARIANTS.get(name), "budget", None)
    if not isinstance(found, Budget):
        raise ArgumentTypeError(f"the {name!r} attention has no budget: give its class a Budget as the attribute "
                                "'budget'")
    return found


def budgets() -> dict[str, Budget]:
    """Every variant's :class:`Budget` by name, in the order the variants were registered
    (dense first, then the sparse patterns, low rank, kernels, hashing, landmarks): the order of
    the arena's, the scaling benchmark's and the approximation table's variants."""
    return {n: budget(n) for n in VARIANTS.in_order()}


def create(name: str, *, embed_dim: int, num_heads: int, **options) -> MultiHeadAttention | SequenceMixer:
    """The layer of the variant ``name`` (see :func:`names`): a :class:`attnlab.MultiHeadAttention`
    holding its attention step, or the sequence mixer itself (:class:`attnlab.layers.mixer.SequenceMixer`:
    ``select(mixer=True)``). Both are called alike: ``layer(x, mask=..., positions=..., cache=...)``.

    Args:
        name: the variant (``"dense"``: exact attention, whose options are ``score``,
            ``normalize``, ``dropout`` and ``causal``: ``causal=True`` adds ``masks.causal()`` to
            every call's mask).
        embed_dim: E. num_heads: H.
        **options: the step's keyword options (``causal=``, ``window=``, ``num_features=``, ...)
            and the layer's (:data:`LAYER_OPTIONS`: ``positional=``, ``num_kv_heads=``, ...); a
            mixer's own (its ``__init__``'s, the layer options it takes among them).
    """
    return VARIANTS.create(name, embed_dim, num_heads, **options)


def step(name: str, *, embed_dim: int, num_heads: int, **options) -> AttentionStep:
    """The attention step ``name`` alone, to call on heads as :func:`attnlab.attend` is:
    ``step(q, k, v)`` or ``step(q, k, v, StepCall(mask=..., ...))`` on q ``(B, H, N, D)``, k and v
    ``(B, H|G, M, D)`` (``D = embed_dim / num_heads``), with the same checks and step hooks as
    inside a layer.

    Args:
        name: the variant (see :func:`names`).
        embed_dim: E = H D. num_heads: H.
        **options: the step's keyword options (``causal=``, ``window=``, ``score=``, ...).
    """
    cls = VARIANTS.get(name)
    if is_mixer(cls):
        raise ValueError(f"the {name!r} attention is a sequence mixer: it owns its projections, gates and norm, so it "
                         f"has no step to call on heads; create the layer with attnlab.efficient.create({name!r}, ...)")
    takes = keyword_options(cls)
    bad = [] if takes is None else [k for k in options if k not in takes]
    if bad:
        raise ValueError(f"unknown option {', '.join(map(repr, bad))} for the attention step {name!r}; it takes "
                         f"{', '.join(k for k in takes or () if k not in ('embed_dim', 'num_heads'))}")
    return cls(embed_dim, num_heads, **options)
