"""Packed documents in a served model's call (:func:`attnlab.integrations.hybrid.use_kernels` registers the hooks):
a batch of one whose ``position_ids`` restart at 0 is a row of packed documents, whose offsets travel in the call's
keyword arguments as ``cu_seq_lens_q`` to every layer; with a cache such a row is refused (:class:`PackedWithCache`)."""

from __future__ import annotations

import contextvars

import torch
from torch import nn

from .adapters import UnservedArgument

__all__ = ["PackedWithCache", "offsets_from_positions", "register"]


def offsets_from_positions(position_ids: torch.Tensor) -> torch.Tensor | None:
    """``cu_seqlens`` of a packed batch of one whose ``position_ids`` restart at 0 at each
    document, or None when they do not restart (one sequence, or a batch of several)."""
    if position_ids is None or position_ids.dim() != 2 or position_ids.shape[0] != 1 or position_ids.shape[1] < 2:
        return None
    pos = position_ids[0]
    starts = torch.nonzero(pos[1:] <= pos[:-1]).flatten() + 1
    if starts.numel() == 0 or int(pos[0]) != 0:
        return None
    return torch.cat([starts.new_zeros(1), starts, starts.new_full((1,), pos.numel())])


class PackedWithCache(UnservedArgument):
    """A packed row (``position_ids`` restarting at 0) with a cache: transformers' attention layers
    would let its documents see each other."""


_OFFSETS: contextvars.ContextVar = contextvars.ContextVar("attnlab_packed_offsets", default=None)
"""The packed offsets of the served call in progress, for the inner models that a model does not
hand its call's arguments to (Mamba-2's causal LM drops them); a context variable, so one per thread."""


def _pack(model, args, kwargs):
    """The served model's forward pre-hook: a batch of one whose ``position_ids`` restart is a row of packed documents,
    and its offsets go into the call as ``cu_seq_lens_q`` (transformers hands the call's keyword arguments down to every
    layer, so a checkpointed layer recomputes with them and concurrent calls never share them). With a cache that row is
    refused: transformers packs its attention layers' masks only without one."""
    offsets = offsets_from_positions(kwargs.get("position_ids"))
    if offsets is None or kwargs.get("cu_seq_lens_q") is not None:
        _OFFSETS.set(None)
        return None
    use_cache = kwargs.get("use_cache")
    if use_cache is None:
        use_cache = getattr(getattr(model, "config", None), "use_cache", False)
    if use_cache or kwargs.get("cache") is not None or kwargs.get("past_key_values") is not None:
        raise PackedWithCache(
            f"position_ids restart at 0 at {offsets.numel() - 2} places (a row of {offsets.numel() - 1} packed "
            "documents) in a call with a cache, where transformers' attention layers would mix the documents: call the "
            "model with use_cache=False (the documents are then kept apart in every layer), or give each document a "
            "row of its own")
    _OFFSETS.set(offsets)
    return args, dict(kwargs, cu_seq_lens_q=offsets)


def _pack_inner(model, args, kwargs):
    """An inner model's forward pre-hook: the offsets of the call in progress, if its outer model did not pass them."""
    offsets = _OFFSETS.get()
    if offsets is None or kwargs.get("cu_seq_lens_q") is not None:
        return None
    return args, dict(kwargs, cu_seq_lens_q=offsets)


def _unpack(model, args, kwargs, output):
    _OFFSETS.set(None)


def register(model: nn.Module) -> list[torch.utils.hooks.RemovableHandle]:
    """The hooks that pack a served model's calls: a forward pre-hook on ``model`` that turns ``position_ids`` that
    restart into offsets in the call (or refuses such a row with a cache), a forward hook that ends the call (called
    even when it raises), and a forward pre-hook on each inner transformers model that hands it the offsets."""
    from transformers import PreTrainedModel

    hooks = [model.register_forward_pre_hook(_pack, with_kwargs=True),
             model.register_forward_hook(_unpack, with_kwargs=True, always_call=True)]
    return hooks + [inner.register_forward_pre_hook(_pack_inner, with_kwargs=True)
                    for inner in model.modules() if inner is not model and isinstance(inner, PreTrainedModel)]
