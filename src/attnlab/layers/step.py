"""What an attention step can do, declared once per variant: :class:`Capabilities`.

Every attention layer of attnlab (:class:`attnlab.MultiHeadAttention` and each variant of
:mod:`attnlab.efficient`) runs one path: the projections, then its attention step
:meth:`attnlab.MultiHeadAttention.attend_heads` on the heads, then ``W^o``. What the step
accepts is not found by trying it: the class declares it as ``capabilities``, and whatever
lists variants (the arena's presets, the benchmarks, ``attnlab list variants``, the
transformers integration, the docs' tables) reads the declaration (:func:`attnlab.efficient.select`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import torch

__all__ = ["CACHES", "CAUSAL_FORMS", "Capabilities", "MASK_KINDS", "StepInputs"]

CAUSAL_FORMS = ("mask", "flag")
"""How a step is causal: ``"mask"`` — it takes any mask, so ``masks.causal()`` (exact attention);
``"flag"`` — its method changes (a running sum, a recurrence), so the constructor's ``causal=True``."""

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
    """What an attention step declares it can do (a class attribute, read without building it).

    Attributes:
        causal: its causal form, one of :data:`CAUSAL_FORMS`, or None (no causal form: its method
            mixes every key into every query).
        masks: the masks it takes (:data:`MASK_KINDS`).
        forms_scores: it computes every allowed score, so a score bias, a score function (bias
            encodings) and ``return_weights`` work.
        cache: what it decodes with (:data:`CACHES`), or None (no cached decoding).
        grouped_kv: it takes G < H key / value heads itself (else they arrive repeated to H).
        exact: it computes exact attention (under its pattern, for the sparse patterns).
        needs_input: it reads the layer's input (gates computed from it): self-attention only,
            given as ``inputs=`` (:class:`StepInputs`).
        shared_qk: its keys are its queries (Reformer): no key projection, no grouped keys.
        reference: a slow reference of another variant (``dense_naive``): left out of grids.
        family: its family, for tables and grids (``"exact"``, ``"pattern"``, ``"low rank"``,
            ``"kernel"``, ``"hashing"``, ``"landmarks"``, ``"gated"``).
    """

    causal: Literal["mask", "flag"] | None = "mask"
    masks: Literal["any", "key_padding"] = "any"
    forms_scores: bool = True
    cache: Literal["kv", "window", "recurrent", "matrix", "forget"] | None = "kv"
    grouped_kv: bool = True
    exact: bool = True
    needs_input: bool = False
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

    def but(self, **changes) -> Capabilities:
        """A copy with ``changes`` (a subclass declaring what differs from its family)."""
        return replace(self, **changes)

    def describe(self) -> dict[str, object]:
        """The declaration as plain values (``attnlab list variants --json``)."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass
class StepInputs:
    """What a step that declares ``needs_input`` receives besides the heads: the layer's input
    ``x`` ``(B, N, E)`` (padding rows zeroed) and the queries' positions ``(N,)``."""

    x: torch.Tensor
    positions: torch.Tensor
