"""Scores ``s_ij = score(q_i, k_j)`` by name: the public face of :mod:`attnlab.core.scores`.

``create(name, head_dim=..., num_heads=..., **options)`` builds one; ``names()`` lists them;
:data:`SCORES` is the registry.
"""

from .core.scores import (
    SCORES,
    Additive,
    Bilinear,
    Cosine,
    Dot,
    ScaledDot,
    Score,
    cosine,
    create,
    dot,
    names,
    scaled_dot,
)

__all__ = ["SCORES", "Score", "Dot", "ScaledDot", "Cosine", "Additive", "Bilinear", "dot", "scaled_dot", "cosine",
           "create", "names"]
