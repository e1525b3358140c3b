"""Read what every self-attention layer of a model computes on one input: weights, q, k, v.

:func:`capture` hooks every :class:`attnlab.MultiHeadAttention` and every sequence mixer
(:class:`attnlab.layers.mixer.SequenceMixer`) in a model; each self-attention call records the heads it attended
with (:meth:`attnlab.MultiHeadAttention.project`; a mixer's projected heads,
:meth:`~attnlab.layers.mixer.SequenceMixer.heads`) and its weights (exact attention, and a mixer that forms scores
such as FoX: an efficient variant never builds them).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from ..core.normalize import resolve_normalizer, softmax
from ..layers.mixer import SequenceMixer
from ..layers.multihead import MultiHeadAttention

__all__ = ["Captured", "capture", "stack_captured"]


@dataclass
class Captured:
    """One self-attention call: its module's name, weights ``(B, H, N, N)``, the heads ``q, k, v``
    ``(B, H, N, D)``, and ``scale`` when the weights are ``softmax(scale q . k)`` with no mask and
    no bias (then q and k are the score's prepared vectors and the viewer recomputes the weights;
    else None and ``why`` says why)."""

    name: str
    weights: torch.Tensor
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    scale: float | None
    why: str = ""


def _scale(mod: MultiHeadAttention, mask, bias, score_mod=None) -> tuple[float | None, str]:
    if resolve_normalizer(mod.step.normalize) is not softmax:
        return None, f"normaliser {mod.step.normalize!r} (the steps panel recomputes softmax only)"
    if bias is not None or score_mod is not None:
        return None, "a score bias (relative / ALiBi): the steps panel recomputes plain dot scores only"
    if mask is not None and not (isinstance(mask, torch.Tensor) and bool(mask.all())):
        return None, "a mask (causal, window, ...): the steps panel recomputes unmasked rows only"
    scale = mod.step.score.dot_scale(mod.head_dim)
    if scale is None:
        return None, f"score {mod.step.score_name!r} is not a scaled dot product of prepared q and k"
    return float(scale), ""


@contextmanager
def capture(model: nn.Module) -> Iterator[list[Captured]]:
    """While open, every self-attention call of a :class:`attnlab.MultiHeadAttention` or a sequence mixer inside
    ``model`` appends a :class:`Captured` to the list it yields (cross-attention is skipped).
    Raises ``ValueError`` for a layer that builds no weights (an efficient variant or a mixer that forms no scores
    refuses ``return_weights``)."""
    records: list[Captured] = []
    names = {m: n for n, m in model.named_modules()}

    def hook(mod, args, kwargs, output):
        query = args[0] if args else kwargs["query"]
        key = args[1] if len(args) > 1 else kwargs.get("key")
        if key is not None and key is not query:
            return
        mask, bias = kwargs.get("mask"), kwargs.get("bias")
        if isinstance(mod, SequenceMixer):
            records.append(_mixer_call(mod, names.get(mod) or type(mod).__name__, query, kwargs, output))
            return
        with torch.no_grad():
            q, k, v, score_mod = mod.project(query, positions=kwargs.get("positions"),
                                             key_positions=kwargs.get("key_positions"))
            k, v = mod.repeat_kv(k, v)  # grouped-query layers: one key / value head per query head
            weights = output.weights
            if weights is None:  # an efficient variant refuses: it never builds the weights
                try:
                    weights = mod.step(q, k, v, mask=mask, bias=bias, score_mod=score_mod, return_weights=True).weights
                except ValueError as e:
                    raise ValueError(f"{names.get(mod) or type(mod).__name__}: {e}") from None
            scale, why = _scale(mod, mask, bias, score_mod)
            if scale is not None:  # the vectors the scores are made of (cosine: normalised, bilinear: W k)
                q, k = mod.step.score.prepare(q, k)
        records.append(Captured(names.get(mod, ""), weights, q, k, v, scale, why))

    handles = [m.register_forward_hook(hook, with_kwargs=True) for m in model.modules()
               if isinstance(m, (MultiHeadAttention, SequenceMixer))]
    try:
        yield records
    finally:
        for h in handles:
            h.remove()


def _mixer_call(mod: SequenceMixer, name: str, query, kwargs: dict, output) -> Captured:
    """A sequence mixer's call: its weights (a mixer that forms scores; computed again with ``return_weights`` by its
    ``forward``, which runs no hooks, where the call did not ask for them) and its projected heads, before any short
    convolution or rotation; no ``scale``: its scores are its own (FoX adds its forget gate's decay)."""
    mask, positions = kwargs.get("mask"), kwargs.get("positions")
    with torch.no_grad():
        weights = output.weights
        if weights is None:
            try:
                weights = mod.forward(query, mask=mask, bias=kwargs.get("bias"), positions=positions,
                                      return_weights=True).weights
            except ValueError as e:
                raise ValueError(f"{name}: {e}") from None
        tokens = mod.tokens(query, mask, positions, kwargs.get("key_positions"), None, None)
        q, k, v = mod.heads(tokens.x, tokens.positions)
        k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))  # grouped: one per query head
    why = f"the {mod.name!r} mixer's scores are its own (not a plain dot product of its projections)"
    return Captured(name, weights, q, k, v, None, why)


def stack_captured(records: list[Captured], index: int = 0) -> dict:
    """Example ``index`` of every record, stacked over layers: ``weights`` ``(L, H, N, N)``, ``q``,
    ``k``, ``v`` ``(L, H, N, D)``, and one ``scale`` (None if any layer has none) with ``why``."""
    if not records:
        raise ValueError("no self-attention call was recorded: the model has no attnlab MultiHeadAttention")
    scales = {r.scale for r in records}
    scale = scales.pop() if len(scales) == 1 else None
    why = next((r.why for r in records if r.scale is None),
               "" if scale is not None else "the layers scale their scores differently")
    return {
        "weights": torch.stack([r.weights[index] for r in records]),
        "q": torch.stack([r.q[index] for r in records]),
        "k": torch.stack([r.k[index] for r in records]),
        "v": torch.stack([r.v[index] for r in records]),
        "scale": scale,
        "why": why,
    }
