"""nn.Modules built on :mod:`attnlab.core`."""

from .multihead import MultiHeadAttention

__all__ = ["MultiHeadAttention"]
