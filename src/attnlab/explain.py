"""Self-attention on a sentence, step by step, for learners (``attnlab explain``).

Each token becomes a small seeded embedding ``a^i`` (the same word always gets the same
vector, so without positional information both "saw"s of "I saw a saw" end with the same
output — the reason self-attention needs positions). Then the lecture's steps, computed by
:mod:`attnlab.core.reference` in float64:

    Q = W^q I,  K = W^k I,  V = W^v I           (one column per token in the notes; rows here)
    A = score(Q, K)                              (A[i, j] = alpha_{i,j}; masked pairs removed)
    A' = normalise(A) row by row
    O = A' V                                     (with several heads: concat(O^h) W^o)
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch

from .core import masks as masks_mod
from .core import normalize as normalizer_registry
from .core import scores as score_registry
from .core.reference import F64, normalize_row, project, score_row
from .validate import is_int, positive_int

__all__ = ["Explanation", "explain"]


@dataclass
class Explanation:
    """Every intermediate of one self-attention pass; per-head lists have one entry per head.

    Attributes:
        tokens: the N tokens.
        inputs: ``(N, d)`` embeddings ``I``.
        q, k, v: per head ``(N, d / num_heads)``.
        scores: per head ``(N, N)``; None where the mask forbids the pair.
        weights: per head ``(N, N)`` normalised weights ``A'``.
        head_outputs: per head ``(N, d / num_heads)``, ``A' V``.
        output: ``(N, d)``; equal to ``head_outputs[0]`` with one head, else ``concat W^o``.
    """

    tokens: list[str]
    score: str
    normalize: str
    num_heads: int
    inputs: list
    q: list
    k: list
    v: list
    scores: list
    weights: list
    head_outputs: list
    output: list

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _embedding(token: str, embed_dim: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(zlib.crc32(token.encode()) + seed)
    return torch.randn(embed_dim, generator=g, dtype=F64)


def explain(
    sentence: str,
    *,
    score: str = "scaled_dot",
    normalize: str = "softmax",
    no_self: bool = False,
    num_heads: int = 1,
    embed_dim: int = 4,
    seed: int = 0,
) -> Explanation:
    """Run self-attention on ``sentence`` (split on whitespace) and return every step.

    Args:
        score: a name from :func:`attnlab.scores.names`; learnable scores get seeded weights.
        normalize: a name from :func:`attnlab.normalizers.names`.
        no_self: forbid each token to attend to itself (:func:`attnlab.masks.no_self`).
        num_heads: number of heads; must divide ``embed_dim``.
        embed_dim: embedding width d.
        seed: seed of the projection matrices (and of the embeddings, with the token).
    """
    tokens = sentence.split()
    if not tokens:
        raise ValueError("the sentence has no tokens; give some words, e.g. \"I saw a saw\"")
    if score not in score_registry.names():
        raise ValueError(f"unknown score {score!r}; expected one of {score_registry.names()}")
    if normalize not in normalizer_registry.names():
        raise ValueError(f"unknown normaliser {normalize!r}; expected one of {normalizer_registry.names()}")
    positive_int("embed_dim", embed_dim)
    if not is_int(num_heads) or num_heads < 1 or embed_dim % num_heads:
        raise ValueError(f"num_heads must be a positive divisor of embed_dim={embed_dim}, got {num_heads!r}")
    n, dh = len(tokens), embed_dim // num_heads
    a = torch.stack([_embedding(t, embed_dim, seed) for t in tokens])  # I: (N, d)
    g = torch.Generator().manual_seed(seed)
    w_q, w_k, w_v, w_o = (torch.randn(embed_dim, embed_dim, generator=g, dtype=F64) / embed_dim**0.5 for _ in range(4))
    torch.manual_seed(seed)
    score_fn = score_registry.create(score, head_dim=dh, num_heads=num_heads).to(F64)
    allowed = (masks_mod.no_self() if no_self else masks_mod.full()).dense(n)

    q_all, k_all, v_all = project(a, w_q), project(a, w_k), project(a, w_v)  # (N, d) each
    out = {"q": [], "k": [], "v": [], "scores": [], "weights": [], "head_outputs": []}
    for h in range(num_heads):
        cols = slice(h * dh, (h + 1) * dh)
        q, k, v = q_all[:, cols], k_all[:, cols], v_all[:, cols]
        with torch.no_grad():
            rows = [score_row(score_fn, q[i], k, head=h) for i in range(n)]
            weights = torch.stack([normalize_row(normalize, rows[i], allowed[i]) for i in range(n)])
        scores = [[float(rows[i][j]) if allowed[i, j] else None for j in range(n)] for i in range(n)]
        out["q"].append(q.tolist())
        out["k"].append(k.tolist())
        out["v"].append(v.tolist())
        out["scores"].append(scores)
        out["weights"].append(weights.tolist())
        out["head_outputs"].append((weights @ v).tolist())
    concat = torch.tensor([sum((out["head_outputs"][h][i] for h in range(num_heads)), []) for i in range(n)], dtype=F64)
    output = concat if num_heads == 1 else concat @ w_o.T
    return Explanation(
        tokens=tokens,
        score=score,
        normalize=normalize,
        num_heads=num_heads,
        inputs=a.tolist(),
        output=output.tolist(),
        **out,
    )
