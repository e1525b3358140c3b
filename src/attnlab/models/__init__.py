"""Models built from attnlab's layers: the encoder, backbones by name (tokens, graphs, images) and heads per output kind."""

from .encoder import Encoder, EncoderConfig, EncoderLayer, EncoderOutput
from .graph import GraphAttention, GraphTransformer, graph_inputs, segment_mean
from .audio import AudioTransformerBackbone, ConformerBackbone, FrameBackbone
from .conformer import Conformer, ConformerLayer, ConvModule
from .vectors import CNNBackbone, PixelAttentionBackbone, VectorClassifier, ViTBackbone, patchify
from .heads import BACKBONES, Backbone, SequenceLabeler, SetClassifier, build_model, names, register

__all__ = [
    "Encoder",
    "EncoderConfig",
    "EncoderLayer",
    "EncoderOutput",
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
    "BACKBONES",
    "Backbone",
    "SequenceLabeler",
    "SetClassifier",
    "build_model",
    "names",
    "register",
]
