"""attnlab's functional core: masks, scores, normalisers, ``attend`` and the float64 reference.

Shape legend, used in every docstring of attnlab:

====  =========================================================
B     batch size
H     number of heads
N     number of queries (the length of the query sequence / set)
M     number of keys and values
D     width of one head's queries and keys (head dim)
Dv    width of one head's values
E     model width (embed_dim) = H x D in the split head form
====  =========================================================

A mask is a function of positions, ``mask(b, h, q_idx, kv_idx) -> bool`` with True = this query
may attend to this key (FlexAttention's ``mask_mod``; :mod:`attnlab.core.masks`), or a bool
tensor broadcastable to ``(B, H, N, M)``; attention computes only the tiles it allows
(:mod:`attnlab.core.blockmap`, :mod:`attnlab.core.sparse`).
"""

from . import masks, normalize, score_mods, scores
from .attend import AttentionResult, attend, backend_for
from .blockmap import BlockMap, block_map
from .graph import EdgeAttentionResult, edge_attention
from .normalize import relu, sigmoid, softmax
from .reference import reference_attention
from .scores import (
    Additive,
    Bilinear,
    Cosine,
    Dot,
    ScaledDot,
    Score,
    cosine,
    dot,
    scaled_dot,
)

__all__ = [
    "masks",
    "attend",
    "backend_for",
    "AttentionResult",
    "BlockMap",
    "block_map",
    "score_mods",
    "edge_attention",
    "EdgeAttentionResult",
    "reference_attention",
    "softmax",
    "relu",
    "sigmoid",
    "normalize",
    "scores",
    "dot",
    "scaled_dot",
    "cosine",
    "Score",
    "Dot",
    "ScaledDot",
    "Cosine",
    "Additive",
    "Bilinear",
]
