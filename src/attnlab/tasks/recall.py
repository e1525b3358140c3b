"""``recall``: multi-query associative recall (MQAR, Arora et al. 2023, "Zoology").

A sequence lists ``pairs`` key-value pairs ``k_1 v_1 k_2 v_2 ...`` (distinct keys drawn from
``num_keys``, values from ``num_values``), then ``queries`` of those keys in random order; the
label of each query position is the value that followed the same key earlier (other positions
are not scored). Softmax attention looks the key up exactly; a fixed-size recurrent state (linear
attention) must compress every pair into it, which is what separates them.

With ``length`` the sequence is long-range: noise tokens fill the space between the pairs and
the queries (``recall --task-option length=1024``: 1K tokens, the pairs and queries about 1K
apart). A 2-layer model must then find a key among ~1000 tokens and read the token after it (an
induction head); on a 2-core CPU dense attention does not learn that within the arena's default
budgets, which is why the default run's long task is ``lookup`` (:mod:`attnlab.tasks.lookup`).
"""

from __future__ import annotations

import torch

from ..validate import positive_int
from .base import FIRST, IGNORE, Split, Task, register, split_sizes

__all__ = ["make_recall"]


@register("recall", train_defaults={"steps": 5000, "batch_size": 64, "lr": 2e-3, "embed_dim": 64, "num_layers": 2,
                                    "positional": "rope", "causal": True, "eval_every": 250})
def make_recall(size: int = 20000, seed: int = 0, pairs: int = 16, queries: int = 16, num_keys: int = 64,
                num_values: int = 64, length: int | None = None, noise: int = 16) -> Task:
    """The ``recall`` task; token ids: keys ``FIRST ..``, then values, then ``noise`` noise tokens;
    labels are value indices. ``length`` (default: no noise, ``2 * pairs + queries`` tokens)
    puts noise tokens between the pairs and the queries up to that many tokens: the long-range
    form, pairs and queries ``length - 2 * pairs - queries`` tokens apart.

    Args:
        size: training sequences (val and test: size / 8 each, at least 64). seed: the generator's.
        pairs: key-value pairs written at the start of a sequence. queries: keys asked after them.
        num_keys: the key vocabulary. num_values: the value vocabulary (chance is ``1 / num_values``).
        length: tokens per sequence, noise between the pairs and the queries (None: no noise).
        noise: the noise tokens' vocabulary.
    """
    for name, val in (("pairs", pairs), ("queries", queries), ("num_keys", num_keys),
                      ("num_values", num_values), ("noise", noise)):
        positive_int(name, val)
    if pairs > num_keys:
        raise ValueError(f"pairs ({pairs}) cannot exceed num_keys ({num_keys}): keys are distinct")
    g = torch.Generator().manual_seed(seed)
    short = 2 * pairs + queries
    n = short if length is None else positive_int("length", length)
    if n < short:
        raise ValueError(f"length ({length}) must hold the {pairs} pairs and {queries} queries ({short} tokens)")
    splits = {}
    for name, count in split_sizes(size).items():
        keys = torch.rand(count, num_keys, generator=g).argsort(-1)[:, :pairs]  # distinct keys per sequence
        vals = torch.randint(num_values, (count, pairs), generator=g)
        pick = torch.randint(pairs, (count, queries), generator=g)
        tokens = torch.empty(count, n, dtype=torch.long)
        if n > short:  # the long-range form: noise between the pairs and the queries
            tokens[:, 2 * pairs : n - queries] = (FIRST + num_keys + num_values
                                                  + torch.randint(noise, (count, n - short), generator=g))
        tokens[:, 0 : 2 * pairs : 2] = FIRST + keys
        tokens[:, 1 : 2 * pairs : 2] = FIRST + num_keys + vals
        tokens[:, n - queries :] = FIRST + keys.gather(1, pick)
        labels = torch.full((count, n), IGNORE, dtype=torch.long)
        labels[:, n - queries :] = vals.gather(1, pick)
        splits[name] = Split(tokens, labels)
    long = {"length": n, "noise": noise} if length is not None else {}
    vocab = ["<pad>", "<cls>", *[f"k{i}" for i in range(num_keys)], *[f"v{i}" for i in range(num_values)],
             *([f"n{i}" for i in range(noise)] if long else [])]
    return Task(
        name="recall",
        kind="tagging",
        vocab_size=len(vocab),
        num_labels=num_values,
        metric="query_accuracy",
        splits=splits,
        options={"size": size, "seed": seed, "pairs": pairs, "queries": queries, "num_keys": num_keys,
                 "num_values": num_values, **long},
        vocab=vocab,
        label_names=[f"v{i}" for i in range(num_values)],
        baseline={"chance": 1 / num_values},
    )
