"""The mapping of checkpoints written by earlier layouts: before a :class:`attnlab.MultiHeadAttention` held its step,
and before the sequence mixers owned their projections (:class:`attnlab.layers.mixer.SequenceMixer`, whose parameters
a layer's ``step`` held): the load hooks that rename their keys, and the orders their optimizer's state was written
in."""

from __future__ import annotations

import torch

from .step import AttentionStep

MIXER_LAYER_KEYS = ("positional", "q_proj", "k_proj", "v_proj", "out_proj")
"""A mixer's children that were the layer's own while it held the mixer's parameters as its ``step``."""

__all__ = ["LAYER_KEYS", "MIXER_LAYER_KEYS", "mixer_keys", "parameters_before_step", "parameters_with_step",
           "step_keys"]

LAYER_KEYS = ("q_proj.", "k_proj.", "v_proj.", "out_proj.", "head_q", "head_k", "head_v", "positional.", "step.")
"""The state-dict keys (after the layer's prefix) that are the layer's own; every other key of a
checkpoint written before the layer held its step is the step's (:func:`step_keys`)."""


def step_keys(layer, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs) -> None:
    """A load-state-dict pre-hook: the keys of a checkpoint written before the layer held its step
    (the step's parameters, buffers and score at the layer's top level: ``gate_up.weight``,
    ``score.weight``) are renamed ``step.*``, where the layer's step has them."""
    own = set(layer.step.state_dict(keep_vars=True))
    for key in [k for k in state_dict if k.startswith(prefix)]:
        rest = key[len(prefix):]
        if not rest.startswith(LAYER_KEYS) and rest in own:
            state_dict[f"{prefix}step.{rest}"] = state_dict.pop(key)


def parameters_before_step(model: torch.nn.Module) -> list[str]:
    """The names (today's) of ``model``'s parameters in the order ``model.parameters()`` listed them
    before the layer held its step: in each layer, its own parameters and the step's first, then
    the step's score, the layer's modules and the step's other modules. The order of the
    optimizer's state in a training checkpoint written then."""
    names: list[str] = []
    seen: set[int] = set()

    def visit(module: torch.nn.Module, prefix: str) -> None:
        params, children = list(module.named_parameters(recurse=False)), list(module.named_children())
        step = dict(children).get("step")
        if _is_mixer(module):  # FoX's exact attention (its score) was drawn and listed first
            children = sorted(children, key=lambda c: c[0] != "attention")
        if isinstance(step, AttentionStep) and not isinstance(module, AttentionStep):  # a layer holding its step
            params += [(f"step.{n}", p) for n, p in step.named_parameters(recurse=False)]
            inner = [(f"step.{n}", m) for n, m in step.named_children()]
            layer, children = children, [c for c in inner if c[0] == "step.score"]
            for n, m in layer:
                children += [c for c in inner if c[0] != "step.score"] if n == "step" else [(n, m)]
        for n, p in params:
            if id(p) not in seen:
                seen.add(id(p))
                names.append(prefix + n)
        for n, m in children:
            visit(m, f"{prefix}{n}.")

    visit(model, "")
    return names


def _is_mixer(module: torch.nn.Module) -> bool:
    """A sequence mixer (:class:`attnlab.layers.mixer.SequenceMixer`, known by its ``renamed_keys``)."""
    return getattr(type(module), "renamed_keys", None) is not None


def mixer_keys(mixer, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs) -> None:
    """A load-state-dict pre-hook of a sequence mixer: the keys of a checkpoint written when a layer
    held its parameters as ``step.*`` (or, before that, at the layer's top level) are renamed by the
    mixer's ``renamed_keys`` (``(old prefix, new prefix)`` pairs, the first that matches), where the
    mixer has the new key."""
    own = set(mixer.state_dict(keep_vars=True))
    for key in [k for k in state_dict if k.startswith(prefix)]:
        rest = key[len(prefix):]
        for old, new in mixer.renamed_keys:
            if rest.startswith(old) and rest not in own and new + rest[len(old):] in own:
                state_dict[prefix + new + rest[len(old):]] = state_dict.pop(key)
                break


def parameters_with_step(model: torch.nn.Module) -> list[str]:
    """The names (today's) of ``model``'s parameters in the order ``model.parameters()`` listed them
    when a layer held a mixer's parameters as its ``step``: in each mixer, the layer's projections
    (:data:`MIXER_LAYER_KEYS`) first, then the mixer's own parameters, then its other modules."""
    names: list[str] = []

    def visit(module: torch.nn.Module, prefix: str) -> None:
        params, children = list(module.named_parameters(recurse=False)), list(module.named_children())
        if _is_mixer(module):
            layer = [(n, m) for n, m in children if n in MIXER_LAYER_KEYS]
            for n, m in layer:
                visit(m, f"{prefix}{n}.")
            children = [(n, m) for n, m in children if n not in MIXER_LAYER_KEYS]
        names.extend(prefix + n for n, _ in params)
        for n, m in children:
            visit(m, f"{prefix}{n}.")

    visit(model, "")
    return list(dict.fromkeys(names))
