"""Masks that describe keys on other processes, and the attention that reaches them.

A mask only describes which query may see which key. One kind of description says more: the
keys live on other processes (:class:`attnlab.distributed.ShardedMask`: this rank holds one
shard of a sequence). :func:`attnlab.attend` cannot compute that attention itself, and the mask
does not compute it either: the package that knows how (:mod:`attnlab.distributed`, ring
attention) registers its attention for that kind of mask here, and ``attend`` looks it up.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["SPANNING", "attention_for", "register", "spans"]

SPANNING: dict[type, Callable] = {}
"""Mask type -> ``attend(mask, q, k, v, *, score, normalize, score_mod, bias, dropout_p, return_weights)``
(looked up by the mask's exact type: combining such a mask with another keeps its type)."""


def register(mask_type: type, attention: Callable) -> None:
    """Make ``attention`` compute :func:`attnlab.attend` under masks of ``mask_type``."""
    if not isinstance(mask_type, type) or not callable(attention):
        raise TypeError("register(mask_type, attention) takes a class and a callable")
    SPANNING[mask_type] = attention


def attention_for(mask) -> Callable | None:
    """The attention registered for ``mask``'s kind, or None (an ordinary mask)."""
    return SPANNING.get(type(mask))


def spans(mask) -> bool:
    """Whether ``mask`` describes keys on other processes."""
    return attention_for(mask) is not None
