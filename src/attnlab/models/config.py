"""The typed description of a model: :class:`ModelConfig`, with the attention and the positional
encoding each as a ``(name, options)`` spec.

A config is frozen and round-trips through JSON (:meth:`ModelConfig.to_dict` /
:meth:`ModelConfig.from_dict`), so a checkpoint, an arena record or a CLI run rebuilds its model
from it. :meth:`ModelConfig.from_dict` also reads the flat dict of version-1 checkpoints, whose
backbone options held ``attention``, ``attention_options``, ``positional``, ``num_heads``, ...
side by side.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..validate import ArgumentTypeError

__all__ = ["AttentionSpec", "ModelConfig", "PositionalSpec"]


@dataclass(frozen=True)
class AttentionSpec:
    """An attention variant by name (:func:`attnlab.efficient.names`) and its options
    (``window=``, ``num_features=``, ...), as :func:`attnlab.efficient.create` takes them."""

    name: str = "dense"
    options: dict = field(default_factory=dict)


@dataclass(frozen=True)
class PositionalSpec:
    """A positional encoding by name (:func:`attnlab.positional.names`) and its options."""

    name: str = "none"
    options: dict = field(default_factory=dict)


# backbone keyword options that have a typed field of their own
_TYPED = ("num_layers", "num_heads", "attention", "attention_options", "positional", "positional_options", "causal",
          "max_len")


@dataclass(frozen=True)
class ModelConfig:
    """Everything :func:`attnlab.models.build_model` needs to rebuild a model.

    Attributes:
        kind: the task's output kind (``tagging``, ``classification``, ``regression``, ``seq2seq``).
        model: the backbone by name (:func:`attnlab.models.names`).
        num_labels: output classes (1: one value). embed_dim: the model width E.
        inputs: ``tokens``, ``features``, ``graph`` or ``image``.
        vocab_size: token ids (token inputs). feature_dim, edge_dim: vector / node / edge widths.
        pooling: ``mean``, ``cls`` or ``sum`` for one output per set.
        num_layers, num_heads: sizes (None: the backbone does not take them).
        attention, positional: specs for backbones that use attention (None: not given).
        causal: each position attends only to earlier ones. max_len: the longest input.
        max_target_len: seq2seq decoding's longest target.
        options: any further backbone option (``window`` of ``window_mlp``, ``image_size``, ...).
    """

    kind: str
    model: str
    num_labels: int
    embed_dim: int
    inputs: str = "tokens"
    vocab_size: int | None = None
    feature_dim: int | None = None
    edge_dim: int | None = None
    pooling: str = "mean"
    num_layers: int | None = None
    num_heads: int | None = None
    attention: AttentionSpec | None = None
    positional: PositionalSpec | None = None
    causal: bool = False
    max_len: int | None = None
    max_target_len: int | None = None
    options: dict = field(default_factory=dict)

    def backbone_options(self) -> dict:
        """The keyword options of the backbone's constructor."""
        out = dict(self.options)
        for name in ("num_layers", "num_heads", "max_len"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.attention is not None:
            out["attention"] = self.attention.name
            if self.attention.options:
                out["attention_options"] = dict(self.attention.options)
        if self.positional is not None:
            out["positional"] = self.positional.name
            if self.positional.options:
                out["positional_options"] = dict(self.positional.options)
        if self.causal:
            out["causal"] = True
        return out

    def to_dict(self) -> dict:
        """A JSON-ready dict (specs as nested dicts)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ModelConfig:
        """The config of :meth:`to_dict`'s output, or of a version-1 checkpoint's flat dict (either
        with the model width under its earlier name ``dim``)."""
        if not isinstance(data, dict):
            raise ArgumentTypeError(f"a model config is a dict, got {type(data).__name__}")
        data = dict(data)
        if "dim" in data:  # the model width's name until it became embed_dim, in every checkpoint written before
            data.setdefault("embed_dim", data.pop("dim"))
        opts = dict(data.pop("options", None) or {})  # version 1 kept the typed fields among the options
        if "attention" in opts:
            data.setdefault("attention",
                            {"name": opts.pop("attention"), "options": opts.pop("attention_options", None) or {}})
        if "positional" in opts:
            data.setdefault("positional",
                            {"name": opts.pop("positional"), "options": opts.pop("positional_options", None) or {}})
        for name in ("num_layers", "num_heads", "causal", "max_len"):
            if name in opts:
                data.setdefault(name, opts.pop(name))
        data["options"] = opts
        if isinstance(data.get("attention"), dict):
            data["attention"] = AttentionSpec(**data["attention"])
        if isinstance(data.get("positional"), dict):
            data["positional"] = PositionalSpec(**data["positional"])
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ArgumentTypeError(f"unknown model config field(s): {', '.join(unknown)}")
        return cls(**data)
