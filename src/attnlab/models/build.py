"""``build_model``: the one place that knows every backbone family and head, so a
:class:`ModelConfig` (from a checkpoint, the arena or the CLI) rebuilds its model."""

from __future__ import annotations

from torch import nn

from . import audio as _audio  # noqa: F401  (each import registers its backbones)
from . import tokens as _tokens  # noqa: F401
from .base import BACKBONES
from .config import ModelConfig
from .graph import GraphPredictor, NodeLabeler
from .heads import SequenceLabeler, SetClassifier
from .seq2seq import Seq2Seq
from .vectors import VectorClassifier

__all__ = ["build_model"]


def build_model(config: ModelConfig | dict) -> nn.Module:
    """The model of a :class:`ModelConfig` (or its dict, either format of :meth:`ModelConfig.from_dict`).

    Graph tasks (``inputs="graph"``, with ``feature_dim`` and ``edge_dim``) get a
    :class:`attnlab.models.graph.NodeLabeler` or :class:`attnlab.models.graph.GraphPredictor`;
    vector sets and images a :class:`attnlab.models.vectors.VectorClassifier`. For tokens,
    ``kind`` is the task's (``tagging`` -> :class:`SequenceLabeler`, ``classification`` ->
    :class:`SetClassifier`, ``seq2seq`` -> :class:`attnlab.models.seq2seq.Seq2Seq`, whose decoder
    takes the backbone's heads and layers); :meth:`ModelConfig.backbone_options` go to the backbone.
    """
    cfg = config if isinstance(config, ModelConfig) else ModelConfig.from_dict(config)
    cls = BACKBONES.get(cfg.model)
    inputs = cfg.inputs
    if getattr(cls, "inputs", "tokens") != inputs:
        fitting = [n for n in BACKBONES.names() if getattr(BACKBONES.get(n), "inputs", "tokens") == inputs]
        raise ValueError(f"model {cfg.model!r} reads {cls.inputs}, the task gives {inputs}; choose one of {', '.join(fitting)}")
    options = cfg.backbone_options()
    if inputs != "tokens":
        backbone = cls(cfg.feature_dim, cfg.dim, **({"edge_dim": cfg.edge_dim} if inputs == "graph" else {}), **options)
        if inputs == "graph":
            if cfg.kind == "tagging":
                return NodeLabeler(backbone, cfg.num_labels)
            return GraphPredictor(backbone, cfg.num_labels, pooling=cfg.pooling)
        return VectorClassifier(backbone, cfg.num_labels)
    backbone = cls(cfg.vocab_size, cfg.dim, **options)
    if cfg.kind == "tagging":
        return SequenceLabeler(backbone, cfg.num_labels)
    if cfg.kind == "classification":
        return SetClassifier(backbone, cfg.num_labels, pooling=cfg.pooling)
    if cfg.kind == "seq2seq":
        return Seq2Seq(backbone, cfg.num_labels, num_heads=cfg.num_heads or 4, num_layers=cfg.num_layers or 2,
                       max_len=cfg.max_target_len or 256)
    raise ValueError(f"unknown task kind {cfg.kind!r} for token models; expected tagging, classification or seq2seq")
