"""transformers' line that a step "is falling back to its reference PyTorch implementation", said during a call of a
model :func:`attnlab.integrations.hybrid.use_kernels` serves, would read as if attnlab served nothing: during such a
call it becomes one :class:`ServedFallback` naming what attnlab serves and that this step is transformers' own (the
short convolution's one-token update in decoding, ``causal_conv1d_update``, without the ``causal-conv1d`` package)."""

from __future__ import annotations

import contextvars
import functools
import logging
import re
import warnings

import torch
from torch import nn

__all__ = ["ServedFallback", "register"]


_SERVED_CALL: contextvars.ContextVar = contextvars.ContextVar("attnlab_served_call", default=None)
"""What the served model whose call is in progress serves (``{layer class: the served functions}``),
for :class:`_Fallbacks`; a context variable, so one per thread."""


def _enter(served: dict[str, tuple[str, ...]], model, args) -> None:
    """The served model's forward pre-hook (after the packing one): its call is in progress."""
    _SERVED_CALL.set(served)


def _leave(model, args, kwargs, output):
    _SERVED_CALL.set(None)


class ServedFallback(UserWarning):
    """A step of a model attnlab serves is transformers' own reference PyTorch implementation (the
    short convolution's one-token update, without the ``causal-conv1d`` package): the warning says
    what attnlab serves beside it, in place of transformers' line that the step "is falling back"."""


_FALLBACK = re.compile(r"`(\w+)` is falling back to its reference PyTorch implementation because `([\w.-]+)` is not "
                       r"installed")
_STEPS = {"causal_conv1d_update": "the short convolution's one-token update in decoding"}


class _Fallbacks(logging.Filter):
    """The filter of transformers' kernel logger: during a served model's call, its line that a
    function "is falling back to its reference PyTorch implementation" becomes one
    :class:`ServedFallback` that names what attnlab serves (elsewhere the line passes unchanged;
    transformers says it once per process, so after a served call it is not said again)."""

    def filter(self, record: logging.LogRecord) -> bool:
        served = _SERVED_CALL.get()
        found = None if served is None else _FALLBACK.search(record.getMessage())
        if found is None:
            return True
        fn, package = found.groups()
        what = "; ".join(f"{layer}: {', '.join(sorted(fns))}" for layer, fns in sorted(served.items()))
        step = f"{fn} ({_STEPS[fn]})" if fn in _STEPS else fn
        warnings.warn(f"attnlab serves this model's linear-attention layers ({what}); {step} is transformers' own "
                      f"reference PyTorch implementation, as {package} is not installed", ServedFallback, stacklevel=1)
        return False


_FALLBACKS = _Fallbacks()
_KERNEL_LOGGER = "transformers.integrations.hub_kernels"  # the logger of use_kernel_func_from_hub_with_fallback's line


def register(model: nn.Module, served: dict[str, tuple[str, ...]]) -> list[torch.utils.hooks.RemovableHandle]:
    """The hooks that mark ``model``'s calls as in progress (``served``: ``{layer class: the served functions}``, what
    the warning names), a forward pre-hook and a forward hook called even when the call raises, and the filter of
    transformers' kernel logger (added once per process) that turns its line into :class:`ServedFallback`."""
    hooks = [model.register_forward_pre_hook(functools.partial(_enter, served)),
             model.register_forward_hook(_leave, with_kwargs=True, always_call=True)]
    kernel_logger = logging.getLogger(_KERNEL_LOGGER)
    if _FALLBACKS not in kernel_logger.filters:
        kernel_logger.addFilter(_FALLBACKS)
    return hooks
