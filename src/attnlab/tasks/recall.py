"""``recall``: multi-query associative recall (MQAR, Arora et al. 2023, "Zoology").

A sequence lists ``pairs`` key-value pairs ``k_1 v_1 k_2 v_2 ...`` (distinct keys drawn from
``num_keys``, values from ``num_values``), then ``queries`` of those keys in random order; the
label of each query position is the value that followed the same key earlier (other positions
are not scored). Softmax attention looks the key up exactly; a fixed-size recurrent state (linear
attention) must compress every pair into it, which is what separates them.
"""

from __future__ import annotations

import torch

from ..validate import positive_int
from .base import FIRST, IGNORE, Split, Task, register, split_sizes

__all__ = ["make_recall"]


@register("recall", train_defaults={"steps": 5000, "batch_size": 64, "lr": 2e-3, "embed_dim": 64, "num_layers": 2, "positional": "rope",
                                    "causal": True, "eval_every": 250})
def make_recall(size: int = 20000, seed: int = 0, pairs: int = 16, queries: int = 16, num_keys: int = 64, num_values: int = 64) -> Task:
    """The ``recall`` task; token ids: keys ``FIRST ..``, then values; labels are value indices."""
    for name, val in (("pairs", pairs), ("queries", queries), ("num_keys", num_keys), ("num_values", num_values)):
        positive_int(name, val)
    if pairs > num_keys:
        raise ValueError(f"pairs ({pairs}) cannot exceed num_keys ({num_keys}): keys are distinct")
    g = torch.Generator().manual_seed(seed)
    n = 2 * pairs + queries
    splits = {}
    for name, count in split_sizes(size).items():
        keys = torch.rand(count, num_keys, generator=g).argsort(-1)[:, :pairs]  # distinct keys per sequence
        vals = torch.randint(num_values, (count, pairs), generator=g)
        pick = torch.randint(pairs, (count, queries), generator=g)
        tokens = torch.empty(count, n, dtype=torch.long)
        tokens[:, 0 : 2 * pairs : 2] = FIRST + keys
        tokens[:, 1 : 2 * pairs : 2] = FIRST + num_keys + vals
        tokens[:, 2 * pairs :] = FIRST + keys.gather(1, pick)
        labels = torch.full((count, n), IGNORE, dtype=torch.long)
        labels[:, 2 * pairs :] = vals.gather(1, pick)
        splits[name] = Split(tokens, labels)
    vocab = ["<pad>", "<cls>", *[f"k{i}" for i in range(num_keys)], *[f"v{i}" for i in range(num_values)]]
    return Task(
        name="recall",
        kind="tagging",
        vocab_size=len(vocab),
        num_labels=num_values,
        metric="query_accuracy",
        splits=splits,
        options={"size": size, "seed": seed, "pairs": pairs, "queries": queries, "num_keys": num_keys, "num_values": num_values},
        vocab=vocab,
        label_names=[f"v{i}" for i in range(num_values)],
        baseline={"chance": 1 / num_values},
    )
