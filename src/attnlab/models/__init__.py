"""Models built from attnlab's layers (more arrive with the models issue)."""

from .encoder import Encoder, EncoderConfig, EncoderLayer, EncoderOutput

__all__ = ["Encoder", "EncoderConfig", "EncoderLayer", "EncoderOutput"]
