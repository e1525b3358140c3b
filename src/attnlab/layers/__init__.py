"""nn.Modules built on :mod:`attnlab.core`: multi-head attention, the feed-forward block, and
attention along a graph's edges (:class:`GraphAttention`)."""

from .graph import GraphAttention
from .multihead import MultiHeadAttention

__all__ = ["GraphAttention", "MultiHeadAttention"]
