"""The mapping of a checkpoint written before a :class:`attnlab.MultiHeadAttention` held its step: the load hook that
renames its keys, and the order its optimizer's state was written in."""

from __future__ import annotations

import torch

from .step import AttentionStep

__all__ = ["LAYER_KEYS", "parameters_before_step", "step_keys"]

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
