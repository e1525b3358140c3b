"""Models for token sequences: a backbone (registered by name) under a head for the output kind.

Backbones map tokens ``(B, N)`` (``PAD`` = 0 is padding) to vectors ``(B, N, E)``:

* ``transformer`` — embedding, then an :class:`attnlab.models.Encoder` with any attention
  variant and positional encoding by name;
* ``mlp`` — embedding, then a per-vector MLP: each word alone (the lecture's "a network per
  vector", capped by words whose tag depends on context);
* ``window_mlp`` — each word with its ``+-k`` neighbours concatenated, then an MLP (the
  lecture's window: local context, capped by its width).

Heads: :class:`SequenceLabeler` (a label per vector) and :class:`SetClassifier` (one label, or
value, per set; mean or CLS pooling). :func:`build_model` makes the pair from a config dict, so a
checkpoint's JSON config rebuilds its model; backbones registered later work unchanged.
"""

from __future__ import annotations

import torch
from torch import nn

from ..registry import Registry
from .encoder import Encoder

__all__ = ["BACKBONES", "register", "names", "Backbone", "SequenceLabeler", "SetClassifier", "build_model", "residual_blocks", "run_residual"]

BACKBONES: Registry = Registry("model")


def register(name: str):
    """Class decorator: register a :class:`Backbone` subclass under ``name``."""
    return BACKBONES.register(name)


def names() -> list[str]:
    """The backbone names (``attnlab train --model``)."""
    return BACKBONES.names()


class Backbone(nn.Module):
    """Base class: ``forward(tokens (B, N), pad (B, N) bool True = padding) -> (B, N, E)``.

    Args:
        vocab_size: token ids are ``0 .. vocab_size - 1`` (0 = padding).
        dim: E.

    Attributes:
        uses_attention: the backbone takes ``attention=``, ``positional=`` and ``max_len=``.
        inputs: what it reads: ``"tokens"`` here; ``"graph"`` for
            :class:`attnlab.models.graph.GraphBackbone`, ``"features"`` for vector sets.
    """

    uses_attention = False
    inputs = "tokens"

    def __init__(self, vocab_size: int, dim: int):
        super().__init__()
        for name, val in (("vocab_size", vocab_size), ("dim", dim)):
            if isinstance(val, bool) or not isinstance(val, int) or val < 1:
                raise ValueError(f"{name} must be a positive int, got {val!r}")
        self.dim = dim
        self.embed = nn.Embedding(vocab_size, dim, padding_idx=0)


@register("transformer")
class TransformerBackbone(Backbone):
    """Embedding and a Transformer encoder; ``attention``, ``positional`` and every other
    :class:`attnlab.models.EncoderConfig` field are options."""

    uses_attention = True

    def __init__(self, vocab_size: int, dim: int, *, num_heads: int = 4, num_layers: int = 2, **encoder_options):
        super().__init__(vocab_size, dim)
        self.encoder = Encoder(dim, num_heads, num_layers, **encoder_options)

    def forward(self, tokens, pad, *, return_weights: bool = False):
        mask = None if not bool(pad.any()) else ~pad[:, None, None, :]
        out = self.encoder(self.embed(tokens) * self.dim**0.5, mask=mask, return_weights=return_weights)
        return (out.output, out.weights) if return_weights else out.output


def residual_blocks(dim: int, num_layers: int, ff: int, dropout: float) -> nn.ModuleList:
    """``num_layers`` pre-norm MLP blocks ``W2 dropout(gelu(W1 LN(x)))``, applied residually by
    :func:`run_residual` (the per-vector baselines ``mlp``, ``window_mlp`` and ``node_mlp``)."""
    return nn.ModuleList(
        nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, ff), nn.GELU(), nn.Dropout(dropout), nn.Linear(ff, dim)) for _ in range(num_layers)
    )


def run_residual(blocks: nn.ModuleList, norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``norm(x + b_1(x) + ...)`` applied block after block: ``x <- x + b(x)``, then ``norm``."""
    for block in blocks:
        x = x + block(x)
    return norm(x)


@register("mlp")
class MLPBackbone(Backbone):
    """Each vector alone: embedding, then ``num_layers`` residual blocks ``x + W2 gelu(W1 LN(x))``."""

    def __init__(self, vocab_size: int, dim: int, *, num_layers: int = 2, ff_dim: int | None = None, dropout: float = 0.0):
        super().__init__(vocab_size, dim)
        self.blocks = residual_blocks(dim, num_layers, ff_dim or 4 * dim, dropout)
        self.norm = nn.LayerNorm(dim)

    def forward(self, tokens, pad, *, return_weights: bool = False):
        h = run_residual(self.blocks, self.norm, self.embed(tokens))
        return (h, None) if return_weights else h


@register("window_mlp")
class WindowMLPBackbone(MLPBackbone):
    """Each vector with its ``+-window`` neighbours (zeros beyond the ends and at padding)
    concatenated, projected back to E, then the residual MLP blocks of ``mlp``."""

    def __init__(self, vocab_size: int, dim: int, *, window: int = 2, **options):
        super().__init__(vocab_size, dim, **options)
        if isinstance(window, bool) or not isinstance(window, int) or window < 0:
            raise ValueError(f"window must be an int >= 0, got {window!r}")
        self.window = window
        self.mix = nn.Linear((2 * window + 1) * dim, dim)

    def forward(self, tokens, pad, *, return_weights: bool = False):
        x = self.embed(tokens).masked_fill(pad[..., None], 0.0)
        k = self.window
        padded = nn.functional.pad(x, (0, 0, k, k))
        ctx = torch.cat([padded[:, i : i + x.shape[1]] for i in range(2 * k + 1)], dim=-1)
        h = run_residual(self.blocks, self.norm, self.mix(ctx))
        return (h, None) if return_weights else h


class SequenceLabeler(nn.Module):
    """A label per vector: ``backbone`` then a linear layer at every position -> ``(B, N, L)``."""

    def __init__(self, backbone: Backbone, num_labels: int):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(backbone.dim, num_labels)

    def forward(self, tokens: torch.Tensor, *, return_weights: bool = False):
        """Logits ``(B, N, num_labels)`` (and the backbone's attention weights when asked)."""
        pad = tokens == 0
        if return_weights:
            h, w = self.backbone(tokens, pad, return_weights=True)
            return self.head(h), w
        return self.head(self.backbone(tokens, pad))


class SetClassifier(nn.Module):
    """One label (or value, ``num_labels=1`` for regression) per set.

    Args:
        backbone: the vectors. num_labels: classes (1: a single value).
        pooling: ``"mean"`` over real positions, or ``"cls"``: a summary token (id 1) is put in
            front of every sequence and its output vector is classified.
    """

    def __init__(self, backbone: Backbone, num_labels: int, *, pooling: str = "mean"):
        super().__init__()
        if pooling not in ("mean", "cls"):
            raise ValueError(f"pooling must be 'mean' or 'cls', got {pooling!r}")
        self.backbone, self.pooling = backbone, pooling
        self.head = nn.Linear(backbone.dim, num_labels)

    def forward(self, tokens: torch.Tensor, *, return_weights: bool = False):
        """Logits ``(B, num_labels)`` (and the backbone's attention weights when asked)."""
        if self.pooling == "cls":
            tokens = torch.cat([torch.ones_like(tokens[:, :1]), tokens], dim=1)
        pad = tokens == 0
        res = self.backbone(tokens, pad, return_weights=return_weights)
        h, w = res if return_weights else (res, None)
        if self.pooling == "cls":
            pooled = h[:, 0]
        else:
            keep = (~pad)[..., None].to(h.dtype)
            pooled = (h * keep).sum(1) / keep.sum(1).clamp_min(1.0)
        logits = self.head(pooled)
        return (logits, w) if return_weights else logits


def build_model(config: dict) -> nn.Module:
    """The model of a config ``{"kind", "model", "vocab_size", "num_labels", "dim", "options", "pooling"}``.

    Graph tasks (``"inputs": "graph"``, with ``feature_dim`` and ``edge_dim``) get a
    :class:`attnlab.models.graph.NodeLabeler` or :class:`attnlab.models.graph.GraphPredictor`;
    vector sets (``"inputs": "features"``) a :class:`attnlab.models.vectors.VectorClassifier`.
    For tokens, ``kind`` is the task's (``tagging`` -> :class:`SequenceLabeler`, ``classification`` ->
    :class:`SetClassifier`, ``seq2seq`` -> :class:`attnlab.models.seq2seq.Seq2Seq`, whose decoder
    takes the backbone's heads and layers); ``options`` go to the backbone.
    """
    cls = BACKBONES.get(config["model"])
    inputs = config.get("inputs", "tokens")
    if getattr(cls, "inputs", "tokens") != inputs:
        fitting = [n for n in BACKBONES.names() if getattr(BACKBONES.get(n), "inputs", "tokens") == inputs]
        raise ValueError(f"model {config['model']!r} reads {cls.inputs}, the task gives {inputs}; choose one of {', '.join(fitting)}")
    if inputs != "tokens":
        from .graph import GraphPredictor, NodeLabeler

        backbone = cls(config["feature_dim"], config["dim"], **({"edge_dim": config.get("edge_dim")} if inputs == "graph" else {}),
                       **(config.get("options") or {}))
        if inputs == "graph":
            if config["kind"] == "tagging":
                return NodeLabeler(backbone, config["num_labels"])
            return GraphPredictor(backbone, config["num_labels"], pooling=config.get("pooling", "mean"))
        from .vectors import VectorClassifier

        return VectorClassifier(backbone, config["num_labels"])
    backbone = cls(config["vocab_size"], config["dim"], **(config.get("options") or {}))
    if config["kind"] == "tagging":
        return SequenceLabeler(backbone, config["num_labels"])
    if config["kind"] == "classification":
        return SetClassifier(backbone, config["num_labels"], pooling=config.get("pooling", "mean"))
    if config["kind"] == "seq2seq":
        from .seq2seq import Seq2Seq

        opts = config.get("options") or {}
        return Seq2Seq(backbone, config["num_labels"], num_heads=opts.get("num_heads", 4), num_layers=opts.get("num_layers", 2),
                       max_len=config.get("max_target_len", 256))
    raise ValueError(f"unknown task kind {config['kind']!r} for token models; expected tagging, classification or seq2seq")
