"""Associative recall against recurrent state size: what separates the linear-attention family.

After Zoology (Arora et al. 2023, https://arxiv.org/abs/2312.04927, figure 2: MQAR accuracy
against model dimension) and Based (Arora et al. 2024, https://arxiv.org/abs/2402.18668, figure 2:
recall against recurrent state size): each variant is trained on multi-query associative recall
(:mod:`attnlab.tasks.recall`) for the same number of steps (Zoology's comparison: capacity, not
speed), each run capped at a number of seconds so that the study fits a stated wall time (a
variant slower per step than the cap allows trains fewer steps, which its record shows), at several numbers of key-value
pairs (the sequence holds ``2 pairs + queries`` tokens) and model widths, and scored on the test
queries. The **state size** is measured, not assumed: the bytes one layer's decoding cache holds
after reading a whole sequence (:meth:`attnlab.MultiHeadAttention.new_cache`), in float32 numbers —
the keys and values of every token for dense attention (and for ``fox`` each key's cumulative
forget gate per head), of the window for ``local``, the running
sums for ``linear`` and the ``D x D`` state per head (and the short convolution's last inputs) for
the gated family.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import efficient, tasks
from ..training.config import TrainConfig
from .records import StudyRecord

__all__ = ["BASELINES", "RecallRecord", "WINDOW", "default_variants", "run", "state_floats"]

WINDOW = 8
"""The sliding window's width in the study (``local``): a state of 2 (w + 1) d numbers."""

BASELINES = ("dense", "local", "linear")
"""The study's points of reference, one per kind of state: every token's keys and values
(``dense``), a window (``local``), plain running sums (``linear``, the ungated ancestor)."""


def default_variants() -> list[str]:
    """The variants the study compares by default, read from the registry: the :data:`BASELINES`,
    then every sequence mixer (gated by the layer's input) that decodes causally from a
    state (declared capabilities ``mixer``, a causal form and a ``cache``; the study's
    subject, the gated linear-attention family, and any such variant registered later), in the
    order of registration."""
    decoding = efficient.select(causal=True, decodes=True, reference=False)
    return [v for v in BASELINES if v in decoding] + [v for v in decoding if efficient.capabilities(v).mixer
                                                      and v not in BASELINES]


@dataclass
class RecallRecord(StudyRecord):
    """One trained model: the variant, the task's size, the width, the state it decodes with
    (float32 numbers per layer), the test query accuracy and the training it had."""

    variant: str
    pairs: int
    length: int
    dim: int  # the model's embed_dim, under the key of the JSON files already written
    state_floats: int
    accuracy: float
    steps: int
    train_seconds: float
    chance: float


def _options(variant: str) -> dict:
    return {"window": WINDOW} if variant == "local" else {}


def state_floats(variant: str, embed_dim: int, num_heads: int, length: int, options: dict | None = None) -> int:
    """Numbers one causal layer of ``variant`` keeps to decode the next token after ``length``
    tokens: its cache's bytes after reading them, over 4."""
    torch.manual_seed(0)
    # "mask": it decodes causally with any cache
    causal = {"causal": True} if efficient.capabilities(variant).causal == "option" else {}
    layer = efficient.create(variant, embed_dim=embed_dim, num_heads=num_heads, **causal, **_options(variant),
                             **(options or {})).eval()
    cache = layer.new_cache()
    with torch.no_grad():
        layer(torch.randn(1, length, embed_dim), cache=cache)
    return cache.nbytes() // 4


def run(
    variants: Iterable[str] | None = None,
    pairs: Iterable[int] = (8, 16),
    embed_dims: Iterable[int] = (32, 64),
    *,
    steps: int = 1500,
    seconds: float = 60.0,
    num_keys: int = 32,
    size: int = 4000,
    seed: int = 0,
    precision: str = "fp32",
    options: dict[str, dict] | None = None,
    device: str | torch.device = "cpu",
    on_record: Callable[[RecallRecord], None] | None = None,
) -> list[RecallRecord]:
    """Train and score every (pairs, embed_dim, variant) for ``steps`` steps (at most ``seconds`` each;
    ``variants``: default :func:`default_variants`) on ``device`` (:attr:`attnlab.training.TrainConfig.device`);
    ``queries = pairs``, ``num_keys`` keys and values. ``options``: extra attention options per
    variant (an ablation: ``{"deltanet": {"conv_size": 0}}``), named in the record's ``variant``.
    The state size is counted on the CPU (the same on every device)."""
    from ..training import train

    variants = default_variants() if variants is None else list(variants)
    out: list[RecallRecord] = []
    with tempfile.TemporaryDirectory(prefix="attnlab-recall-") as tmp:  # the runs' checkpoints, removed after
        for p in pairs:
            task_options = {"pairs": p, "queries": p, "num_keys": max(num_keys, p), "num_values": num_keys,
                            "size": size, "seed": seed}
            task = tasks.create("recall", **task_options)
            for embed_dim in embed_dims:
                for variant in variants:
                    extra = (options or {}).get(variant, {})
                    label = variant + "".join(f" {k}={v}" for k, v in extra.items())
                    cfg = TrainConfig.for_task("recall", task_options=task_options, attention=variant,
                                               attention_options={**_options(variant), **extra}, embed_dim=embed_dim,
                                               seconds=float(seconds), steps=steps, eval_every=100, precision=precision,
                                               seed=seed, device=str(torch.device(device)))
                    cfg = dataclasses.replace(cfg, patience=None)
                    t0 = time.perf_counter()
                    res = train(cfg, Path(tmp) / f"{label}-{p}-{embed_dim}".replace(" ", "_"), task=task)
                    rec = RecallRecord(label, p, 3 * p, embed_dim,
                                       state_floats(variant, embed_dim, cfg.num_heads, 3 * p, extra), res.value,
                                       res.steps, time.perf_counter() - t0, 1 / task.num_labels)
                    out.append(rec)
                    if on_record is not None:
                        on_record(rec)
    return out
