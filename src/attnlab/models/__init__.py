"""Models built from attnlab's layers: the encoder, backbones by name and heads per output kind."""

from .encoder import Encoder, EncoderConfig, EncoderLayer, EncoderOutput
from .heads import BACKBONES, Backbone, SequenceLabeler, SetClassifier, build_model, list_models, register_backbone

__all__ = [
    "Encoder",
    "EncoderConfig",
    "EncoderLayer",
    "EncoderOutput",
    "BACKBONES",
    "Backbone",
    "SequenceLabeler",
    "SetClassifier",
    "build_model",
    "list_models",
    "register_backbone",
]
