"""The checks of a :class:`attnlab.MultiHeadAttention`'s construction (its input's: :mod:`attnlab.layers.projection`;
the mapping of a checkpoint written before the layer held its step: :mod:`attnlab.layers.migration`)."""

from __future__ import annotations

import torch

from ..positional.base import PositionalEncoding, kind_of
from ..positional.base import create as create_positional
from ..validate import ArgumentTypeError
from .step import AttentionStep

__all__ = ["EXACT_DEFAULTS", "check_layer", "check_positional", "built_step", "make_positional",
           "refuse_exact_options"]

EXACT_DEFAULTS = {"score": "scaled_dot", "score_options": None, "normalize": "softmax", "dropout": 0.0}
"""The exact step's options (:class:`attnlab.layers.exact.DenseStep`) that a layer takes for its default step."""


def refuse_exact_options(given: dict) -> None:
    """Refuse the exact step's options given to a layer together with a step of its own."""
    changed = [k for k, v in given.items() if v != EXACT_DEFAULTS[k]]
    if changed:
        raise ArgumentTypeError(f"{', '.join(changed)}: options of the attention step, given to a layer with a step of "
                                f"its own: give them to the step (attnlab.efficient.step(name, ..., {changed[0]}=...))")


def built_step(step, embed_dim: int, num_heads: int) -> AttentionStep:
    """The layer's step: ``step``, or what it builds (a function, called with no argument);
    refused unless it is an :class:`attnlab.layers.step.AttentionStep` of the layer's widths."""
    if not isinstance(step, torch.nn.Module) and callable(step):
        step = step()
    if not isinstance(step, AttentionStep):
        raise ArgumentTypeError("step must be an attnlab.layers.step.AttentionStep (attnlab.efficient.step(name, ...) "
                                f"makes one), got {type(step).__name__}")
    if (step.embed_dim, step.num_heads) != (embed_dim, num_heads):
        raise ValueError(f"the step is built for embed_dim={step.embed_dim}, num_heads={step.num_heads}; the layer has "
                         f"embed_dim={embed_dim}, num_heads={num_heads}")
    return step


def check_layer(step, layer) -> None:
    """Refuse what the step declares the layer cannot be: grouped keys for a step whose keys are its queries."""
    if layer.num_kv_heads != layer.num_heads and step.capabilities.shared_qk:
        raise ValueError(f"the {step.name!r} attention derives its keys from the queries: it takes no num_kv_heads")


def check_positional(step, pe) -> None:
    """Refuse a bias encoding for a step (or mixer) that forms no scores."""
    if pe is not None and pe.kind == "bias" and not step.capabilities.forms_scores:
        raise ValueError(f"the {step.name!r} attention never forms the scores a bias encoding would add to; "
                         f"use rope or an input encoding, or the 'dense' attention for {pe.name!r}")


def make_positional(self, positional, options, max_len) -> PositionalEncoding | None:
    """The layer's positional encoding from a name or an encoding, checked against its widths (None: none)."""
    if positional is None:
        if options:
            raise ArgumentTypeError("positional_options given without a positional encoding")
        return None
    if isinstance(positional, str):
        kind = kind_of(positional)
        dim = self.head_dim if kind == "rotation" else self.embed_dim
        pe = create_positional(positional, dim=dim, num_heads=self.num_heads, max_len=max_len, **(options or {}))
    elif isinstance(positional, PositionalEncoding):
        if options:
            raise ArgumentTypeError("positional_options apply only to an encoding given by name")
        pe = positional
    else:
        raise ArgumentTypeError(f"positional must be a name or a PositionalEncoding, got {type(positional).__name__}")
    if pe.kind == "none":
        return None
    if pe.kind == "input" and (pe.dim != self.embed_dim or self.kdim != self.embed_dim or self.vdim != self.embed_dim):
        raise ValueError(
            f"the {pe.name!r} encoding adds width-{pe.dim} vectors to the inputs, but the inputs have widths "
            f"query {self.embed_dim}, key {self.kdim}, value {self.vdim}"
        )
    if pe.kind == "rotation" and pe.dim != self.head_dim:
        raise ValueError(f"the {pe.name!r} encoding rotates width-{pe.dim} vectors, but the head width is "
                         f"{self.head_dim}")
    if pe.kind == "bias" and pe.num_heads != self.num_heads:
        raise ValueError(f"the {pe.name!r} encoding has {pe.num_heads} heads, this layer {self.num_heads}")
    return pe
