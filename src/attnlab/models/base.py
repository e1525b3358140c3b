"""The bottom of the models package: the backbone registry, the :class:`Backbone` base class,
the residual-MLP helpers of the per-vector baselines, and the special token ids.

The ids live here, in one named place, because two layers need them: the tasks write token
sequences with them and the models read them (a padding embedding, a summary token, decoding
from BOS to EOS). Tasks may import this module and nothing else of :mod:`attnlab.models`.

=============  ====  ==========================================================
name           id    meaning
=============  ====  ==========================================================
``PAD``        0     padding in every vocabulary (source and target)
``CLS``        1     a classifier's summary token (``pooling="cls"``)
``FIRST``      2     a task's own tokens start here
``TGT_PAD``    0     padding of a target sequence
``BOS``        1     starts a decoded target sequence (target vocabularies)
``EOS``        2     ends a target sequence
``TGT_FIRST``  3     a target vocabulary's own tokens start here
``IGNORE``     -100  a label position that is not scored (PyTorch's ``ignore_index``)
=============  ====  ==========================================================
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..registry import Registry
from ..validate import positive_int

__all__ = [
    "BACKBONES", "BOS", "CLS", "EOS", "FIRST", "IGNORE", "PAD", "TGT_FIRST", "TGT_PAD", "Backbone", "ModelOutput",
    "create", "names", "register", "residual_blocks", "run_residual",
]

PAD, CLS, FIRST = 0, 1, 2
TGT_PAD, BOS, EOS = PAD, 1, 2
TGT_FIRST = EOS + 1
IGNORE = -100

BACKBONES: Registry = Registry("model")
"""Every backbone by name (``attnlab train --model``)."""


def register(name: str):
    """Class decorator: register a :class:`Backbone` subclass under ``name``."""
    return BACKBONES.register(name)


def names() -> list[str]:
    """The backbone names (``attnlab train --model``)."""
    return BACKBONES.names()


def create(name: str, *args, **options) -> nn.Module:
    """The backbone ``name`` built with ``args`` and ``options`` (see its class)."""
    return BACKBONES.create(name, *args, **options)


@dataclass
class ModelOutput:
    """What every model returns, whatever the flags: ``output`` (logits or vectors) and
    ``weights`` (the attention weights when asked for, else None) — as :func:`attnlab.attend`
    returns an :class:`attnlab.AttentionResult`."""

    output: torch.Tensor
    weights: object = None


class Backbone(nn.Module):
    """Base class: ``forward(tokens (B, N), pad (B, N) bool True = padding) -> (B, N, E)``.

    Args:
        vocab_size: token ids are ``0 .. vocab_size - 1`` (0 = padding).
        embed_dim: E.

    Attributes:
        uses_attention: the backbone takes ``attention=``, ``positional=`` and ``max_len=``.
        inputs: what it reads: ``"tokens"`` here; ``"graph"`` for
            :class:`attnlab.models.graph.GraphBackbone`, ``"features"`` for vector sets.
    """

    uses_attention = False
    inputs = "tokens"

    def __init__(self, vocab_size: int, embed_dim: int):
        super().__init__()
        positive_int("vocab_size", vocab_size)
        self.embed_dim = positive_int("embed_dim", embed_dim)
        self.embed = nn.Embedding(vocab_size, embed_dim, padding_idx=PAD)


def residual_blocks(embed_dim: int, num_layers: int, ff: int, dropout: float) -> nn.ModuleList:
    """``num_layers`` pre-norm MLP blocks ``W2 dropout(gelu(W1 LN(x)))``, applied residually by
    :func:`run_residual` (the per-vector baselines ``mlp``, ``window_mlp`` and ``node_mlp``)."""
    return nn.ModuleList(
        nn.Sequential(nn.LayerNorm(embed_dim), nn.Linear(embed_dim, ff), nn.GELU(), nn.Dropout(dropout),
                      nn.Linear(ff, embed_dim))
        for _ in range(num_layers)
    )


def run_residual(blocks: nn.ModuleList, norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``norm(x + b_1(x) + ...)`` applied block after block: ``x <- x + b(x)``, then ``norm``."""
    for block in blocks:
        x = x + block(x)
    return norm(x)
