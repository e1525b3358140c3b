"""A decoder-only causal language model: the ``lm`` backbone (a causal Transformer with any
attention variant and positional encoding) under :class:`LanguageModel`, which predicts each
next token and generates text with a key / value cache.

Decoding with the cache (:meth:`LanguageModel.new_cache`) gives the logits that running the
whole prefix gives (tested to 1e-10 in float64 for every encoding and every variant that decodes
causally), at a cost per token that does not grow with the prefix for bounded caches (the
``local`` and ``longformer`` variants, StreamingLLM's sinks + window) and grows linearly, not
quadratically, for the full cache.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch import nn

from ..core.masks import Documents
from ..validate import int_at_least, number_above, positive_int, probability
from .base import PAD, Backbone, ModelOutput, register
from .encoder import EncoderCache
from .tokens import TransformerBackbone

__all__ = ["LMBackbone", "LanguageModel", "pack", "sample_next", "tied_logits"]


def tied_logits(h: torch.Tensor, embed: nn.Embedding, bias: torch.Tensor) -> torch.Tensor:
    """``(..., E)`` states -> ``(..., V)`` token logits through the input embedding (tied weights,
    as GPT-2 and BERT), scaled by ``1 / sqrt(E)`` as the input side scales it by ``sqrt(E)``, so
    that the first logits have unit variance; plus a bias per token."""
    w = embed.weight
    return (h @ w.T) * w.shape[1] ** -0.5 + bias


@register("lm")
class LMBackbone(TransformerBackbone):
    """The ``transformer`` backbone made causal: token ``i`` sees tokens ``0..i`` only (a causal
    mask for exact attention, ``causal=True`` for the efficient variants). Options as for
    :class:`attnlab.models.tokens.TransformerBackbone`."""

    def __init__(self, vocab_size: int, embed_dim: int, **options):
        options["causal"] = True
        super().__init__(vocab_size, embed_dim, **options)


class LanguageModel(nn.Module):
    """Next-token prediction over a causal backbone: ``logits[:, i]`` scores the token after
    ``tokens[:, :i + 1]``. The output layer is the input embedding (tied weights, as GPT-2),
    scaled by ``1 / sqrt(E)`` as the input side scales it by ``sqrt(E)``, so that the first
    logits have unit variance.

    Args:
        backbone: a backbone whose output at ``i`` depends on tokens ``<= i`` only: ``lm``, or
            ``mlp`` (each token alone: a bigram model, the no-attention baseline).
    """

    def __init__(self, backbone: Backbone):
        super().__init__()
        if not getattr(backbone, "causal", False):
            raise ValueError(f"a language model needs a causal backbone ('lm' or 'mlp'); {type(backbone).__name__} "
                             "sees later tokens")
        self.backbone = backbone
        self.bias = nn.Parameter(torch.zeros(backbone.embed.num_embeddings))

    @property
    def vocab_size(self) -> int:
        """Token ids ``0 .. vocab_size - 1``."""
        return self.backbone.embed.num_embeddings

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """``(B, N, E)`` states -> ``(B, N, V)`` logits through the tied embedding (:func:`tied_logits`)."""
        return tied_logits(h, self.backbone.embed, self.bias)

    def forward(self, tokens: torch.Tensor, *, return_weights: bool = False, cache: EncoderCache | None = None,
                last: bool = False, documents: Documents | None = None) -> ModelOutput:
        """Logits ``(B, N, V)`` of the next token after each of ``tokens`` ``(B, N)`` (``PAD`` = 0
        is padding); ``last``: of the last position only, ``(B, 1, V)``. With ``cache``,
        ``tokens`` continue the cached ones; with ``documents`` (:func:`pack`), each row holds
        packed documents that never see each other."""
        pad = tokens == PAD
        if documents is not None:
            if not getattr(self.backbone, "uses_attention", False):
                out = self.backbone(tokens, pad)  # each token alone: packing changes nothing
            else:
                out = self.backbone(tokens, pad, documents=documents)
        elif cache is not None:
            out = self.backbone(tokens, pad, cache=cache)
        else:
            out = self.backbone(tokens, pad, return_weights=return_weights)
        h = out.output[:, -1:] if last else out.output
        return ModelOutput(self.logits(h), out.weights)

    def new_cache(self, *, window: int | None = None, sinks: int = 0, positions: str = "absolute") -> EncoderCache:
        """An empty cache (see :meth:`attnlab.models.Encoder.new_cache`)."""
        encoder = getattr(self.backbone, "encoder", None)
        if encoder is None:
            raise ValueError(f"the {type(self.backbone).__name__} backbone has no attention to cache")
        return encoder.new_cache(window=window, sinks=sinks, positions=positions)

    def generate(
        self,
        prompt: torch.Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        generator: torch.Generator | None = None,
        cache: bool = True,
        window: int | None = None,
        sinks: int = 0,
        stop: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> Iterator[torch.Tensor]:
        """Yield ``(B,)`` next tokens, one step at a time, after ``prompt`` ``(B, P)``.

        Args:
            prompt: token ids, every row the same length (``P >= 1``).
            max_new_tokens: the steps.
            temperature: divides the logits; 0 = greedy (the most likely token).
            top_k: sample among the k most likely tokens only. top_p: among the smallest set
                whose probability reaches p (nucleus sampling).
            generator: the random generator of the sampling (seeded for reproducible text).
            cache: decode with a key / value cache (False: rerun the whole prefix each step,
                the slow reference). window, sinks: a StreamingLLM cache (positions in the cache).
            stop: ``(B,) tokens -> (B,) bool``: a row stops once True (later tokens PAD).

        The arguments are checked (and the model put in eval mode) at the call, before the first
        token; a backbone without attention (``mlp``) has nothing to cache and reruns the prefix.
        """
        if (not isinstance(prompt, torch.Tensor) or prompt.dim() != 2 or prompt.shape[1] == 0
                or prompt.dtype != torch.long):
            raise ValueError(f"prompt must be a (B, P) long tensor with P >= 1, got {getattr(prompt, 'shape', prompt)}")
        int_at_least("max_new_tokens", max_new_tokens, 0)
        if window is not None and not cache:
            raise ValueError("window and sinks bound the cache: they need cache=True")
        # checks the options
        sample_next(prompt.new_zeros(1, 2, dtype=torch.float), temperature=temperature, top_k=top_k, top_p=top_p)
        self.eval()
        cache = cache and getattr(self.backbone, "encoder", None) is not None
        state = (self.new_cache(window=window, sinks=sinks, positions="absolute" if window is None else "cache")
                 if cache else None)
        return self._steps(prompt, max_new_tokens, state,
                           dict(temperature=temperature, top_k=top_k, top_p=top_p, generator=generator), stop)

    @torch.no_grad()
    def _steps(self, prompt, max_new_tokens, state, sampling, stop) -> Iterator[torch.Tensor]:
        seq, nxt = prompt, prompt
        done = torch.zeros(prompt.shape[0], dtype=torch.bool, device=prompt.device)
        for _ in range(max_new_tokens):
            logits = (self(nxt, cache=state, last=True) if state is not None else self(seq, last=True)).output[:, -1]
            tok = sample_next(logits, **sampling)
            tok = torch.where(done, torch.full_like(tok, PAD), tok)
            if stop is not None:
                done = done | stop(tok)
            yield tok
            nxt = tok[:, None]
            if state is None:
                seq = torch.cat([seq, nxt], 1)
            if bool(done.all()):
                break


def sample_next(logits: torch.Tensor, *, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of ``logits`` ``(B, V)``: greedy at temperature 0, else a sample of
    ``softmax(logits / temperature)`` restricted to the ``top_k`` most likely tokens and to the
    smallest set whose probability reaches ``top_p``. ``PAD`` is never chosen."""
    if temperature != 0:
        number_above("temperature", temperature, 0)
    logits = logits.float().clone()
    logits[:, PAD] = float("-inf")
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits / temperature
    if top_k is not None:
        k = min(positive_int("top_k", top_k), logits.shape[-1])
        kth = logits.topk(k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None:
        p = probability("top_p", number_above("top_p", top_p, 0), inclusive_one=True)
        sorted_logits, order = logits.sort(-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum - sorted_logits.softmax(-1) >= p  # tokens after the set reached p (the first is always kept)
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    probs = logits.softmax(-1)
    # drawn where the generator is: one seed, one text on any device
    if generator is not None and generator.device != probs.device:
        return torch.multinomial(probs.to(generator.device), 1, generator=generator)[:, 0].to(probs.device)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


def pack(sequences: list[list[int]], length: int, *,
         causal: bool = True) -> tuple[torch.Tensor, torch.Tensor, Documents]:
    """Pack token sequences into rows of ``length`` tokens, first fit in the given order (each
    sequence whole; one longer than ``length`` is refused), the rest of a row ``PAD``.

    Returns ``(tokens (B, length), labels (B, length), documents)``: the labels are the next
    token within the same sequence, ``IGNORE`` at each sequence's last token and on padding,
    so a packed batch's loss equals the padded batch's; ``documents`` is the
    :class:`attnlab.masks.Documents` (causal by default) to pass as ``documents=``.
    """
    from .base import IGNORE

    positive_int("length", length)
    if not sequences:
        raise ValueError("nothing to pack: give at least one sequence")
    rows: list[list[list[int]]] = []
    for seq in sequences:
        if not 1 <= len(seq) <= length:
            raise ValueError(f"a sequence of {len(seq)} tokens does not fit a row of {length} (each needs 1..{length})")
        for row in rows:
            if sum(map(len, row)) + len(seq) <= length:
                row.append(list(seq))
                break
        else:
            rows.append([list(seq)])
    tokens = torch.full((len(rows), length), PAD, dtype=torch.long)
    labels = torch.full((len(rows), length), IGNORE, dtype=torch.long)
    for b, row in enumerate(rows):
        at = 0
        for seq in row:
            t = torch.tensor(seq, dtype=torch.long)
            tokens[b, at : at + len(seq)] = t
            labels[b, at : at + len(seq) - 1] = t[1:]
            at += len(seq)
    return tokens, labels, Documents([[len(s) for s in row] for row in rows], causal=causal)
