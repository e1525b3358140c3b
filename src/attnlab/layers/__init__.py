"""nn.Modules built on :mod:`attnlab.core`: multi-head attention, the feed-forward block, and
attention along a graph's edges (:class:`GraphAttention`), the caches and states of decoding
(:mod:`attnlab.layers.cache`, :mod:`attnlab.layers.state`) and what an attention step declares
it can do (:class:`Capabilities`, :mod:`attnlab.layers.step`)."""

from .cache import ForgetKVCache, KVCache, StaticKV
from .graph import GraphAttention
from .multihead import MultiHeadAttention
from .state import MatrixState, RecurrentState
from .step import Capabilities, StepInputs

__all__ = ["Capabilities", "ForgetKVCache", "GraphAttention", "KVCache", "MatrixState", "MultiHeadAttention", "RecurrentState",
           "StaticKV", "StepInputs"]
