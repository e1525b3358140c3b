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
  refused (:class:`PackedWithCache`), as transformers' attention layers would mix its documents then.

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
(:class:`ServedFallback`) naming what attnlab serves and that this step is transformers' own.

Each served function computes in float32 as transformers' path does (in float64 for a float64 model, a reference); the
delta rules' decays are accumulated and exponentiated in float64 inside the kernel (see
:func:`~attnlab.efficient.recurrence.chunk_delta`). An argument attnlab cannot serve is refused by name.

Usage::

    from attnlab.integrations.transformers import use_kernels
    swap = use_kernels(model)      # swap.replaced: {layer name: the functions now attnlab's}
    swap.restore()                 # transformers' own path again
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import logging
import re
import sys
import warnings
import weakref
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..efficient import recurrence
from .rebind import served_methods

__all__ = ["LAYERS", "MODEL_TYPES", "Kernels", "PackedWithCache", "ServedFallback", "UnservedArgument", "causal_conv",
           "delta_rule", "offsets_from_positions", "ssd_scan", "ssd_step", "tiny_config", "use_kernels"]

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

# transformers' per-call keyword arguments that change nothing in a recurrence (the packing ones are read)
_HARMLESS = {"num_items_in_batch", "output_hidden_states", "output_attentions", "output_router_logits", "cu_seq_lens_k",
             "max_length_q", "max_length_k", "position_ids", "is_causal", "chunk_size", "use_cache", "return_dict",
             "cache_position"}


class UnservedArgument(ValueError):
    """A hybrid layer asked a served function for something attnlab does not compute."""


def _refuse(fn: str, kwargs: dict) -> None:
    extra = sorted(k for k, v in kwargs.items() if v is not None and k not in _HARMLESS)
    if extra:
        raise UnservedArgument(f"attnlab's {fn} cannot serve {', '.join(extra)}: call use_kernels(model).restore() "
                               "to use transformers' own path")


def _wide(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``t`` in float32, as transformers' paths compute whatever the model's dtype, or in float64
    when ``like`` (the layer's input) is: a float64 model is a reference."""
    return t.to(torch.float64 if like.dtype == torch.float64 else torch.float32)


def _offsets(cu_seqlens, cu_seq_lens_q, seq_idx) -> torch.Tensor | None:
    """Packed documents' offsets from any of the three spellings (``seq_idx``: Mamba's document
    index per position, ``(1, N)``)."""
    cu = cu_seqlens if cu_seqlens is not None else cu_seq_lens_q
    if cu is None and seq_idx is not None:
        idx = seq_idx.reshape(-1)
        starts = torch.nonzero(idx[1:] != idx[:-1]).flatten() + 1
        cu = torch.cat([starts.new_zeros(1), starts, starts.new_full((1,), idx.numel())])
    return None if cu is None else cu.long()


def _no_cache(fn: str, cu, initial_state, output_final_state) -> None:
    if cu is not None and (initial_state is not None or output_final_state):
        raise UnservedArgument(f"attnlab's {fn} keeps packed documents apart without a cache, as transformers packs "
                               "its attention layers only then: call the model with use_cache=False")


def delta_rule(l2norm: Callable, name: str = "delta_rule") -> Callable:
    """The gated delta rule (per head: Gated DeltaNet; per channel: KDA) with fla's and transformers' arguments,
    ``(B, T, H, D)`` tensors, served by attnlab's chunkwise form (or one step of the recurrent one,
    :func:`~attnlab.efficient.recurrence.delta_step`, for a token decoded from a state); ``l2norm`` is the modeling
    module's own, so that the normalisation rounds as transformers' does. Value heads may outnumber key heads (Qwen's
    grouped values)."""

    def run(query, key, value, g, beta, chunk_size=64, initial_state=None, output_final_state=False,
            use_qk_l2norm_in_kernel=False, cu_seqlens=None, scale=None, cu_seq_lens_q=None, **kwargs):
        _refuse(name, kwargs)
        dtype, n = query.dtype, query.shape[1]
        cu = _offsets(cu_seqlens, cu_seq_lens_q, None)
        _no_cache(name, cu, initial_state, output_final_state)
        state = None if initial_state is None else _wide(initial_state, query)
        step = n == 1 and cu is None and state is not None  # decoding: one step, on (B, H, D) views
        q, k, v, b, gd = (_wide(t[:, 0] if step else t.transpose(1, 2), query).contiguous()
                          for t in (query, key, value, beta, g))
        if use_qk_l2norm_in_kernel:
            q, k = l2norm(q, dim=-1, eps=1e-6), l2norm(k, dim=-1, eps=1e-6)
        if v.shape[1] != k.shape[1]:  # each key head serves H_v / H_k consecutive value heads
            q, k = (t.repeat_interleave(v.shape[1] // k.shape[1], dim=1) for t in (q, k))
        q = q * (q.shape[-1] ** -0.5 if scale is None else scale)
        if step:
            o, s = recurrence.delta_step(q, k, v, b, gd, state)
            return o[:, None].to(dtype), (s if output_final_state else None)
        o, s = recurrence.chunk_delta(q, k, v, b, gd, state=state, cu_seqlens=cu)
        return o.transpose(1, 2).to(dtype), (s if output_final_state else None)

    run.__name__ = run.__qualname__ = name
    return run


def causal_conv(hidden_states, weight, bias=None, activation=None, cu_seq_lens_q=None, seq_idx=None, **kwargs):
    """The depthwise causal convolution of the hybrid layers, ``(B, C, T)``, weight ``(C, K)``;
    with packed documents no position sees an earlier document's."""
    from transformers.activations import ACT2FN

    _refuse("causal_conv1d_fn", kwargs)
    x = hidden_states.to(weight.dtype)
    out = recurrence.causal_conv(x, weight, bias, cu_seqlens=_offsets(None, cu_seq_lens_q, seq_idx))
    if activation is not None:
        out = ACT2FN[activation](out)
    return out.to(hidden_states.dtype)


def _ssd_inputs(hidden_states, dt, a, b, c, dt_bias, dt_softplus, dt_limit):
    """SSD as gated linear attention: the query ``C``, key ``B`` (a group shared by H / G heads),
    value ``dt x`` and log decay ``dt A``, ``(B, H, T, ...)`` in float32."""
    heads = hidden_states.shape[2]
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if dt_softplus:
        dt = F.softplus(dt)
    dt = _wide(torch.clamp(dt, min=dt_limit[0], max=dt_limit[1]), hidden_states)  # (B, T, H)
    x = _wide(hidden_states, hidden_states)
    q, k = (_wide(t, hidden_states).repeat_interleave(heads // t.shape[2], dim=2).transpose(1, 2).contiguous()
            for t in (c, b))
    v = (x * dt[..., None]).transpose(1, 2).contiguous()
    return x, q, k, v, (_wide(a, hidden_states)[:, None] * dt.transpose(1, 2)).contiguous()


def ssd_scan(hidden_states, dt, A, B, C, chunk_size=256, D=None, dt_bias=None, initial_states=None, dt_softplus=False,
             dt_limit=(0.0, float("inf")), return_final_states=False, z=None, seq_idx=None, cu_seqlens=None,
             cu_seq_lens_q=None, **kwargs):
    """Mamba-2's chunked scan (mamba-ssm's ``mamba_chunk_scan_combined`` arguments): ``x``
    ``(B, T, H, P)``, ``B``/``C`` ``(B, T, G, N)`` with G groups and state width N, the state
    ``(B, H, P, N)``; served by :func:`~attnlab.efficient.recurrence.chunk_gated`."""
    _refuse("mamba_chunk_scan_combined", kwargs)
    x, q, k, v, g = _ssd_inputs(hidden_states, dt, A, B, C, dt_bias, dt_softplus, dt_limit)
    cu = _offsets(cu_seqlens, cu_seq_lens_q, seq_idx)
    _no_cache("mamba_chunk_scan_combined", cu, initial_states, return_final_states)
    state = None if initial_states is None else _wide(initial_states, hidden_states).transpose(-1, -2)
    o, s = recurrence.chunk_gated(q, k, v, g, state=state, cu_seqlens=cu)
    y = o.transpose(1, 2).contiguous()  # the mixers view it
    if D is not None:
        y = y + _wide(D, hidden_states)[:, None] * x
    if z is not None:  # mamba-ssm's gate
        y = y * F.silu(_wide(z, hidden_states))
    return (y, s.transpose(-1, -2)) if return_final_states else y


def ssd_step(state, hidden_states, dt, A, B, C, D=None, dt_bias=None, dt_softplus=False, z=None, **kwargs):
    """One decoding step of Mamba-2 (mamba-ssm's ``selective_state_update``): ``x`` ``(B, H, P)``, ``dt``, ``dt_bias``
    and ``D`` repeated over P and ``A`` over ``(P, N)`` as the mixers give them, ``B``/``C`` ``(B, G, N)``; ``state``
    ``(B, H, P, N)`` updated in place; served by :func:`~attnlab.efficient.recurrence.gated_step`."""
    _refuse("selective_state_update", kwargs)
    x, heads = _wide(hidden_states, hidden_states), hidden_states.shape[1]
    dt = dt[..., 0] + (0 if dt_bias is None else dt_bias[:, 0].to(dt.dtype))
    dt = _wide(F.softplus(dt) if dt_softplus else dt, hidden_states)  # (B, H)
    q, k = (_wide(t, hidden_states).repeat_interleave(heads // t.shape[1], dim=1) for t in (C, B))
    a = _wide(A[:, 0, 0], hidden_states)
    o, s = recurrence.gated_step(q, k, x * dt[..., None], a * dt, _wide(state, hidden_states).transpose(-1, -2))
    state.copy_(s.transpose(-1, -2).to(state.dtype))
    out = o + (0 if D is None else x * _wide(D, hidden_states))
    if z is not None:
        out = out * F.silu(_wide(z, hidden_states))
    return out.to(hidden_states.dtype)


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
    _SERVED_CALL.set(None)


_SERVED_CALL: contextvars.ContextVar = contextvars.ContextVar("attnlab_served_call", default=None)
"""What the served model whose call is in progress serves (``{layer class: the served functions}``),
for :class:`_Fallbacks`; a context variable, so one per thread."""


def _enter(served: dict[str, tuple[str, ...]], model, args) -> None:
    """The served model's forward pre-hook (after :func:`_pack`): its call is in progress."""
    _SERVED_CALL.set(served)


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


_SERVING: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # the layers use_kernels serves now


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
            layer = self.model.get_submodule(name)
            for method in methods:
                layer.__dict__.pop(method, None)
            _SERVING.pop(layer, None)


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
    if module in _SERVING:
        raise ValueError(f"{name} ({type(module).__name__}) is already served by attnlab (use_kernels called twice?): "
                         "restore() what the first call returned")
    methods = served_methods(module, modeling, served)
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
    filter: see :class:`ServedFallback`), so other models of the same family, in this thread or another, keep
    transformers' path, and the served model needs no lock. A forward pre-hook on the model turns ``position_ids`` that
    restart into packed offsets passed in the call.

    ``ValueError`` when the model has none of those layers, when one's modeling module lacks a function attnlab would
    serve (another transformers version), or when its layers are already served (nothing is changed then)."""
    layers = {name: (module, *_functions_for(name, module)) for name, module in model.named_modules()
              if type(module).__name__ in LAYERS}
    from transformers import PreTrainedModel

    if not layers:
        raise ValueError(f"{type(model).__name__} has no linear-attention layer attnlab serves (it serves "
                         f"{', '.join(LAYERS)})")
    for module, _, methods in layers.values():
        module.__dict__.update(methods)
        _SERVING[module] = True
    served = {type(module).__name__: tuple(fns) for module, fns, _ in layers.values()}
    hooks = [model.register_forward_pre_hook(_pack, with_kwargs=True),
             model.register_forward_pre_hook(functools.partial(_enter, served)),
             model.register_forward_hook(_unpack, with_kwargs=True, always_call=True)]
    kernel_logger = logging.getLogger(_KERNEL_LOGGER)
    if _FALLBACKS not in kernel_logger.filters:
        kernel_logger.addFilter(_FALLBACKS)
    hooks += [inner.register_forward_pre_hook(_pack_inner, with_kwargs=True)
              for inner in model.modules() if inner is not model and isinstance(inner, PreTrainedModel)]
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
