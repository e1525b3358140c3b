"""Custom autograd functions under :func:`torch.autocast`: the backward pass runs in the autocast
state its forward ran in (as :func:`torch.amp.custom_fwd` / :func:`torch.amp.custom_bwd` do, for
whatever device the inputs are on). Without this, a backward called outside the autocast region
(as every training loop calls it) would multiply a float32 recomputation by a bfloat16 saved
tensor and fail, or silently change the arithmetic between the passes."""

from __future__ import annotations

import functools

import torch

__all__ = ["same_autocast_backward", "same_autocast_forward", "upcast"]


def same_autocast_forward(forward):
    """Decorator of a ``forward(ctx, *args)``: records the autocast state of the device of its
    first tensor argument on ``ctx`` for :func:`same_autocast_backward`."""

    @functools.wraps(forward)
    def wrapped(ctx, *args):
        device = next((a.device.type for a in args if isinstance(a, torch.Tensor)), "cpu")
        ctx.autocast_state = (device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
        return forward(ctx, *args)

    return wrapped


def same_autocast_backward(backward):
    """Decorator of a ``backward(ctx, *grads)``: runs it in the autocast state its forward recorded."""

    @functools.wraps(backward)
    def wrapped(ctx, *grads):
        device, enabled, dtype = ctx.autocast_state
        with torch.autocast(device, dtype=dtype, enabled=enabled):
            return backward(ctx, *grads)

    return wrapped


def upcast(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32 when it is half precision (float16, bfloat16), else unchanged: where
    softmax statistics, gates and recurrent states are computed under autocast."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t
