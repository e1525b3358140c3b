"""nn.Modules built on :mod:`attnlab.core`: multi-head attention, the feed-forward block, and
attention along a graph's edges (:class:`GraphAttention`), and the caches of decoding
(:mod:`attnlab.layers.cache`)."""

from .cache import KVCache, RecurrentState, StaticKV
from .graph import GraphAttention
from .multihead import MultiHeadAttention

__all__ = ["GraphAttention", "KVCache", "MultiHeadAttention", "RecurrentState", "StaticKV"]
