"""``lookup``: read a key-value log at a point in time, 1K-4K tokens (a long-range task that
attention must solve and a 2-core CPU learns in seconds).

A sequence is a log of **writes** ``(key, value)`` (one token each) read part-way through:

1. the *past*: each of ``keys`` keys written ``repeats`` times, always with its own value
   (drawn from ``values``), in random order;
2. a *gap* of ``gap`` noise tokens;
3. the *reads*: ``queries`` tokens, each naming one of the keys; its label is the value that key
   had in the past;
4. the *future*: each key written ``repeats`` times with every **other** value, in random order;
5. noise up to ``length``.

Over the whole sequence every key is written exactly ``repeats`` times with every value, so the
multiset of tokens says nothing about any answer: **a model that ignores order (a bag of tokens)
or reads each token alone is at chance (1 / values) by construction**. Only the writes before
a read count, which a causal model sees and nothing else does: a model that attends to the past
matches the read's key against the past writes (``repeats`` of them among the hundreds of
tokens it sees) and reads their value. The reads sit ``gap`` tokens and more after the nearest
past write, so a window shorter than the gap sees none of them (``local`` attention is at
chance), and a recurrent state must hold every key's value across the gap (``linear``,
``performer``: between the two).

The arena trains it causally with rotary positions (:func:`make_lookup`'s training defaults:
one layer of four heads of 16 channels), at three difficulty levels of ``keys`` (8, 16 and 32,
:data:`attnlab.arena.presets.LOOKUP_LEVELS`), 200 steps a run, on 512 training sequences (its
default run's ``size``; ``attnlab train lookup`` takes the task's own default, 1,024): dense
attention's mean over two seeds is 0.93 or more at each, while a fixed-size state falls off as
the keys it must hold grow (the default run's scores: benchmarks/results/arena-repro-*.json).
"""

from __future__ import annotations

import torch

from ..validate import positive_int
from .base import FIRST, IGNORE, Split, Task, register, split_sizes

__all__ = ["make_lookup"]


@register("lookup", train_defaults={"steps": 600, "batch_size": 4, "lr": 1e-2, "warmup": 10, "embed_dim": 64,
                                    "num_heads": 4, "num_layers": 1, "positional": "rope", "causal": True,
                                    "eval_every": 50})
def make_lookup(size: int = 1024, seed: int = 0, length: int = 1024, keys: int = 16, values: int = 2, repeats: int = 16,
                queries: int = 64, gap: int = 128, num_keys: int = 32, noise: int = 16) -> Task:
    """A 1K-token key-value log read part-way: each read's label is the value written before it.

    Token ids: a write ``(k, v)`` is ``FIRST + k * values + v``, a read of
    key ``k`` is ``FIRST + num_keys * values + k``, then the ``noise`` tokens; labels are values
    at the reads (:data:`IGNORE` elsewhere).

    Args:
        size: training sequences (val and test: size / 8 each, at least 64); the arena's
            default run trains on 512. seed: the generator's.
        length: tokens per sequence (noise fills what the log leaves); any length the log fits in: the
            arena trains at 1,024 and measures one training step up to 16,384 (a dense step's cost
            grows with its square, so training far beyond 4,096 is for a GPU).
        keys: the keys written in each sequence (its log has ``keys * repeats`` past writes);
            a fixed-size state must hold every one of them across the gap.
        values: the values a key can hold (chance is ``1 / values``).
        repeats: how often each key is written before the reads (and with every other value after them).
        queries: the reads, each of one of the sequence's keys: the scored positions.
        gap: noise tokens between the last past write and the first read (a window shorter than
            this sees no write from a read).
        num_keys: the key vocabulary the ``keys`` of a sequence are drawn from (at least ``keys``).
        noise: the noise tokens' vocabulary.
    """
    for name, val in (("size", size), ("length", length), ("keys", keys), ("values", values), ("repeats", repeats),
                      ("queries", queries), ("num_keys", num_keys), ("noise", noise)):
        positive_int(name, val)
    if values < 2:
        raise ValueError("values must be at least 2: the future writes every other value")
    if gap < 0:
        raise ValueError(f"gap must be >= 0, got {gap}")
    if keys > num_keys:
        raise ValueError(f"keys ({keys}) cannot exceed num_keys ({num_keys}): the keys of a sequence are distinct")
    past, future = keys * repeats, keys * (values - 1) * repeats
    need = past + gap + queries + future
    if need > length:
        raise ValueError(f"length {length} cannot hold the log: {past} past writes + gap {gap} + {queries} reads + "
                         f"{future} future writes = {need} tokens; lower repeats, keys or values, or raise length")
    g = torch.Generator().manual_seed(seed)
    read_base = FIRST + num_keys * values
    noise_base = read_base + num_keys
    reads = past + gap
    splits = {}
    for name, count in split_sizes(size).items():
        ks = torch.rand(count, num_keys, generator=g).argsort(-1)[:, :keys]  # distinct keys per sequence
        vs = torch.randint(values, (count, keys), generator=g)
        tokens = noise_base + torch.randint(noise, (count, length), generator=g)
        order = torch.rand(count, past, generator=g).argsort(-1) % keys  # each key `repeats` times, shuffled
        tokens[:, :past] = FIRST + ks.gather(1, order) * values + vs.gather(1, order)
        slot = torch.rand(count, future, generator=g).argsort(-1)  # each (key, other value) `repeats` times, shuffled
        which = slot % keys
        other = (vs.gather(1, which) + 1 + (slot // keys) % (values - 1)) % values
        start = reads + queries
        tokens[:, start : start + future] = FIRST + ks.gather(1, which) * values + other
        pick = torch.randint(keys, (count, queries), generator=g)
        tokens[:, reads : reads + queries] = read_base + ks.gather(1, pick)
        labels = torch.full((count, length), IGNORE, dtype=torch.long)
        labels[:, reads : reads + queries] = vs.gather(1, pick)
        splits[name] = Split(tokens, labels)
    vocab = ["<pad>", "<cls>", *[f"k{k}={v}" for k in range(num_keys) for v in range(values)],
             *[f"k{k}?" for k in range(num_keys)], *[f"n{i}" for i in range(noise)]]
    return Task(
        name="lookup", kind="tagging", vocab_size=len(vocab), num_labels=values, metric="query_accuracy", splits=splits,
        options={"size": size, "seed": seed, "length": length, "keys": keys, "values": values, "repeats": repeats,
                 "queries": queries, "gap": gap, "num_keys": num_keys, "noise": noise},
        vocab=vocab, label_names=[f"v{v}" for v in range(values)], baseline={"chance": 1 / values},
    )
