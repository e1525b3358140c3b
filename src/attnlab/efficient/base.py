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

Each variant also carries its :class:`Budget` (the class attribute ``budget``): the settings
that make it efficient at short and at long lengths and the budget axis the approximation
table sweeps. The arena, the scaling benchmark and the approximation table read them from
here (:func:`budget`, :func:`budgets`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import cast

import torch

from ..core.attend import AttentionResult
from ..core.masks import key_padding_flags
from ..layers.cache import KVCache, RecurrentState
from ..layers.multihead import HeadMode, MultiHeadAttention
from ..registry import Registry
from ..validate import ArgumentTypeError

__all__ = ["VARIANTS", "Budget", "DenseAttention", "EfficientAttention", "PatternAttention", "Sweep", "budget", "budgets", "create",
           "key_padding", "names", "register"]


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


class EfficientAttention(MultiHeadAttention):
    """Base class: multi-head attention whose attention step is an efficient variant.

    Subclasses implement :meth:`efficient` on projected heads and set ``supports_causal``.

    Args:
        embed_dim, num_heads, kdim, vdim, bias, head_mode, positional, positional_options, max_len: as for
            :class:`attnlab.MultiHeadAttention` (the score is the scaled dot product and the
            normaliser softmax, which the variants approximate).
        causal: each query attends only to keys at or before its position.
    """

    name: str = "efficient"
    supports_causal: bool = True
    grouped_kv = False  # grouped key / value heads (num_kv_heads) arrive repeated to H heads
    forms_scores: bool = False  # True for the sparse patterns: they compute every allowed score, so a bias encoding works

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
        if causal and not self.supports_causal:
            raise ValueError(f"the {self.name!r} attention cannot be causal: its method mixes every key into every query")
        self.causal = bool(causal)
        if self.positional is not None and self.positional.kind == "bias" and not self.forms_scores:
            raise ValueError(
                f"the {self.name!r} attention never forms the scores a bias encoding would add to; "
                f"use rope or an input encoding, or the 'dense' attention for {self.positional.name!r}"
            )

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, causal={self.causal}"

    def attend_heads(self, q, k, v, *, mask=None, bias=None, score_mod=None, return_weights=False) -> AttentionResult:
        if return_weights:
            raise ValueError(f"the {self.name!r} attention never builds the N x M weights; use the 'dense' attention to get them")
        if bias is not None or score_mod is not None:
            raise ValueError(f"the {self.name!r} attention cannot add a score bias; use the 'dense' attention")
        if getattr(mask, "sharded_attend", None) is not None:
            raise ValueError(f"the {self.name!r} attention is not exact dense attention: ring attention (mask=ShardedMask) runs the "
                             "exact layers (dense, local, longformer, bigbird)")
        b, _, n, _ = q.shape
        m = k.shape[2]
        if self.causal and n != m:
            raise ValueError(f"causal {self.name!r} attention needs as many queries as keys, got N={n}, M={m}")
        segments = getattr(mask, "segments", None)
        if callable(segments) and not isinstance(mask, torch.Tensor):  # packed documents: each attended alone
            return AttentionResult(self._segments(q, k, v, mask))
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

    def _segments(self, q, k, v, docs) -> torch.Tensor:
        """Packed documents: every document alone (documents of one length stacked into one
        call), padding left at zero."""
        if getattr(docs, "window", None) is not None or getattr(docs, "causal", self.causal) != self.causal:
            raise ValueError(f"the {self.name} layer (causal={self.causal}) attends packed documents with its own pattern: "
                             f"give Documents(causal={self.causal}) without a window")
        out = q.new_zeros(*q.shape[:3], v.shape[-1])
        by_length: dict[int, list[tuple[int, int]]] = {}
        for row, start, n in docs.segments(q.shape[2]):
            by_length.setdefault(n, []).append((row, start))
        for n, where in by_length.items():
            def take(x, n=n, where=where):  # (docs, H, n, D)
                return torch.stack([x[r, :, s : s + n] for r, s in where])

            res = self.efficient(take(q), take(k), take(v), None)
            for j, (r, s) in enumerate(where):
                out[r, :, s : s + n] = res[j]
        return out

    def new_cache(self, *, window=None, sinks=0, positions="absolute"):
        """Cached decoding: ``local`` and ``longformer`` (a bounded :class:`KVCache` that is
        exactly their causal pattern), ``linear`` and ``performer`` (a recurrent state) override
        this; the other variants refuse."""
        raise ValueError(
            f"the {self.name!r} attention has no cached decoding (its pattern is not a causal prefix rule); "
            "decode with dense, dense_naive, local, longformer, linear or performer"
        )

    def _bounded_cache(self, sinks: int, window, user_sinks, positions) -> KVCache:
        """The cache of a causal sliding window of ``self.window`` plus ``sinks`` global tokens."""
        if not self.causal:
            raise ValueError(f"cached decoding needs a causal {self.name!r} attention (create it with causal=True)")
        if window is not None or user_sinks or positions != "absolute":
            raise ValueError(f"the {self.name!r} attention's cache is its own window: pass no window, sinks or positions")
        # self.window: the int window of the variants that call this (local, longformer), unknown to this base class
        return KVCache(window=cast(int, self.window) + 1, sinks=sinks)

    def _recurrent_cache(self, window, sinks, positions, make=RecurrentState):
        """``make()``: a recurrent state (running sums, a matrix state), which only a causal layer
        decodes with and which no window, sinks or positions bound (it is of constant size)."""
        if not self.causal:
            raise ValueError(f"cached decoding needs a causal {self.name!r} attention (create it with causal=True)")
        if window is not None or sinks or positions != "absolute":
            raise ValueError(f"the {self.name!r} attention's cache is its state, already of constant size: "
                             "pass no window, sinks or positions")
        return make()

    def check_cache(self, cache) -> None:
        """Refuse a key / value cache other than the one :meth:`new_cache` makes (another window,
        sinks or positions would compute another pattern; a kernel variant needs its recurrent state)."""
        want = self.new_cache()
        same = isinstance(want, KVCache) and (cache.window, cache.sinks, cache.positions) == (want.window, want.sinks, want.positions)
        if not same:
            raise ValueError(f"the {self.name!r} attention decodes with the cache its new_cache() makes, not this one")

    def attend_exact(self, q, k, v, *, mask=None, score_mod=None, return_weights=False) -> AttentionResult:
        if return_weights:
            raise ValueError(f"the {self.name!r} attention never builds the N x M weights; use the 'dense' attention to get them")
        return MultiHeadAttention.attend_heads(self, q, k, v, mask=mask, score_mod=score_mod, return_weights=return_weights)

    def efficient(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
        """The variant's attention: q ``(B, H, N, D)``, k ``(B, H, M, D)``, v ``(B, H, M, Dv)``,
        ``valid`` ``(B, M)`` bool or None -> ``(B, H, N, Dv)``. ``self.causal`` says whether
        query ``i`` may see only keys ``j <= i``."""
        raise NotImplementedError


class PatternAttention(EfficientAttention):
    """Exact attention under a fixed sparse pattern: ``local``, ``longformer``, ``bigbird``.

    The pattern is a mask (:meth:`pattern_mask`, plus causal when ``causal=True``) combined with
    the caller's, and attention is :func:`attnlab.attend` over it: block-sparse, so the tiles
    outside the pattern are never computed, any score, normaliser, score function or mask works,
    and ``return_weights`` gives the (mostly zero) weights. Subclasses define
    :meth:`pattern_mask`.
    """

    forms_scores = True
    grouped_kv = True  # the core takes G key / value heads itself

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

    def attend_heads(self, q, k, v, *, mask=None, bias=None, score_mod=None, return_weights=False) -> AttentionResult:
        from ..core.attend import attend

        n, m = q.shape[2], k.shape[2]
        if n != m:
            raise ValueError(f"this attention relates positions: it needs as many keys as queries, got N={n}, M={m}")
        pat = self.full_pattern()
        return attend(q, k, v, score=self.score, normalize=self.normalize, mask=pat if mask is None else pat & mask, score_mod=score_mod,
                      bias=bias, dropout_p=self.dropout if self.training else 0.0, return_weights=return_weights, block_size=self.block)

    def attend_exact(self, q, k, v, *, mask=None, score_mod=None, return_weights=False) -> AttentionResult:
        return MultiHeadAttention.attend_heads(self, q, k, v, mask=mask, score_mod=score_mod, return_weights=return_weights)


# ---------------------------------------------------------------------------- registry
VARIANTS: Registry[Callable[..., MultiHeadAttention]] = Registry("attention")
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
