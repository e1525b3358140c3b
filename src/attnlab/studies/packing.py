"""Packed training: the cost per token of a causal encoder's forward and backward pass over k
documents packed into one row, attended document by document (:class:`attnlab.masks.Documents`),
against the same row under the dense block-diagonal mask (``T x T``, T the packed length) and
against the documents padded one per row. Timed side by side (round-robin)."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..core.masks import Documents
from ..models import Encoder
from ..profiling import round_robin
from .records import StudyRecord

__all__ = ["PackingRecord", "run"]

METHODS = ("documents", "dense block-diagonal mask", "padded, one per row")


@dataclass
class PackingRecord(StudyRecord):
    """One method at ``documents`` packed documents (``tokens`` real tokens in all):
    ``seconds`` (median forward + backward) and ``microseconds_per_token``."""

    method: str
    documents: int
    tokens: int
    seconds: float
    microseconds_per_token: float
    repeats: int
    dim: int  # the encoder's embed_dim and num_layers, under the keys of the JSON files already written
    layers: int


def run(counts=(1, 4, 16, 64), *, min_length: int = 64, max_length: int = 256, embed_dim: int = 128,
        num_layers: int = 2, num_heads: int = 4, positional: str = "rope", dense_up_to: int = 8192,
        min_repeats: int = 2, device: str | torch.device = "cpu",
        on_record: Callable | None = None) -> list[PackingRecord]:
    """For each count k: k documents with lengths drawn uniformly in ``[min_length, max_length]``
    (seed k), one causal encoder on ``device`` (weights and inputs drawn on the CPU, then moved;
    timed between synchronisations on a GPU); the dense mask only while the packed length is at
    most ``dense_up_to``."""
    device = torch.device(device)
    torch.manual_seed(0)
    enc = Encoder(embed_dim, num_heads, num_layers, causal=True, positional=positional).to(device)
    records = []
    for k in counts:
        g = torch.Generator().manual_seed(k)
        lengths = torch.randint(min_length, max_length + 1, (k,), generator=g).tolist()
        t = sum(lengths)
        docs = Documents(lengths, causal=True)
        x = torch.randn(1, t, embed_dim, generator=g)
        pos = docs.positions(t)[0]
        padded = torch.zeros(k, max(lengths), embed_dim)
        pad_mask = torch.zeros(k, 1, 1, max(lengths), dtype=torch.bool)
        at = 0
        for i, n in enumerate(lengths):
            padded[i, :n], pad_mask[i, ..., :n] = x[0, at : at + n], True
            at += n
        x, pos, padded, pad_mask = (t_.to(device) for t_ in (x, pos, padded, pad_mask))

        def step(fn):
            def go():
                enc.zero_grad(set_to_none=True)
                fn().output.square().mean().backward()
            return go

        # the lambdas are called in this iteration
        calls = {"documents": step(lambda: enc(x, mask=docs)),  # noqa: B023
                 "padded, one per row": step(lambda: enc(padded, mask=pad_mask))}  # noqa: B023
        if t <= dense_up_to:
            dense = docs.dense(t, device=device)
            # called in this iteration
            calls["dense block-diagonal mask"] = step(lambda: enc(x, mask=dense, positions=pos))  # noqa: B023
        times = round_robin(calls, min_repeats, 6.0, max_repeats=5, device=device)
        for method in METHODS:
            if method in calls:
                sec = statistics.median(times[method][1:] or times[method])
                rec = PackingRecord(method, k, t, sec, 1e6 * sec / t, len(times[method]) - 1, embed_dim, num_layers)
                records.append(rec)
                if on_record is not None:
                    on_record(rec)
    return records
