"""``docs``: byte-level language modelling of Python's own documentation, which every machine
has: the text of the reference manual's topics that ``help()`` shows (``pydoc_data.topics``,
part of the standard library; some hundreds of KB of English prose with code examples).

The topics are joined in the order of their names into one byte stream and cut into three
contiguous parts (90 % train, 5 % validation, 5 % test, as enwik8 is), so that no test text
is seen in training. An example is a window of ``length`` bytes (one byte a token,
``FIRST + byte``) and its labels are the same window moved on by one byte: the next byte at
every position. Training windows overlap (stride ``length / 2``); the others do not.

Metric: perplexity per byte (lower is better). The task's baseline is the unigram model
(byte frequencies of the training text, add-one smoothed) on the validation text.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..validate import int_at_least, positive_int
from .base import FIRST, Split, Task, register

__all__ = ["decode_bytes", "docs_text", "encode_bytes", "make_docs", "unigram_perplexity"]


def docs_text() -> bytes:
    """The documentation topics of this Python, joined in the order of their names (UTF-8)."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name].strip() for name in sorted(topics)).encode("utf-8")


def encode_bytes(text: str) -> list[int]:
    """Token ids of ``text``: ``FIRST + byte`` of its UTF-8 bytes."""
    return [FIRST + b for b in text.encode("utf-8")]


def decode_bytes(ids) -> str:
    """The text of token ids (special ids below ``FIRST`` are dropped; broken UTF-8 replaced)."""
    return bytes(int(i) - FIRST for i in ids if FIRST <= int(i) < FIRST + 256).decode("utf-8", errors="replace")


def unigram_perplexity(train: np.ndarray, test: np.ndarray) -> float:
    """Perplexity of the add-one smoothed byte frequencies of ``train`` on the bytes ``test``."""
    counts = np.bincount(train, minlength=256).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    return float(math.exp(-logp[test].mean()))


def _windows(data: np.ndarray, length: int, stride: int) -> tuple[torch.Tensor, torch.Tensor]:
    starts = range(0, len(data) - length - 1 + 1, stride)
    rows = np.stack([data[s : s + length + 1] for s in starts]).astype(np.int64) + FIRST
    t = torch.from_numpy(rows)
    return t[:, :-1].contiguous(), t[:, 1:].contiguous()


@register("docs", train_defaults={"model": "lm", "steps": 1200, "batch_size": 16, "lr": 2e-3, "warmup": 50,
                                  "embed_dim": 128, "num_layers": 4, "num_heads": 4,
                                  "positional": "rope", "eval_every": 200})
def make_docs(size: int = 8000, seed: int = 0, length: int = 256) -> Task:
    """The ``docs`` task: at most ``size`` training windows of ``length`` bytes (see the module docstring).

    Args:
        size: the most training windows kept. seed: which windows are kept.
        length: bytes per window (the model's context).
    """
    positive_int("size", size)
    int_at_least("length", length, 8)
    data = np.frombuffer(docs_text(), dtype=np.uint8)
    a, b = int(len(data) * 0.9), int(len(data) * 0.95)
    parts = {"train": data[:a], "val": data[a:b], "test": data[b:]}
    splits = {}
    for name, part in parts.items():
        if len(part) < length + 1:
            raise ValueError(f"length={length} is longer than the {name} text ({len(part)} bytes); "
                             "choose a shorter length")
        tokens, labels = _windows(part, length, max(1, length // 2) if name == "train" else length)
        if name == "train" and len(tokens) > size:
            keep = np.sort(np.random.default_rng(seed).permutation(len(tokens))[:size])
            tokens, labels = tokens[keep], labels[keep]
        splits[name] = Split(tokens, labels)
    vocab = ["<pad>", "<cls>"] + [chr(i) if 32 <= i < 127 else f"\\x{i:02x}" for i in range(256)]
    return Task(
        name="docs", kind="lm", vocab_size=FIRST + 256, num_labels=FIRST + 256, metric="perplexity", splits=splits,
        options={"size": size, "seed": seed, "length": length}, vocab=vocab,
        baseline={"unigram": unigram_perplexity(parts["train"], parts["val"][1:])},
        artifacts={"codec": "bytes", "bytes": {k: int(len(v)) for k, v in parts.items()}},
    )
