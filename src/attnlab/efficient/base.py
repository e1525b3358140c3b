"""The interface of the efficient (approximate or sparse) attention variants, and their registry.

Every variant is a :class:`attnlab.MultiHeadAttention` whose attention step is replaced: the
same projections ``W^q, W^k, W^v, W^o`` (so weights load from a dense layer, and the exact
limits can be tested with identical weights), the same call signature and the same
:class:`attnlab.AttentionResult` output. What a variant cannot do it refuses with a clear error
instead of silently computing something else:

* masks: a key-padding mask (``(B, 1, 1, M)``, :func:`attnlab.masks.padding`) is accepted by
  every variant; causal attention is a constructor option (``causal=True``) for the variants
  whose method allows it; any other mask needs the dense layer;
* a score bias (ALiBi, relative): refused — rotation (``rope``) and input encodings work;
* ``return_weights=True``: refused — these variants never build the ``N x M`` weights.

Each variant also carries its :class:`Budget` (the class attribute ``budget``): the settings
that make it efficient at short and at long lengths and the budget axis the approximation
table sweeps. The arena, the scaling benchmark and the approximation table read them from
here (:func:`budget`, :func:`budgets`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable

import torch

from ..core.attend import AttentionResult
from ..core.masks import key_padding_flags
from ..layers.cache import KVCache, RecurrentState
from ..layers.multihead import MultiHeadAttention
from ..registry import Registry

__all__ = ["VARIANTS", "Budget", "EfficientAttention", "Sweep", "budget", "budgets", "create", "key_padding", "names", "register"]


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
        embed_dim, num_heads, kdim, vdim, bias, head_mode, positional, positional_options,
            max_len: as for :class:`attnlab.MultiHeadAttention` (the score is the scaled dot
            product and the normaliser softmax, which the variants approximate).
        causal: each query attends only to keys at or before its position.
    """

    name: str = "efficient"
    supports_causal: bool = True
    grouped_kv = False  # grouped key / value heads (num_kv_heads) arrive repeated to H heads

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        causal: bool = False,
        kdim: int | None = None,
        vdim: int | None = None,
        bias: bool = True,
        head_mode: str = "split",
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
        if self.positional is not None and self.positional.kind == "bias":
            raise ValueError(
                f"the {self.name!r} attention never forms the scores a bias encoding would add to; "
                f"use rope or an input encoding, or the 'dense' attention for {self.positional.name!r}"
            )

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, causal={self.causal}"

    def attend_heads(self, q, k, v, *, mask=None, bias=None, return_weights=False) -> AttentionResult:
        if return_weights:
            raise ValueError(f"the {self.name!r} attention never builds the N x M weights; use the 'dense' attention to get them")
        if bias is not None:
            raise ValueError(f"the {self.name!r} attention cannot add a score bias; use the 'dense' attention")
        b, _, n, _ = q.shape
        m = k.shape[2]
        if self.causal and n != m:
            raise ValueError(f"causal {self.name!r} attention needs as many queries as keys, got N={n}, M={m}")
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
        return KVCache(window=self.window + 1, sinks=sinks)

    def _recurrent_cache(self, window, sinks, positions) -> RecurrentState:
        if not self.causal:
            raise ValueError(f"cached decoding needs a causal {self.name!r} attention (create it with causal=True)")
        if window is not None or sinks or positions != "absolute":
            raise ValueError(f"the {self.name!r} attention's cache is its running sums, already of constant size: "
                             "pass no window, sinks or positions")
        return RecurrentState()

    def _recurrent_heads(self, x, state: RecurrentState):
        """q ``(B, H, n, D)``, k, v repeated to H heads, of new tokens continuing ``state``."""
        q, k, v, _ = self.new_token_heads(x, state.seen)
        k, v = self.repeat_kv(k, v)
        return q, k, v

    def check_cache(self, cache) -> None:
        """Refuse a key / value cache other than the one :meth:`new_cache` makes (another window,
        sinks or positions would compute another pattern; a kernel variant needs its recurrent state)."""
        want = self.new_cache()
        same = isinstance(want, KVCache) and (cache.window, cache.sinks, cache.positions) == (want.window, want.sinks, want.positions)
        if not same:
            raise ValueError(f"the {self.name!r} attention decodes with the cache its new_cache() makes, not this one")

    def attend_exact(self, q, k, v, *, mask=None, bias=None, return_weights=False) -> AttentionResult:
        if return_weights:
            raise ValueError(f"the {self.name!r} attention never builds the N x M weights; use the 'dense' attention to get them")
        return MultiHeadAttention.attend_heads(self, q, k, v, mask=mask, bias=bias, return_weights=return_weights)

    def efficient(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
        """The variant's attention: q ``(B, H, N, D)``, k ``(B, H, M, D)``, v ``(B, H, M, Dv)``,
        ``valid`` ``(B, M)`` bool or None -> ``(B, H, N, Dv)``. ``self.causal`` says whether
        query ``i`` may see only keys ``j <= i``."""
        raise NotImplementedError


# ---------------------------------------------------------------------------- registry
VARIANTS: Registry[Callable[..., MultiHeadAttention]] = Registry("attention")
"""Every attention variant by name (``"dense"`` is the exact layer)."""

MultiHeadAttention.budget = Budget()  # dense: exact, nothing to budget
VARIANTS.add("dense", MultiHeadAttention)


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
        raise TypeError(f"the {name!r} attention has no budget: give its class a Budget as the attribute 'budget'")
    return found


def budgets() -> dict[str, Budget]:
    """Every variant's :class:`Budget` by name, in the order the variants were registered
    (dense first, then the sparse patterns, low rank, kernels, hashing, landmarks): the order of
    the arena's, the scaling benchmark's and the approximation table's variants."""
    return {n: budget(n) for n in VARIANTS.in_order()}


def create(name: str, *, embed_dim: int, num_heads: int, **options) -> MultiHeadAttention:
    """Create the attention ``name`` (see :func:`names`).

    ``"dense"`` is :class:`attnlab.MultiHeadAttention` (its options apply; ``causal=True`` is
    not one: give it a causal mask). Every other name is an :class:`EfficientAttention` with
    the same call signature and output.

    Args:
        name: the variant.
        embed_dim: E. num_heads: H.
        **options: the variant's keyword options (``causal=``, ``window=``, ``num_features=``, ...).
    """
    return VARIANTS.create(name, embed_dim, num_heads, **options)
