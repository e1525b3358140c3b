"""``build_model``: the one place that knows every backbone family, so a :class:`ModelConfig`
(from a checkpoint, the arena or the CLI) rebuilds its model; and the head registry, which
puts the head of each (input form, task kind) on the backbone.

A new kind of output registers its head here from its own module (for example
``objectives/<kind>.py``)::

    @register_head("tokens", "pair")
    def _pair_head(backbone, cfg): return PairClassifier(backbone, cfg.num_labels)
"""

from __future__ import annotations

from torch import nn

from ..registry import Registry
from . import audio as _audio  # noqa: F401  (each import registers its backbones)
from . import tokens as _tokens  # noqa: F401
from .base import BACKBONES
from .config import ModelConfig
from .graph import GraphPredictor, NodeLabeler
from .heads import PairClassifier, SequenceLabeler, SetClassifier
from .lm import LanguageModel
from .seq2seq import Seq2Seq
from .vectors import VectorClassifier

__all__ = ["HEADS", "build_model", "register_head"]

HEADS: Registry = Registry("head")
"""``(backbone, ModelConfig) -> model`` by ``"<inputs>:<kind>"`` (``"<inputs>:*"``: any kind)."""


def register_head(inputs: str, kind: str):
    """Decorator: ``fn(backbone, cfg) -> nn.Module`` builds the model of task kind ``kind``
    (``"*"``: any kind without its own) over a backbone that reads ``inputs``."""
    return HEADS.register(f"{inputs}:{kind}")


register_head("tokens", "tagging")(lambda backbone, cfg: SequenceLabeler(backbone, cfg.num_labels))
register_head("tokens", "classification")(lambda backbone, cfg: SetClassifier(backbone, cfg.num_labels,
                                                                              pooling=cfg.pooling))
register_head("tokens", "pair")(lambda backbone, cfg: PairClassifier(backbone, cfg.num_labels, pooling=cfg.pooling))
register_head("tokens", "seq2seq")(
    lambda backbone, cfg: Seq2Seq(backbone, cfg.num_labels, num_heads=cfg.num_heads or 4,
                                  num_layers=cfg.num_layers or 2, max_len=cfg.max_target_len or 256)
)
register_head("tokens", "lm")(lambda backbone, cfg: LanguageModel(backbone))
register_head("graph", "tagging")(lambda backbone, cfg: NodeLabeler(backbone, cfg.num_labels))
register_head("graph", "*")(lambda backbone, cfg: GraphPredictor(backbone, cfg.num_labels, pooling=cfg.pooling))
register_head("features", "*")(lambda backbone, cfg: VectorClassifier(backbone, cfg.num_labels))
register_head("image", "*")(lambda backbone, cfg: VectorClassifier(backbone, cfg.num_labels))


def build_model(config: ModelConfig | dict) -> nn.Module:
    """The model of a :class:`ModelConfig` (or its dict, either format of :meth:`ModelConfig.from_dict`).

    The backbone ``config.model`` is built with :meth:`ModelConfig.backbone_options`; the head
    comes from :data:`HEADS` by input form and task kind: tokens ``tagging`` ->
    :class:`SequenceLabeler`, ``classification`` -> :class:`SetClassifier`, ``seq2seq`` ->
    :class:`attnlab.models.seq2seq.Seq2Seq` (its decoder takes the backbone's heads and layers), ``lm`` ->
    :class:`attnlab.models.lm.LanguageModel` (over a causal backbone: ``lm``, or ``mlp``);
    graphs: node ``tagging`` -> :class:`attnlab.models.graph.NodeLabeler`, otherwise
    :class:`attnlab.models.graph.GraphPredictor`; vector sets and images a
    :class:`attnlab.models.vectors.VectorClassifier`.
    """
    cfg = config if isinstance(config, ModelConfig) else ModelConfig.from_dict(config)
    cls = BACKBONES.get(cfg.model)
    inputs = cfg.inputs
    if getattr(cls, "inputs", "tokens") != inputs:
        fitting = [n for n in BACKBONES.names() if getattr(BACKBONES.get(n), "inputs", "tokens") == inputs]
        raise ValueError(f"model {cfg.model!r} reads {cls.inputs}, the task gives {inputs}; choose one of "
                         f"{', '.join(fitting)}")
    key = next((k for k in (f"{inputs}:{cfg.kind}", f"{inputs}:*") if k in HEADS), None)
    if key is None:
        kinds = sorted(k.partition(":")[2] for k in HEADS.names() if k.startswith(f"{inputs}:"))
        raise ValueError(f"unknown task kind {cfg.kind!r} for {inputs} models; expected {', '.join(kinds)}")
    options = cfg.backbone_options()
    if inputs == "tokens":
        backbone = cls(cfg.vocab_size, cfg.embed_dim, **options)
    else:
        backbone = cls(cfg.feature_dim, cfg.embed_dim, **({"edge_dim": cfg.edge_dim} if inputs == "graph" else {}),
                       **options)
    return HEADS.get(key)(backbone, cfg)
