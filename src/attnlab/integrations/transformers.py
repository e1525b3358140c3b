"""attnlab as an attention backend of Hugging Face ``transformers`` (5.x): any model, any variant.

Importing this module registers, in ``transformers``' ``AttentionInterface`` and ``AttentionMaskInterface``:

* ``attn_implementation="attnlab"``: :func:`attnlab.attend` computes every attention of the model, exactly (float64
  parity with transformers' ``sdpa`` path), with the mask transformers builds handed over as an attnlab mask function of
  positions (:class:`~attnlab.integrations.masking.ModelMask`: causal, sliding window, padding, cache offsets), grouped
  key/value heads, soft-capping (a score function), dropout, and ``return`` of the weights when the model asks for
  them. The model's config may set ``attnlab_options={"score": ..., "normalize": ...}`` to swap the score or the
  normaliser into a trained model (and ``"backend"``, ``"block_size"``: :func:`attnlab.attend`'s).
* ``attn_implementation="attnlab:<variant>"`` for every variant of :mod:`attnlab.efficient` that takes a model's q, k, v
  (every attention step; not the sequence mixers, which own their projections and gates): the trained projections stay,
  the attention step is the variant's. Its options come from ``config.attnlab_options`` (e.g. ``{"window": 64}``,
  ``{"seed": 1}`` for the draw of a variant's own parameters; ``max_len`` defaults to the model's positions). What the
  model needs and the variant cannot give (a causal model and a variant with no causal form, a sliding window that cuts,
  soft-capping, dropout, cached decoding) raises :class:`UnsupportedError` naming both (as ``"attnlab:retnet"`` and the
  other variants that cannot serve do).

The linear-attention layers of hybrid models (Qwen3-Next, Qwen3.5, Kimi Linear, Mamba-2, Falcon-H1) compute through
attnlab's recurrences with :func:`use_kernels` (from :mod:`attnlab.integrations.hybrid`).

Usage::

    import attnlab.integrations.transformers
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="attnlab")
    model = AutoModel.from_pretrained(folder, attn_implementation="attnlab:local")
    model.config.attnlab_options = {"window": 64}  # read at every call; saved with the config
    attnlab.integrations.transformers.set_attention(model, "local", window=64)  # both at once, checked

:func:`implementation` turns a variant name into the ``attn_implementation`` string, or names the
closest known one. transformers refuses a name it does not hold (``"attnlab:lokal"``) before attnlab
sees it: :func:`set_attention` checks the name and the options first."""

from __future__ import annotations

import difflib
import itertools
import math
import weakref
from functools import partial

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, AttentionMaskInterface, PretrainedConfig

from .. import efficient
from ..core.attend import AttentionResult, attend
from ..core.maskfn import Mask
from ..core.masks import causal as causal_mask
from ..core.masks import valid_keys
from ..core.score_mods import softcap as softcap_mod
from ..layers.step import StepCall, check_decodes
from ..registry import keyword_options
from ..validate import ArgumentTypeError
from .hybrid import Kernels, use_kernels
from .masking import ModelMask, model_mask

__all__ = ["NAME", "OPTIONS", "Kernels", "UnsupportedError", "implementation", "implementations", "serving_steps",
           "set_attention", "use_kernels"]

NAME = "attnlab"
"""The exact backend's ``attn_implementation``; ``"attnlab:<variant>"`` for a variant."""

OPTIONS = "attnlab_options"
"""The config field that holds the backend's options (a dict, saved with the model's config)."""

DENSE_OPTIONS = ("score", "normalize", "backend", "block_size")
"""The options of the exact backend: a score and a normaliser by name (:mod:`attnlab.scores`,
:mod:`attnlab.normalizers`), and :func:`attnlab.attend`'s ``backend`` and ``block_size``."""


class UnsupportedError(ValueError):
    """The model needs something the chosen attention cannot give (the message names both)."""


def _swappable() -> list[str]:
    """The variants a model's q, k and v can go through, from their declared capabilities: every
    attention step (a sequence mixer owns its projections and computes gates from the layer's input), but
    dense (``"attnlab"`` itself) and the references of another variant (dense_naive)."""
    return sorted(v for v in efficient.select(mixer=False, reference=False) if v != "dense")


def implementations() -> list[str]:
    """Every ``attn_implementation`` this module registers: ``"attnlab"`` and ``"attnlab:<variant>"``."""
    return [NAME] + [f"{NAME}:{v}" for v in _swappable()]


def implementation(variant: str = "dense") -> str:
    """The ``attn_implementation`` of ``variant`` (``"dense"``: ``"attnlab"``; ``"attnlab:<variant>"`` is taken too).

    Raises ValueError for an unknown variant (naming the closest and the known ones) or a sequence mixer,
    which computes its gates from the layer's input and so cannot take a model's q, k, v."""
    variant = variant.removeprefix(f"{NAME}:")
    if variant in (NAME, "dense"):
        return NAME
    known = ["dense"] + _swappable()
    if variant not in efficient.names():
        near = difflib.get_close_matches(variant, known, n=1)
        raise ValueError(f"unknown attention variant {variant!r}{f' (did you mean {near[0]!r}?)' if near else ''}; "
                         f"known: {', '.join(known)}")
    if variant not in _swappable():
        raise ValueError(_unswappable(variant))
    return f"{NAME}:{variant}"


def _unswappable(variant: str) -> str:
    caps = efficient.capabilities(variant)
    why = (f"the exact attention is attn_implementation={NAME!r}, not '{NAME}:{variant}'"
           if variant == "dense" or caps.reference else f"the {variant!r} attention is a sequence mixer: it computes "
           "its gates from the layer's input, so it cannot take a trained model's q, k and v")
    return f"{why}; swappable: {', '.join(['dense'] + _swappable())}"


MODEL_SETS = ("embed_dim", "num_heads", "causal", "bias", "head_mode", "kdim", "vdim", "num_kv_heads", "positional",
              "positional_options")
"""A variant's options that the model settles (its projections, heads, causality and positions): refused."""


def _takes(variant: str) -> list[str] | None:
    """The options ``config.attnlab_options`` may hold for ``variant`` (None: not known)."""
    if variant == "dense":
        return list(DENSE_OPTIONS)
    valid = efficient.VARIANTS.options(variant)  # seed: the draw of the variant's own parameters
    return None if valid is None else sorted({o for o in valid if o not in MODEL_SETS} | {"seed"})


def _check_options(variant: str, options) -> None:
    """Refuse an option ``variant`` does not take, naming those that take it (one left from a previous variant)."""
    takes = _takes(variant) or list(options)  # not known: every option passes
    bad = [o for o in options if o not in takes]
    if not bad:
        return
    what = (f"the exact attention takes {', '.join(takes)}, not {', '.join(bad)}" if variant == "dense" else
            f"unknown option {', '.join(map(repr, bad))} for the attention {variant!r}; it takes {', '.join(takes)}")
    owners = {o: [v for v in ["dense"] + _swappable() if o in (_takes(v) or ())] for o in bad}
    stale = [f"{o!r} is an option of {', '.join(vs)}" for o, vs in owners.items() if vs]
    if stale:
        what += (f" ({'; '.join(stale)}: left from an earlier attn_implementation?). Reset the options with "
                 f"model.config.{OPTIONS} = {{}}, or switch with "
                 f"attnlab.integrations.transformers.set_attention(model, {variant!r}, ...), which sets both")
    else:
        near = [n for o in bad for n in difflib.get_close_matches(o, takes, n=1)]
        what += f" (did you mean {', '.join(map(repr, near))}?)" if near else ""
    raise ValueError(f"config.{OPTIONS}: {what}")


def set_attention(model, variant: str = "dense", **options) -> str:
    """Set ``model``'s attention to attnlab's ``variant`` with exactly ``options`` (an earlier variant's dropped):
    ``model.set_attn_implementation(implementation(variant))``, the name and options checked first, and
    ``config.attnlab_options`` set on every config of the model (an encoder-decoder's stacks hold their own).
    Returns the ``attn_implementation``; raises ValueError for an unknown or unswappable variant, an option it
    does not take, or a model whose attention is not transformers' ``AttentionInterface``'s."""
    impl = implementation(variant)
    _check_options(impl.removeprefix(NAME).removeprefix(":") or "dense", options)
    model.set_attn_implementation(impl)
    if model.config._attn_implementation != impl:  # transformers only logs a warning for such a model
        raise ValueError(f"{type(model).__name__} does not route its attention through transformers' "
                         f"AttentionInterface: no {impl!r}")
    configs = {id(c): c for m in model.modules() if isinstance(c := getattr(m, "config", None), PretrainedConfig)}
    for config in configs.values():
        setattr(config, OPTIONS, dict(options))
    return impl


# ------------------------------------------------------------------------------------------ attention
def _who(module) -> str:
    config = getattr(module, "config", None)
    kind = getattr(config, "model_type", None)
    return f"{type(module).__name__}" + (f" (a {kind} model)" if kind else "")


def _options(module) -> dict:
    opts = getattr(getattr(module, "config", None), OPTIONS, None) or {}
    if not isinstance(opts, dict):
        raise ArgumentTypeError(f"config.{OPTIONS} must be a dict of options, got {type(opts).__name__}")
    return dict(opts)


def _mask_and_bias(attention_mask, module, n: int, is_causal, position_bias) -> tuple:
    """The attnlab mask and additive bias of what the model hands over (``position_bias``: T5's
    relative-position bias and the like, added to the scores)."""
    mask, bias = attention_mask, position_bias
    if attention_mask is None:
        causal = getattr(module, "is_causal", False) if is_causal is None else is_causal
        mask = causal_mask(align="top_left") if causal and n > 1 else None
    elif isinstance(attention_mask, torch.Tensor) and attention_mask.is_floating_point():
        mask = None  # an additive mask (0 / very negative), as sdpa takes it
        bias = attention_mask if bias is None else bias + attention_mask
    elif isinstance(attention_mask, ModelMask) and attention_mask.kind == ("full",) and attention_mask.flags is None:
        mask = None  # every query sees every key: no mask to read
    return mask, bias


def attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
                      softcap: float | None = None, position_bias: torch.Tensor | None = None, *,
                      variant: str = "dense", **kwargs):
    """transformers' attention interface: ``query`` ``(B, H, N, D)``, ``key`` / ``value``
    ``(B, G, M, D)`` (G dividing H) -> ``(B, N, H, D)`` and the weights (or None)."""
    options = _options(module)
    d = query.shape[-1]
    if scaling is not None and not math.isclose(scaling * math.sqrt(d), 1.0, rel_tol=1e-12):
        query = query * (scaling * math.sqrt(d))  # the model's scale, on the 1 / sqrt(D) every attnlab score assumes
    mask, bias = _mask_and_bias(attention_mask, module, query.shape[2], kwargs.get("is_causal"), position_bias)
    weights = bool(kwargs.get("output_attentions", False))
    mod = softcap_mod(softcap) if softcap else None
    if variant == "dense":
        _check_options("dense", options)
        res = attend(query, key, value, score=options.get("score", "scaled_dot"),
                     normalize=options.get("normalize", "softmax"), mask=mask, bias=bias, score_mod=mod,
                     dropout_p=dropout, return_weights=weights, backend=options.get("backend", "auto"),
                     block_size=options.get("block_size"))
    else:
        res = _swapped(module, variant, options, query, key, value, mask=mask, bias=bias, mod=mod, softcap=softcap,
                       dropout=dropout, weights=weights)
    return res.output.transpose(1, 2).contiguous(), res.weights


def _swapped(module, variant, options, q, k, v, *, mask, bias, mod, softcap, dropout, weights) -> AttentionResult:
    """The model's attention call on the efficient ``variant`` (with its ``options``) in place of
    ``module``'s; ``mod``: the score function of ``softcap`` (None without); refused with
    :class:`UnsupportedError` where the variant cannot compute it."""
    caps = efficient.capabilities(variant)
    n, m = q.shape[2], k.shape[2]
    who = _who(module)
    pattern = caps.forms_scores  # exact attention under a sparse pattern: any score, bias, dropout, weights
    if not pattern:
        lacks = [what for what, needed in (
            ("a score bias", bias is not None), (f"soft-capping ({softcap})", mod is not None),
            (f"attention dropout ({dropout})", bool(dropout)), ("the attention weights", weights)) if needed]
        if lacks:
            raise UnsupportedError(f"{who} needs {' and '.join(lacks)}; the {variant!r} attention never forms the "
                                   "scores: use attn_implementation='attnlab' (exact) or a sparse pattern (local, "
                                   "longformer, bigbird)")
        causal, flags = _structure(mask, n, m, who, variant)
        if causal and caps.causal is None:
            raise UnsupportedError(f"{who} attends causally; the {variant!r} attention has no causal form "
                                   "(its method mixes every key into every query)")
    else:
        kind = mask.kind if isinstance(mask, ModelMask) else ("custom",)
        causal = (kind[0] == "band" and kind[2] == 0) or (isinstance(mask, Mask) and mask.is_causal(n, m))
    step = _step(module, variant, options, causal, q)
    pad = m - n
    if pad:  # queries at the end of a longer sequence (decoding with a cache): the variant's last rows of the whole
        try:
            check_decodes(step)
        except ValueError as e:
            raise UnsupportedError(f"{who} decodes with a cache; {e}") from None
        if pad < 0 or bias is not None or (pattern and isinstance(mask, ModelMask) and mask.kind == ("custom",)):
            raise UnsupportedError(f"{who} hands over {n} queries for {m} keys under a mask that does not place them "
                                   "at the end of the sequence (a static cache, or a rule of its own); the "
                                   f"{variant!r} attention decodes with transformers' dynamic cache")
        q = F.pad(q, (0, 0, pad, 0))
    if pattern:
        if isinstance(mask, ModelMask) and mask.offset and not step.full_pattern().shift_invariant:
            raise UnsupportedError(f"{who} keeps a sliding-window cache (its keys start at position {mask.offset}); "
                                   f"the {variant!r} attention's pattern is tied to absolute positions: use 'local' or "
                                   "the exact 'attnlab'")
        step.dropout = float(dropout)  # the model's, per call: the step applies it in training mode
        step.train(bool(dropout))
        res = step(q, k, v, StepCall(mask=mask, bias=bias, score_mod=mod, return_weights=weights))
    else:
        if k.shape[1] != q.shape[1]:  # grouped keys / values, repeated to H heads
            k, v = (x.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for x in (k, v))
        res = step(q, k, v, StepCall(mask=None if flags is None else valid_keys(flags)))
    if not pad:
        return res
    return AttentionResult(res.output[:, :, pad:], None if res.weights is None else res.weights[:, :, pad:])


def _structure(mask, n: int, m: int, who: str, variant: str) -> tuple[bool, torch.Tensor | None]:
    """(causal, key flags) of the model's mask at ``n`` queries and ``m`` keys, or UnsupportedError."""
    if mask is None:
        return False, None
    if isinstance(mask, ModelMask):
        if mask.kind == ("full",):
            return False, mask.flags
        if mask.kind[0] == "band":
            lo, hi = mask.kind[1:]
            sees_all_past = lo is None or lo <= -(mask.offset + m - 1)  # from 0: a sliding cache has dropped keys
            if sees_all_past and (hi is None or hi >= m - 1):
                return False, mask.flags
            if sees_all_past and hi == 0:
                return True, mask.flags
            if hi == 0:
                raise UnsupportedError(f"{who} attends within a sliding window of {1 - lo} positions, which cuts at "
                                       f"{mask.offset + m} keys; the {variant!r} attention cannot keep to a window: "
                                       f"use 'local' (window={-lo}) or the exact 'attnlab'")
        raise UnsupportedError(f"{who}'s mask is a rule of its own ({mask.kind[0]}: another mask function, or a static "
                               f"cache); the {variant!r} attention takes causal or full attention with padding: use "
                               "the exact 'attnlab'")
    if isinstance(mask, torch.Tensor) and mask.dim() == 4 and mask.shape[1:3] == (1, 1):
        return False, mask[:, 0, 0].expand(-1, m)
    if isinstance(mask, Mask) and mask.is_causal(n, m):
        return True, None
    raise UnsupportedError(f"{who} hands over a mask ({type(mask).__name__}) other than causal or key padding; the "
                           f"{variant!r} attention cannot apply it: use the exact 'attnlab'")


_STEPS: weakref.WeakKeyDictionary[torch.nn.Module, dict] = weakref.WeakKeyDictionary()


def _step(module, variant: str, options: dict, causal: bool, q: torch.Tensor):
    """The attention step of the variant serving ``module`` (:func:`attnlab.efficient.step`: the
    model's own projections around it), built once per model attention, options and causality
    (its own parameters drawn with ``seed`` and the layer's index), kept on q's device and dtype."""
    per = _STEPS.setdefault(module, {})
    key = (variant, repr(sorted(options.items())), causal)
    step = per.get(key)
    h, d = q.shape[1], q.shape[-1]
    if step is None:
        _check_options(variant, options)
        takes = keyword_options(efficient.VARIANTS.get(variant)) or list(options)  # the step's own options
        seed = options.get("seed", 0)
        opts = ({"max_len": int(getattr(module.config, "max_position_embeddings", 512))}
                if efficient.budget(variant).max_len else {})
        opts.update({**options, **({"causal": causal} if efficient.capabilities(variant).causal == "option" else {})})
        opts = {k: v for k, v in opts.items() if k in takes}  # seed: where the step takes one; max_len: linformer's
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed) * 1000 + int(getattr(module, "layer_idx", 0) or 0))
            step = efficient.step(variant, embed_dim=h * d, num_heads=h, **opts)
        step.requires_grad_(False).eval()
        per[key] = step
    t = next(itertools.chain(step.parameters(), step.buffers()), None)
    if t is not None and (t.device != q.device or (t.is_floating_point() and t.dtype != q.dtype)):
        step.to(device=q.device, dtype=q.dtype)
    return step


def serving_steps(model) -> dict[str, list]:
    """The attention steps serving ``model``'s attention modules that have run an ``attnlab:<variant>``, by module
    name (one per variant, options and causality run), to inspect or watch
    (:meth:`~attnlab.layers.step.AttentionStep.register_hook`)."""
    return {name: list(_STEPS[m].values()) for name, m in model.named_modules() if m in _STEPS}


def _refuse(module, *args, variant: str, **kwargs):
    """``"attnlab:<variant>"`` of a variant that cannot serve: attnlab's reason, not transformers' list of its own."""
    raise UnsupportedError(f"{_who(module)}: {_unswappable(variant)}")


def _register() -> None:
    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, model_mask)
    for v in efficient.names():
        forward = partial(attention_forward, variant=v) if v in _swappable() else partial(_refuse, variant=v)
        AttentionInterface.register(f"{NAME}:{v}", forward)
        AttentionMaskInterface.register(f"{NAME}:{v}", model_mask)


_register()
