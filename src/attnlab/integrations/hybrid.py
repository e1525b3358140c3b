"""attnlab's recurrences inside transformers' hybrid models: :func:`use_kernels`.

Qwen3-Next and Qwen3.5 (Gated DeltaNet), Kimi Linear (Kimi Delta Attention) and Mamba-2 and Falcon-H1 (SSD) compute
their linear-attention layers with functions of their modeling module that fall back, without flash-linear-attention's
Triton kernels or mamba-ssm (that is, on any CPU), to a reference PyTorch path. :func:`use_kernels` makes those layers
compute through :mod:`attnlab.efficient.recurrence` instead:

* the chunkwise form (:func:`~attnlab.efficient.recurrence.chunk_delta`,
  :func:`~attnlab.efficient.recurrence.chunk_gated`) for training and prefill, the recurrent form
  for one-token decoding with the model's own cache;
* packed sequences: a batch of one whose ``position_ids`` restart (or given ``cu_seq_lens_q``) keeps its documents apart
  in the recurrences and the short convolutions, in one call, where transformers' own path refuses them (Qwen) or lets
  the state cross (Kimi, Mamba-2); such a row with a cache (``use_cache`` left to the config's True, or given) is
  refused (:class:`~attnlab.integrations.packing.PackedWithCache`), as transformers' attention layers would mix its
  documents then.

**Per model, not per process.** transformers' layers call these functions by their names in the modeling module. Without
the optional ``kernels`` package its extension points (``use_kernel_func_from_hub_with_fallback``) resolve the
implementation once, at import, for every model; with it, ``kernelize`` maps functions by name for every model of a
class and needs a kernel repository layout. Neither serves one model and not another, so :func:`use_kernels` gives each
served layer, as its own attributes, copies of its class's methods that look these names up in
``attnlab.served.<modeling module>`` (the modeling module's names, the served functions in place of transformers'). No
module, class or function of transformers changes: another model of the same family, in this thread or another, keeps
transformers' path; two served models run in two threads without a lock; ``torch.compile`` guards the copies' names
through that module. The packed offsets travel in the call's keyword arguments (``cu_seq_lens_q``), which transformers
hands to every layer, so a checkpointed layer recomputes with them in the backward.

The model's parameters, cache and every other step stay transformers'; its attention layers keep their
``attn_implementation`` (``"attnlab"`` included). One of those steps is the short convolution's one-token update in
decoding (``causal_conv1d_update``), transformers' own reference PyTorch implementation without the ``causal-conv1d``
package: transformers' line that it "is falling back to its reference PyTorch implementation", said during a call of a
served model, would read as if attnlab served nothing, so it is replaced there by one warning of attnlab's
(:class:`~attnlab.integrations.fallbacks.ServedFallback`) naming what attnlab serves and that this step is
transformers' own.

Each served function computes in float32 as transformers' path does (in float64 for a float64 model, a reference); the
delta rules' decays are accumulated and exponentiated in float64 inside the kernel (see
:func:`~attnlab.efficient.recurrence.chunk_delta`). An argument attnlab cannot serve is refused by name
(:class:`~attnlab.integrations.adapters.UnservedArgument`).

This module holds what a user calls; the rest is in its siblings: the served functions in
:mod:`~attnlab.integrations.adapters` (the delta rules, the short convolution) and :mod:`~attnlab.integrations.ssd`
(Mamba-2's SSD), the layers' method copies in :mod:`~attnlab.integrations.rebind`, and the model's hooks in
:mod:`~attnlab.integrations.packing` (packed documents) and :mod:`~attnlab.integrations.fallbacks` (transformers'
fallback line).

Usage::

    from attnlab.integrations.transformers import use_kernels
    swap = use_kernels(model)      # swap.replaced: {layer name: the functions now attnlab's}
    swap.restore()                 # transformers' own path again
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable

import torch
from torch import nn

from . import fallbacks, packing, rebind
from .adapters import causal_conv, delta_rule
from .ssd import ssd_scan, ssd_step

__all__ = ["LAYERS", "MODEL_TYPES", "Kernels", "tiny_config", "use_kernels"]

LAYERS = {
    "Qwen3NextGatedDeltaNet": "qwen3_next",
    "Qwen3_5GatedDeltaNet": "qwen3_5",
    "Qwen3_5MoeGatedDeltaNet": "qwen3_5_moe",
    "KimiLinearDeltaAttention": "kimi_linear",
    "Mamba2Mixer": "mamba2",
    "FalconH1Mixer": "falcon_h1",
}
"""The layer classes :func:`use_kernels` serves, and their transformers model family."""

MODEL_TYPES = frozenset({"qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "kimi_linear",
                         "mamba2", "falcon_h1"})
"""The configs' ``model_type`` of the models whose layers :data:`LAYERS` lists (Qwen3.5's text models have theirs)."""


def _served(family: str, modeling) -> dict[str, Callable]:
    """The functions of a modeling module attnlab serves, by the name the layer calls."""
    conv = {"causal_conv1d_fn": causal_conv}
    if family in ("mamba2", "falcon_h1"):
        return conv | {"mamba2_chunk_scan": ssd_scan, "mamba2_selective_state_update": ssd_step}
    rule = functools.partial(delta_rule, modeling.l2norm)
    if family == "kimi_linear":
        return conv | {"chunk_kimi_delta_attention": rule("chunk_kda"),
                       "recurrent_kimi_delta_attention": rule("fused_recurrent_kda")}
    return conv | {"torch_chunk_gated_delta_rule": rule("chunk_gated_delta_rule"),
                   "torch_recurrent_gated_delta_rule": rule("fused_recurrent_gated_delta_rule")}


@dataclasses.dataclass
class Kernels:
    """What :func:`use_kernels` replaced: ``replaced`` maps each layer's name in the model to the
    names of the modeling functions attnlab now serves for it; :meth:`restore` undoes it."""

    model: nn.Module
    replaced: dict[str, tuple[str, ...]]
    hooks: list[torch.utils.hooks.RemovableHandle]
    methods: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)

    def restore(self) -> None:
        """Give every layer back transformers' own path (its methods the class's again, the model's hook removed)."""
        for hook in self.hooks:
            hook.remove()
        for name, methods in self.methods.items():
            rebind.take_methods(self.model.get_submodule(name), methods)


def _functions_for(name: str, module: nn.Module) -> tuple:
    """A served layer's modeling module and the functions attnlab serves for it; ``ValueError``
    when the module lacks one (another transformers version) or the layer is already served."""
    modeling = sys.modules[type(module).__module__]
    try:
        served = _served(LAYERS[type(module).__name__], modeling)
        missing = [f for f in served if not hasattr(modeling, f)]
    except AttributeError as e:  # the delta rules take the module's own l2norm
        served, missing = {}, [str(e.name)]
    if missing:
        raise ValueError(f"{type(module).__name__} ({modeling.__name__}) has no {', '.join(missing)}: "
                         "attnlab serves the hybrid layers of transformers 5.24")
    if rebind.is_served(module):
        raise ValueError(f"{name} ({type(module).__name__}) is already served by attnlab (use_kernels called twice?): "
                         "restore() what the first call returned")
    methods = rebind.served_methods(module, modeling, served)
    if not methods:
        raise ValueError(f"no method of {type(module).__name__} ({modeling.__name__}) calls {', '.join(served)}: "
                         "attnlab serves the hybrid layers of transformers 5.24")
    return served, methods


def use_kernels(model: nn.Module) -> Kernels:
    """Make every linear-attention layer of a transformers hybrid model (:data:`LAYERS`) compute
    through attnlab's recurrences (see the module) and return what it replaced.

    Only this model's layers change: each gets, as its own attributes, copies of its class's methods that call the
    served functions, which find attnlab's functions where the class's find transformers' (the copies look names up in a
    namespace of their own). transformers' modules, classes and functions are never changed (its kernel logger gets a
    filter: see :class:`~attnlab.integrations.fallbacks.ServedFallback`), so other models of the same family, in this
    thread or another, keep transformers' path, and the served model needs no lock. A forward pre-hook on the model
    turns ``position_ids`` that restart into packed offsets passed in the call.

    ``ValueError`` when the model has none of those layers, when one's modeling module lacks a function attnlab would
    serve (another transformers version), or when its layers are already served (nothing is changed then)."""
    layers = {name: (module, *_functions_for(name, module)) for name, module in model.named_modules()
              if type(module).__name__ in LAYERS}
    if not layers:
        raise ValueError(f"{type(model).__name__} has no linear-attention layer attnlab serves (it serves "
                         f"{', '.join(LAYERS)})")
    for module, _, methods in layers.values():
        rebind.give_methods(module, methods)
    served = {type(module).__name__: tuple(fns) for module, fns, _ in layers.values()}
    hooks = packing.register(model) + fallbacks.register(model, served)
    return Kernels(model, {name: tuple(served) for name, (_, served, _) in layers.items()}, hooks,
                   {name: tuple(methods) for name, (_, _, methods) in layers.items()})


def tiny_config(family: str, *, hidden: int = 64, heads: int = 4, head_dim: int = 16, layers: int = 4, **overrides):
    """A small randomly initialisable config of a hybrid family (``"qwen3_next"``, ``"qwen3_5_text"``,
    ``"kimi_linear"``, ``"mamba2"``, ``"falcon_h1"``): three linear-attention layers to one
    attention layer, grouped value heads (Qwen), two B/C groups and a state width other than the
    head width (Mamba-2, Falcon-H1); for tests, benchmarks and examples without a download."""
    from transformers import AutoConfig

    common = dict(vocab_size=128, hidden_size=hidden, intermediate_size=hidden * 3 // 2, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=heads // 2, head_dim=head_dim,
                  max_position_embeddings=16384, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    mixed = ["linear_attention"] * 3 + ["full_attention"]
    kinds = (mixed * layers)[:layers]
    families = {
        "qwen3_next": dict(linear_num_value_heads=heads, linear_num_key_heads=heads // 2, linear_key_head_dim=head_dim,
                           linear_value_head_dim=head_dim, linear_conv_kernel_dim=4, num_experts=4,
                           num_experts_per_tok=2, moe_intermediate_size=hidden // 2,
                           shared_expert_intermediate_size=hidden // 2, layer_types=kinds),
        "qwen3_5_text": dict(linear_num_value_heads=heads, linear_num_key_heads=heads // 2,
                             linear_key_head_dim=head_dim, linear_value_head_dim=head_dim, linear_conv_kernel_dim=4,
                             layer_types=kinds),
        "kimi_linear": dict(num_key_value_heads=heads, num_experts=4, num_experts_per_token=2,
                            moe_intermediate_size=hidden // 2, kv_lora_rank=16, qk_rope_head_dim=8,
                            qk_nope_head_dim=head_dim, v_head_dim=head_dim, linear_head_dim=head_dim,
                            linear_num_heads=heads, mlp_layer_types=["dense"] + ["sparse"] * (layers - 1),
                            layer_types=kinds),
        "mamba2": dict(num_heads=2 * hidden // head_dim, state_size=24, n_groups=2, expand=2, chunk_size=64),
        "falcon_h1": dict(mamba_d_ssm=2 * hidden, mamba_n_heads=2 * hidden // head_dim, mamba_d_head=head_dim,
                          mamba_d_state=24, mamba_n_groups=2, mamba_chunk_size=64),
    }
    if family not in families:
        raise ValueError(f"no tiny config for {family!r}: the hybrid families are {', '.join(families)}")
    if family == "mamba2":
        common = dict(vocab_size=128, hidden_size=hidden, num_hidden_layers=layers, head_dim=head_dim,
                      pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return AutoConfig.for_model(family, **{**common, **families[family], **overrides})
