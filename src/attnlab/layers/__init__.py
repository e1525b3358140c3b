"""nn.Modules built on :mod:`attnlab.core`: multi-head attention, the attention step it holds
(:class:`AttentionStep`, called with a :class:`StepCall`; exact attention is :class:`DenseStep`),
the sequence mixer (:class:`SequenceMixer`: a layer ``x -> y`` owning its projections, the second
kind of variant) and what a variant declares it can do (:class:`Capabilities`, :mod:`attnlab.layers.step`), the
feed-forward block, attention along a graph's edges (:class:`GraphAttention`), and the caches
and states of decoding (:mod:`attnlab.layers.cache`, :mod:`attnlab.layers.state`)."""

from .cache import ForgetKVCache, KVCache, StaticKV
from .exact import DenseStep
from .graph import GraphAttention
from .mixer import SequenceMixer, Tokens
from .multihead import MultiHeadAttention
from .state import MatrixState, RecurrentState
from .step import AttentionStep, Capabilities, StepCall

__all__ = ["AttentionStep", "Capabilities", "DenseStep", "ForgetKVCache", "GraphAttention", "KVCache", "MatrixState",
           "MultiHeadAttention", "RecurrentState", "SequenceMixer", "StaticKV", "StepCall", "Tokens"]
