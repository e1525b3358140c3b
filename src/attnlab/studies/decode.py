"""Decoding studies: the speed of cached decoding against recomputation and against Hugging Face
``transformers``' ``generate``, the memory of a bounded (StreamingLLM) cache over long streams,
and the perplexity of the bounded caches on a stream longer than the training context.

* :func:`speed` — one causal language model of GPT-2's shape (pre-norm, GELU, learned positions,
  tied embeddings), randomly initialised, in attnlab (:class:`attnlab.models.LanguageModel`) and
  as ``transformers.GPT2LMHeadModel`` built from a config (no weights downloaded). Greedy
  decoding of ``new_tokens`` after a prompt of each context length, timed side by side
  (round-robin): attnlab with the cache, attnlab rerunning the prefix at every step, and
  ``generate``. Each is also timed for one new token (the prompt's prefill), so the decoding
  rate ``(new_tokens - 1) / (t(new_tokens) - t(1))`` is reported beside the end-to-end rate.
* :func:`streaming_memory` — the bytes a sinks + window cache holds after 1K, 10K, 100K tokens,
  against the full cache.
* :func:`streaming_perplexity` — a trained byte-level model (``attnlab train docs``) reading a
  stream ``factor`` times its training context: full cache (= recomputing the whole prefix),
  window only, sinks + window (both with StreamingLLM's positions in the cache), and the sliding
  window recomputed for every token (the quality reference StreamingLLM compares to).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..models import LanguageModel, ModelConfig, build_model
from ..models.config import AttentionSpec, PositionalSpec
from ..profiling import round_robin
from ..validate import positive_int
from .records import StudyRecord

__all__ = ["DecodeRecord", "PerplexityRecord", "StreamMemoryRecord", "gpt2_pair", "speed", "streaming_memory",
           "streaming_perplexity"]


@dataclass
class DecodeRecord(StudyRecord):
    """One implementation at one context: ``seconds`` (median, prompt + ``new_tokens`` greedy
    steps), ``prefill_seconds`` (median, one new token), ``tokens_per_second`` (end to end),
    ``decode_tokens_per_second`` (the steps after the first), and for the cached decoding
    whether its tokens equal the uncached greedy tokens (``same_tokens``; None elsewhere)."""

    implementation: str
    context: int
    new_tokens: int
    seconds: float
    prefill_seconds: float
    tokens_per_second: float
    decode_tokens_per_second: float | None
    same_tokens: bool | None
    repeats: int
    dim: int  # the model's embed_dim, num_layers and num_heads, under the keys of the JSON files already written
    layers: int
    heads: int
    vocab: int


@dataclass
class StreamMemoryRecord(StudyRecord):
    """The cache's bytes after ``tokens`` tokens of a stream (``cache``: ``full`` or ``sinks+window``)."""

    cache: str
    tokens: int
    cache_bytes: int
    sinks: int
    window: int | None


@dataclass
class PerplexityRecord(StudyRecord):
    """Perplexity per byte of one way of reading a stream of ``stream`` tokens (``context``: the
    model's training context; ``kept``: tokens attended per step at most)."""

    method: str
    stream: int
    context: int
    kept: int | None
    perplexity: float
    streams: int


IMPLEMENTATIONS = ("attnlab cached", "attnlab uncached", "transformers generate")


def gpt2_pair(embed_dim: int, num_layers: int, num_heads: int, vocab: int, max_len: int, *, seed: int = 0):
    """``(attnlab LanguageModel, transformers GPT2LMHeadModel or None)`` of one shape, randomly
    initialised, in eval mode (None when ``transformers`` is not installed)."""
    torch.manual_seed(seed)
    ours = build_model(ModelConfig(kind="lm", model="lm", num_labels=vocab, embed_dim=embed_dim, vocab_size=vocab,
                                   num_layers=num_layers, num_heads=num_heads, max_len=max_len,
                                   attention=AttentionSpec("dense", {}), positional=PositionalSpec("learned"))).eval()
    try:
        import transformers
    except ImportError:
        return ours, None
    transformers.logging.set_verbosity_error()
    cfg = transformers.GPT2Config(n_embd=embed_dim, n_layer=num_layers, n_head=num_heads, vocab_size=vocab,
                                  n_positions=max_len, activation_function="gelu", bos_token_id=0, eos_token_id=0)
    return ours, transformers.GPT2LMHeadModel(cfg).eval()


def speed(contexts=(256, 1024, 4096), *, new_tokens: int = 32, embed_dim: int = 256, num_layers: int = 4,
          num_heads: int = 4, vocab: int = 258, min_repeats: int = 3, uncached_up_to: int | None = None,
          device: str | torch.device = "cpu", on_record: Callable | None = None) -> list[DecodeRecord]:
    """Greedy decoding speed at each context (see the module docstring) on ``device`` (weights
    and prompts drawn on the CPU, then moved; timed between synchronisations on a GPU).
    ``uncached_up_to``: the longest context at which the uncached reference runs (default: all)."""
    positive_int("new_tokens", new_tokens)
    if new_tokens < 2:
        raise ValueError("new_tokens must be >= 2 (the decoding rate needs steps after the first)")
    device = torch.device(device)
    ours, hf = gpt2_pair(embed_dim, num_layers, num_heads, vocab, max(contexts) + new_tokens)
    ours = ours.to(device)
    hf = None if hf is None else hf.to(device)
    records = []
    for c in contexts:
        prompt = torch.randint(2, vocab, (1, positive_int("context", c)),
                               generator=torch.Generator().manual_seed(c)).to(device)

        def attnlab_run(cache: bool, n: int):
            # called in this iteration
            return lambda: torch.stack(list(ours.generate(prompt, n, temperature=0, cache=cache)), 1)  # noqa: B023

        calls = {("attnlab cached", new_tokens): attnlab_run(True, new_tokens),
                 ("attnlab cached", 1): attnlab_run(True, 1)}
        if uncached_up_to is None or c <= uncached_up_to:
            calls[("attnlab uncached", new_tokens)] = attnlab_run(False, new_tokens)
            calls[("attnlab uncached", 1)] = attnlab_run(False, 1)
        if hf is not None:
            def hf_run(n):
                def go():
                    with torch.no_grad():  # called in this iteration
                        return hf.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False,  # noqa: B023
                                           pad_token_id=0)[:, c:]  # noqa: B023
                return go
            calls[("transformers generate", new_tokens)] = hf_run(new_tokens)
            calls[("transformers generate", 1)] = hf_run(1)
        with torch.no_grad():
            produced = {impl: calls[(impl, new_tokens)]() for impl, n in calls if n == new_tokens}
        reference = produced.get("attnlab uncached")
        times = round_robin(calls, min_repeats, 20.0, max_repeats=7, device=device)
        for impl in IMPLEMENTATIONS:
            if (impl, new_tokens) not in calls:
                continue
            full = _timed_median(times[(impl, new_tokens)])
            first = _timed_median(times[(impl, 1)])
            # the cached tokens against the uncached ones (transformers' model has other random weights: not compared)
            same = (bool(torch.equal(produced[impl], reference)) if impl == "attnlab cached" and reference is not None
                    else None)
            rec = DecodeRecord(impl, c, new_tokens, full, first, new_tokens / full,
                               (new_tokens - 1) / (full - first) if full > first else None, same,
                               len(times[(impl, new_tokens)]) - 1, embed_dim, num_layers, num_heads, vocab)
            records.append(rec)
            if on_record is not None:
                on_record(rec)
    return records


def _timed_median(ts: list[float]) -> float:
    """The median of round-robin timings, the warm-up (the first) left out."""
    return statistics.median(ts[1:] or ts)


def streaming_memory(lengths=(1000, 10000, 100000), *, sinks: int = 4, window: int = 252, full_up_to: int = 10000,
                     embed_dim: int = 64, num_layers: int = 2, num_heads: int = 4, device: str | torch.device = "cpu",
                     on_record: Callable | None = None) -> list[StreamMemoryRecord]:
    """Cache bytes after each of ``lengths`` tokens of a stream of random bytes through a small
    rope model on ``device``, for a sinks + window cache and (up to ``full_up_to`` tokens) the full cache."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(kind="lm", model="lm", num_labels=258, embed_dim=embed_dim, vocab_size=258,
                                    num_layers=num_layers, num_heads=num_heads, attention=AttentionSpec("dense", {}),
                                    positional=PositionalSpec("rope")))
    model = model.to(device).eval()
    stream = torch.randint(2, 258, (1, max(lengths)), generator=torch.Generator().manual_seed(1)).to(device)
    records = []
    for name, opts, limit in (("sinks+window", {"window": window, "sinks": sinks, "positions": "cache"}, max(lengths)),
                              ("full", {}, full_up_to)):
        cache = model.new_cache(**opts)
        marks = sorted(n for n in lengths if n <= limit)
        with torch.no_grad():
            for t in range(marks[-1] if marks else 0):
                model(stream[:, t : t + 1], cache=cache, last=True)
                if t + 1 in marks:
                    rec = StreamMemoryRecord(name, t + 1, cache.nbytes(), opts.get("sinks", 0), opts.get("window"))
                    records.append(rec)
                    if on_record is not None:
                        on_record(rec)
    return records


def streaming_perplexity(model: LanguageModel, text_ids: torch.Tensor, *, context: int, factor: int = 8, sinks: int = 4,
                         streams: int = 2, on_record: Callable | None = None) -> list[PerplexityRecord]:
    """Perplexity per token of reading ``streams`` streams of ``factor x context`` tokens cut
    from ``text_ids`` (1-D), one token at a time, four ways (see the module docstring), on the
    model's device; the bounded caches hold ``context`` tokens (``sinks`` of them sinks)."""
    length = positive_int("factor", factor) * positive_int("context", context)
    if text_ids.numel() < streams * (length + 1):
        raise ValueError(f"the text has {text_ids.numel()} tokens, {streams} streams of {length + 1} need more")
    methods = {
        "full cache (= recomputing the prefix)": ({}, None),
        "window only": ({"window": context, "positions": "cache"}, context),
        f"{sinks} sinks + window": ({"window": context - sinks, "sinks": sinks, "positions": "cache"}, context),
        "sliding window, recomputed": (None, context),
    }
    records = []
    model.eval()
    for method, (opts, kept) in methods.items():
        nll, count = 0.0, 0
        for s in range(streams):
            ids = text_ids[s * (length + 1) : (s + 1) * (length + 1)][None].to(next(model.parameters()).device)
            with torch.no_grad():
                if opts is None:  # re-encode the last `context` tokens for every prediction
                    for t in range(length):
                        logits = model(ids[:, max(0, t + 1 - context) : t + 1], last=True).output[0, -1]
                        nll -= float(logits.double().log_softmax(-1)[ids[0, t + 1]])
                else:
                    cache = model.new_cache(**opts)
                    for t in range(length):
                        logits = model(ids[:, t : t + 1], cache=cache, last=True).output[0, -1]
                        nll -= float(logits.double().log_softmax(-1)[ids[0, t + 1]])
            count += length
        rec = PerplexityRecord(method, length, context, kept, math.exp(nll / count), streams)
        records.append(rec)
        if on_record is not None:
            on_record(rec)
    return records
