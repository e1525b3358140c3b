"""Models built from attnlab's layers: the encoder, backbones by name and heads per output kind."""

from .encoder import Encoder, EncoderConfig, EncoderLayer, EncoderOutput
from .graph import GraphAttention, GraphTransformer, graph_inputs, segment_mean
from .heads import BACKBONES, Backbone, SequenceLabeler, SetClassifier, build_model, list_models, register_backbone

__all__ = [
    "Encoder",
    "EncoderConfig",
    "EncoderLayer",
    "EncoderOutput",
    "GraphAttention",
    "GraphTransformer",
    "graph_inputs",
    "segment_mean",
    "BACKBONES",
    "Backbone",
    "SequenceLabeler",
    "SetClassifier",
    "build_model",
    "list_models",
    "register_backbone",
]
