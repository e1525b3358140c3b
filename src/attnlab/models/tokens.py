"""Backbones over token sequences (``inputs = "tokens"``): tokens ``(B, N)`` (``PAD`` = 0 is
padding) -> vectors ``(B, N, E)``.

* ``transformer`` — embedding, then an :class:`attnlab.models.Encoder` with any attention
  variant and positional encoding by name;
* ``mlp`` — embedding, then a per-vector MLP: each word alone (the lecture's "a network per
  vector", capped by words whose tag depends on context);
* ``window_mlp`` — each word with its ``+-k`` neighbours concatenated, then an MLP (the
  lecture's window: local context, capped by its width).
"""

from __future__ import annotations

import torch
from torch import nn

from ..distributed.context import RingContext
from ..distributed.sequence import SequenceParallel, ShardedMask, gather, shard
from ..validate import int_at_least
from .base import Backbone, ModelOutput, register, residual_blocks, run_residual
from .encoder import Encoder

__all__ = ["MLPBackbone", "TransformerBackbone", "WindowMLPBackbone"]


@register("transformer")
class TransformerBackbone(Backbone):
    """Embedding and a Transformer encoder; ``attention``, ``positional`` and every other
    :class:`attnlab.models.EncoderConfig` field are options."""

    uses_attention = True
    options_target = Encoder  # its **encoder_options (for the list of valid options in errors)

    sequence_parallel: SequenceParallel | None = None
    """When set (:func:`attnlab.distributed.parallelize`), each rank computes its shard of every
    sequence (ring attention in every block) and the final vectors are gathered."""

    def __init__(self, vocab_size: int, embed_dim: int, *, num_heads: int = 4, num_layers: int = 2, **encoder_options):
        super().__init__(vocab_size, embed_dim)
        self.encoder = Encoder(embed_dim, num_heads, num_layers, **encoder_options)

    @property
    def causal(self) -> bool:
        """True when a vector's output depends on the vectors at or before it only."""
        return self.encoder.config.causal

    def forward(self, tokens, pad, *, return_weights: bool = False, cache=None, documents=None):
        """With ``cache`` (:meth:`attnlab.models.Encoder.new_cache`), ``tokens`` continue the cached
        ones; with ``documents`` (:class:`attnlab.masks.Documents`) each row holds packed documents."""
        if documents is not None:
            out = self.encoder(self.embed(tokens) * self.embed_dim**0.5, mask=documents)
            return ModelOutput(out.output, None)
        if self.sequence_parallel is not None:
            if return_weights or cache is not None:
                raise ValueError("under sequence parallelism the backbone returns no weights and takes no cache")
            return self._forward_sharded(tokens, pad, self.sequence_parallel)
        mask = None if not bool(pad.any()) else ~pad[:, None, None, :]
        out = self.encoder(self.embed(tokens) * self.embed_dim**0.5, mask=mask, return_weights=return_weights,
                           cache=cache)
        return ModelOutput(out.output, out.weights)


    def _forward_sharded(self, tokens, pad, sp: SequenceParallel) -> ModelOutput:
        """This rank's positions of every sequence through the encoder, then all gathered."""
        layout, rank = sp.layout_for(tokens.shape[1], self.causal)
        mine = shard(tokens, layout, rank)  # (B, c): padded positions hold PAD = 0
        valid = ~shard(pad, layout, rank, fill=True)  # (B, c): True = a real key
        ctx = RingContext.build(layout.positions(rank, device=tokens.device), None if bool(valid.all()) else valid,
                                group=sp.group)
        out = self.encoder(self.embed(mine) * self.embed_dim**0.5, mask=ShardedMask(ctx, timings=sp.timings,
                                                                                    length=layout.length))
        return ModelOutput(gather(out.output, layout, group=sp.group), None)


@register("mlp")
class MLPBackbone(Backbone):
    """Each vector alone: embedding, then ``num_layers`` residual blocks ``x + W2 gelu(W1 LN(x))``."""

    causal = True  # a vector's output depends on that vector only

    def __init__(self, vocab_size: int, embed_dim: int, *, num_layers: int = 2, ff_dim: int | None = None,
                 dropout: float = 0.0):
        super().__init__(vocab_size, embed_dim)
        self.blocks = residual_blocks(embed_dim, num_layers, ff_dim or 4 * embed_dim, dropout)
        self.norm = nn.LayerNorm(embed_dim)

    def forward(self, tokens, pad, *, return_weights: bool = False):
        return ModelOutput(run_residual(self.blocks, self.norm, self.embed(tokens)))


@register("window_mlp")
class WindowMLPBackbone(MLPBackbone):
    """Each vector with its ``+-window`` neighbours (zeros beyond the ends and at padding)
    concatenated, projected back to E, then the residual MLP blocks of ``mlp``."""

    causal = False  # it reads the next ``window`` vectors too

    def __init__(self, vocab_size: int, embed_dim: int, *, window: int = 2, **options):
        super().__init__(vocab_size, embed_dim, **options)
        self.window = int_at_least("window", window, 0)
        self.mix = nn.Linear((2 * window + 1) * embed_dim, embed_dim)

    def forward(self, tokens, pad, *, return_weights: bool = False):
        x = self.embed(tokens).masked_fill(pad[..., None], 0.0)
        k = self.window
        padded = nn.functional.pad(x, (0, 0, k, k))
        ctx = torch.cat([padded[:, i : i + x.shape[1]] for i in range(2 * k + 1)], dim=-1)
        return ModelOutput(run_residual(self.blocks, self.norm, self.mix(ctx)))
