"""Encoder-decoder (a new sequence of the model's chosen length): causal self-attention and
cross-attention in the decoder, greedy and beam decoding until an end token.

Target ids: :data:`TGT_PAD` = 0, :data:`BOS` = 1 (starts decoding), :data:`EOS` = 2 (the model
chooses the length by emitting it), words from 3.
"""

from __future__ import annotations

import torch
from torch import nn

from ..core import masks
from ..layers.feedforward import FeedForward
from ..layers.multihead import MultiHeadAttention
from ..validate import positive_int
from .base import BOS, EOS, TGT_PAD, Backbone, ModelOutput

__all__ = ["Seq2Seq", "DecoderLayer", "TGT_PAD", "BOS", "EOS"]



class DecoderLayer(nn.Module):
    """Pre-norm block: ``x + SelfAttn_causal(LN x)``, ``x + CrossAttn(LN x, memory)``, ``x + FFN(LN x)``."""

    def __init__(self, embed_dim: int, num_heads: int, ff_dim: int | None = None, dropout: float = 0.0):
        super().__init__()
        self.self_attn = MultiHeadAttention(embed_dim, num_heads, dropout=dropout)
        self.cross_attn = MultiHeadAttention(embed_dim, num_heads, dropout=dropout)
        self.ff = FeedForward(embed_dim, ff_dim or 4 * embed_dim, dropout=dropout)
        self.norms = nn.ModuleList(nn.LayerNorm(embed_dim) for _ in range(3))

    def forward(self, x, memory, *, self_mask, memory_mask, return_weights=False, caches=None):
        """With ``caches`` = ``(self-attention KVCache, cross-attention StaticKV)``, ``x`` holds new
        target tokens and ``self_mask`` their padding ``(B, 1, 1, n)``."""
        self_cache, cross_cache = caches if caches is not None else (None, None)
        x = x + self.self_attn(self.norms[0](x), mask=self_mask, cache=self_cache).output
        res = self.cross_attn(self.norms[1](x), memory, mask=memory_mask, return_weights=return_weights,
                              cache=cross_cache)
        x = x + res.output
        x = x + self.ff(self.norms[2](x))
        return x, res.weights


class Seq2Seq(nn.Module):
    """``encoder`` (any :class:`attnlab.models.base.Backbone`) over the source, a decoder of
    ``num_layers`` :class:`DecoderLayer` blocks over the target, sinusoidal target positions.

    Args:
        encoder: the source backbone. tgt_vocab_size: target ids (with PAD, BOS, EOS).
        num_heads, num_layers: the decoder's. max_len: the longest target (decoding stops there).
    """

    def __init__(self, encoder: Backbone, tgt_vocab_size: int, *, num_heads: int = 4, num_layers: int = 2,
                 max_len: int = 256):
        super().__init__()
        from ..positional import sinusoidal_table

        embed_dim = encoder.embed_dim
        self.encoder, self.embed_dim, self.max_len = encoder, embed_dim, max_len
        self.tgt_embed = nn.Embedding(tgt_vocab_size, embed_dim, padding_idx=TGT_PAD)
        self.register_buffer("tgt_pos", sinusoidal_table(max_len + 1, embed_dim), persistent=False)
        self.layers = nn.ModuleList(DecoderLayer(embed_dim, num_heads) for _ in range(num_layers))
        self.norm = nn.LayerNorm(embed_dim)
        self.out = nn.Linear(embed_dim, tgt_vocab_size)

    def encode(self, src: torch.Tensor):
        """``(memory (B, N, E), memory mask (B, 1, 1, N))`` of source ids ``(B, N)``."""
        pad = src == 0
        return self.encoder(src, pad).output, ~pad[:, None, None, :]

    def decode(self, tgt_in: torch.Tensor, memory, memory_mask, *, return_weights: bool = False,
               cache: list | None = None):
        """Logits ``(B, M, V)`` of the next target token after each of ``tgt_in`` ``(B, M)``
        (and the last block's cross-attention ``(B, H, M, N)`` when asked). With ``cache``
        (:meth:`new_cache`), ``tgt_in`` continues the tokens decoded so far."""
        start = 0 if cache is None else cache[0][0].seen
        m = tgt_in.shape[1]
        if start + m > self.max_len + 1:
            raise ValueError(f"target of length {start + m} exceeds the decoder's max_len {self.max_len}")
        x = self.tgt_embed(tgt_in) * self.embed_dim**0.5 + self.tgt_pos[start : start + m].to(memory.dtype)
        real = (tgt_in != TGT_PAD)[:, None, None, :]
        self_mask = real if cache is not None else masks.causal() & real
        weights = None
        for i, layer in enumerate(self.layers):
            x, w = layer(x, memory, self_mask=self_mask, memory_mask=memory_mask,
                         return_weights=return_weights and i == len(self.layers) - 1,
                         caches=None if cache is None else cache[i])
            weights = w if w is not None else weights
        return ModelOutput(self.out(self.norm(x)), weights)

    def new_cache(self) -> list:
        """An empty decoding cache: per block, its self-attention's keys and values and its
        cross-attention's keys of the source (computed on the first step)."""
        return [(layer.self_attn.new_cache(), layer.cross_attn.new_cross_cache()) for layer in self.layers]

    @staticmethod
    def reorder_cache(cache: list, index: torch.Tensor) -> None:
        """Keep the batch rows ``index`` of every cache (beam search)."""
        for self_cache, cross_cache in cache:
            self_cache.reorder(index)
            cross_cache.reorder(index)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor, *, return_weights: bool = False):
        """Teacher-forced logits ``(B, M, V)``; ``tgt_in`` starts with BOS."""
        memory, mmask = self.encode(src)
        return self.decode(tgt_in, memory, mmask, return_weights=return_weights)

    @torch.no_grad()
    def greedy(self, src: torch.Tensor, max_len: int | None = None, *, cache: bool = True) -> list[list[int]]:
        """The most likely token at each step until EOS (or ``max_len``), per source; EOS not
        included. ``cache=False`` reruns the whole target prefix at each step (the reference)."""
        limit = min(max_len or self.max_len, self.max_len)
        memory, mmask = self.encode(src)
        seq = torch.full((src.shape[0], 1), BOS, dtype=torch.long, device=src.device)
        done = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
        state = self.new_cache() if cache else None
        for _ in range(limit):
            step_in = seq[:, -1:] if cache else seq
            nxt = self.decode(step_in, memory, mmask, cache=state).output[:, -1].argmax(-1)
            nxt = torch.where(done, torch.full_like(nxt, TGT_PAD), nxt)
            seq = torch.cat([seq, nxt[:, None]], 1)
            done |= nxt == EOS
            if bool(done.all()):
                break
        return [_strip(row) for row in seq[:, 1:].tolist()]

    @torch.no_grad()
    def beam(self, src: torch.Tensor, beam_size: int = 4, max_len: int | None = None, *,
             cache: bool = True) -> list[list[int]]:
        """Beam search per source (sum of log-probabilities, finished hypotheses kept); EOS not
        included. With ``cache`` each beam's cache rows follow it (``cache=False``: the reference
        that reruns every prefix)."""
        positive_int("beam_size", beam_size)
        limit = min(max_len or self.max_len, self.max_len)
        results = []
        for b in range(src.shape[0]):
            memory, mmask = self.encode(src[b : b + 1])
            beams = [([BOS], 0.0, 0)]  # (tokens, score, the row of its parent in the last step's batch)
            finished: list[tuple[list[int], float]] = []
            state = self.new_cache() if cache else None
            for _ in range(limit):
                if cache:
                    self.reorder_cache(state, torch.tensor([p for _, _, p in beams], device=src.device))
                    seqs = torch.tensor([s[-1:] for s, _, _ in beams], device=src.device)
                else:
                    seqs = torch.tensor([s for s, _, _ in beams], device=src.device)
                logp = self.decode(seqs, memory.expand(len(beams), -1, -1), mmask.expand(len(beams), -1, -1, -1),
                                   cache=state).output[:, -1].log_softmax(-1)
                cand = []
                for i, (s, score, _) in enumerate(beams):
                    top = logp[i].topk(beam_size)
                    cand += [(s + [int(t)], score + float(v), i) for v, t in zip(top.values, top.indices)]
                cand.sort(key=lambda c: c[1], reverse=True)
                beams = []
                for s, score, parent in cand:
                    if s[-1] == EOS:
                        finished.append((s, score))
                    else:
                        beams.append((s, score, parent))
                    if len(beams) == beam_size:
                        break
                if not beams or (finished and max(f[1] for f in finished) >= beams[0][1]):
                    break
            best = max(finished or [(s, score) for s, score, _ in beams], key=lambda c: c[1])[0]
            results.append(_strip(best[1:]))
        return results


def _strip(row: list[int]) -> list[int]:
    out = []
    for t in row:
        if t in (EOS, TGT_PAD):
            break
        out.append(t)
    return out
