"""Long-distance labelling: does a layer still see a token far back? (SimpleRNN vs LSTMN vs self-attention)

The task (generated here, nothing downloaded): a sequence of ``distance + 1`` tokens, a *trigger*
token of one of ``classes`` kinds at position 0, random *noise* tokens after it, and a *query*
token at position ``distance``. Every position is labelled — noise and trigger positions with
an extra "no answer" label, the query position with the trigger's kind — so the query's label
depends on a token ``distance`` positions back and nothing in between. Accuracy is measured at
the query positions of a fixed held-out set (chance: ``1 / classes``).

A plain SimpleRNN must carry the trigger through ``distance`` tanh steps, and its gradient must
come back through as many: it degrades as the distance grows. The LSTMN and the SimpleRNN with
attention read the trigger's state back from their tape in one step, and self-attention
relates the two positions directly.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from ..devices import synchronize
from ..recurrent import layers as layer_registry
from ..validate import positive_int
from .records import StudyRecord

__all__ = ["TriggerTask", "DistanceRecord", "LabelModel", "train_and_eval", "run", "DEFAULT_LAYERS"]

DEFAULT_LAYERS = ("rnn", "lstm", "attention_rnn", "lstmn", "self_attention")


@dataclass(frozen=True)
class TriggerTask:
    """The generator. Token ids: ``0 .. classes-1`` triggers, then ``noise`` noise tokens, then the
    query. Labels: the trigger's kind at the query position, ``classes`` ("no answer") elsewhere."""

    distance: int
    classes: int = 4
    noise: int = 8

    def __post_init__(self):
        for name in ("distance", "classes", "noise"):
            positive_int(name, getattr(self, name))

    @property
    def vocab(self) -> int:
        return self.classes + self.noise + 1

    @property
    def query_token(self) -> int:
        return self.classes + self.noise

    def batch(self, size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """``(tokens, labels)``, both ``(size, distance + 1)`` long."""
        n = self.distance + 1
        kind = torch.randint(self.classes, (size,), generator=generator)
        tokens = self.classes + torch.randint(self.noise, (size, n), generator=generator)
        tokens[:, 0] = kind
        tokens[:, -1] = self.query_token
        labels = torch.full((size, n), self.classes, dtype=torch.long)
        labels[:, -1] = kind
        return tokens, labels


LAYER_OPTIONS = {"self_attention": {"num_heads": 4}}
"""Options of the layers in this task: self-attention with 4 heads (one head of 32 learns it too,
but stalls at 3 of the 4 kinds on some seeds at distance 80)."""


class LabelModel(nn.Module):
    """Embedding -> one sequence layer -> a label per position."""

    def __init__(self, layer: str, vocab: int, labels: int, embed_dim: int = 32):
        super().__init__()
        self.embed = nn.Embedding(vocab, embed_dim)
        self.layer = layer_registry.create(layer, embed_dim, **LAYER_OPTIONS.get(layer, {}))
        self.head = nn.Linear(embed_dim, labels)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.layer(self.embed(tokens)))


@dataclass
class DistanceRecord(StudyRecord):
    """Held-out accuracy at the query positions after training one layer at one distance."""

    layer: str
    distance: int
    seed: int
    accuracy: float
    steps: int
    seconds: float
    final_loss: float


def train_and_eval(
    layer: str,
    distance: int,
    *,
    steps: int = 400,
    batch: int = 32,
    embed_dim: int = 32,
    lr: float = 3e-3,
    eval_size: int = 512,
    seed: int = 0,
    device: str | torch.device = "cpu",
    on_step: Callable[[int, float], None] | None = None,
) -> DistanceRecord:
    """Train a :class:`LabelModel` on fresh batches for ``steps`` Adam steps on ``device``, then
    score the held-out set (weights and batches drawn on the CPU, then moved)."""
    device = torch.device(device)
    task = TriggerTask(distance)
    torch.manual_seed(seed)
    model = LabelModel(layer, task.vocab, task.classes + 1, embed_dim).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed + 1)
    loss_fn = nn.CrossEntropyLoss()
    t0 = time.perf_counter()
    loss = torch.tensor(float("nan"))
    model.train()
    for step in range(steps):
        tokens, labels = (t.to(device) for t in task.batch(batch, gen))
        logits = model(tokens)
        # the query position carries the signal; the others keep the "no answer" label honest
        loss = loss_fn(logits[:, -1], labels[:, -1]) + 0.1 * loss_fn(logits[:, :-1].flatten(0, 1),
                                                                     labels[:, :-1].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if on_step is not None:
            on_step(step, float(loss.detach()))
    synchronize(device)
    seconds = time.perf_counter() - t0
    model.eval()
    tokens, labels = (t.to(device) for t in task.batch(eval_size, torch.Generator().manual_seed(10_000 + distance)))
    with torch.no_grad():
        pred = model(tokens)[:, -1].argmax(-1)
    acc = float((pred == labels[:, -1]).float().mean())
    return DistanceRecord(layer, distance, seed, acc, steps, seconds, float(loss.detach()))


def run(
    distances: list[int],
    layers: tuple[str, ...] | list[str] = DEFAULT_LAYERS,
    *,
    steps: int = 400,
    seeds: tuple[int, ...] | list[int] = (0,),
    device: str | torch.device = "cpu",
    on_record: Callable[[DistanceRecord], None] | None = None,
    on_step: Callable[[str, int, int, float], None] | None = None,
) -> list[DistanceRecord]:
    """:func:`train_and_eval` for every (seed, distance, layer), on ``device``."""
    out = []
    for seed in seeds:
        for d in distances:
            for name in layers:
                cb = None if on_step is None else (lambda s, loss, name=name, d=d: on_step(name, d, s, loss))
                rec = train_and_eval(name, d, steps=steps, seed=seed, device=device, on_step=cb)
                out.append(rec)
                if on_record is not None:
                    on_record(rec)
    return out
