"""Models built from attnlab's layers: the encoder, backbones by name (tokens, graphs, images,
audio) and heads per output kind.

The package's floors: :mod:`.base` (the backbone registry, :class:`Backbone`, residual helpers,
special token ids, :class:`ModelOutput`) and :mod:`.config` (:class:`ModelConfig`); then one
module per family; :mod:`.build` on top (:func:`build_model`, the one place that knows them all).
Backbones by name: ``attnlab.models.create(name, ...)``, ``attnlab.models.names()``.
"""

from .audio import AudioTransformerBackbone, ConformerBackbone, FrameBackbone
from .base import BACKBONES, Backbone, ModelOutput, create, names, register
from .build import HEADS, build_model, register_head
from .config import AttentionSpec, ModelConfig, PositionalSpec
from .conformer import Conformer, ConformerLayer, ConvModule
from .encoder import Encoder, EncoderCache, EncoderConfig, EncoderLayer, EncoderOutput
from .graph import GraphAttention, GraphTransformer, graph_inputs, segment_mean
from .heads import PairClassifier, SequenceLabeler, SetClassifier
from .lm import LanguageModel, LMBackbone, pack, sample_next
from .tokens import MLPBackbone, TransformerBackbone, WindowMLPBackbone
from .vectors import CNNBackbone, PixelAttentionBackbone, VectorClassifier, ViTBackbone, patchify

__all__ = [
    "Encoder",
    "EncoderConfig",
    "EncoderLayer",
    "EncoderOutput",
    "EncoderCache",
    "LanguageModel",
    "LMBackbone",
    "sample_next",
    "pack",
    "GraphAttention",
    "GraphTransformer",
    "graph_inputs",
    "segment_mean",
    "ViTBackbone",
    "PixelAttentionBackbone",
    "CNNBackbone",
    "VectorClassifier",
    "patchify",
    "Conformer",
    "ConformerLayer",
    "ConvModule",
    "FrameBackbone",
    "AudioTransformerBackbone",
    "ConformerBackbone",
    "TransformerBackbone",
    "MLPBackbone",
    "WindowMLPBackbone",
    "BACKBONES",
    "Backbone",
    "ModelOutput",
    "ModelConfig",
    "AttentionSpec",
    "PositionalSpec",
    "SequenceLabeler",
    "SetClassifier",
    "PairClassifier",
    "build_model",
    "HEADS",
    "register_head",
    "create",
    "names",
    "register",
]
