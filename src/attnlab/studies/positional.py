"""Length extrapolation of every positional encoding: train at one length, test at longer ones.

The task is generated here (nothing downloaded): **delayed copy**. A sequence of tokens drawn
uniformly from ``vocab`` symbols; the target at position ``i`` is the token ``delay`` positions
back, ``y_i = x_{i - delay}`` (the first ``delay`` positions have no target and are not
scored). The model is a causal Transformer encoder (token embedding, ``num_layers`` blocks of
causal self-attention and a feed-forward network, a linear read-out), so the answer needs
exactly one thing from the encoding: where position ``i - delay`` is. A model without
positional information cannot tell which earlier token is ``delay`` back other than by
counting through the causal mask; one with a relative encoding sees the offset directly.

Every encoding gets the same model, data stream, seed, optimiser and number of steps; the
model is trained at ``train_length`` and its token accuracy measured on fresh sequences at
each test length (chance is ``1 / vocab``). ``learned`` has no vector past its ``max_len`` (the
training length), so longer tests record the error instead of an accuracy.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from ..core import masks
from ..devices import synchronize
from ..models.encoder import Encoder
from ..positional import base as positional_registry

__all__ = ["Settings", "Result", "DelayedCopy", "run", "train_one", "summarize", "DEFAULT_ENCODINGS"]

DEFAULT_ENCODINGS: dict[str, dict] = {
    "none": {},
    "sinusoidal": {},
    "learned": {},
    "rnn": {},
    "floater": {},
    "relative": {"bidirectional": False},
    "alibi": {},
    "rope": {},
}
"""The encodings measured by default and their options (causal buckets for ``relative``)."""


@dataclass(frozen=True)
class Settings:
    """One benchmark's knobs (all recorded with the results)."""

    train_length: int = 64
    test_lengths: tuple[int, ...] = (64, 128, 256)
    vocab: int = 16
    delay: int = 5
    embed_dim: int = 64
    num_heads: int = 4
    num_layers: int = 2
    batch_size: int = 32
    steps: int = 600
    lr: float = 3e-3
    test_sequences: int = 256
    seeds: tuple[int, ...] = (0, 1, 2)


@dataclass
class Result:
    """One training run's outcome: the final training loss (mean of the last 20 steps), the
    accuracy per test length (None where it could not run, the reason in ``errors``), seconds."""

    encoding: str
    options: dict
    seed: int
    train_loss: float
    accuracy: dict[int, float | None]
    errors: dict[int, str] = field(default_factory=dict)
    train_seconds: float = 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["accuracy"] = {str(k): v for k, v in self.accuracy.items()}
        d["errors"] = {str(k): v for k, v in self.errors.items()}
        return d


class DelayedCopy:
    """The task: ``x`` uniform over ``vocab`` symbols, ``y_i = x_{i - delay}`` (-100 = not scored)."""

    def __init__(self, vocab: int, delay: int):
        if vocab < 2 or delay < 1:
            raise ValueError(f"need vocab >= 2 and delay >= 1, got vocab={vocab}, delay={delay}")
        self.vocab, self.delay = vocab, delay

    def batch(self, size: int, length: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)``, both ``(size, length)`` long."""
        if length <= self.delay:
            raise ValueError(f"length must exceed the delay {self.delay}, got {length}")
        x = torch.randint(0, self.vocab, (size, length), generator=gen)
        y = torch.full_like(x, -100)
        y[:, self.delay :] = x[:, : -self.delay]
        return x, y


class _Model(nn.Module):
    def __init__(self, s: Settings, encoding: str, options: dict):
        super().__init__()
        self.embed = nn.Embedding(s.vocab, s.embed_dim)
        self.encoder = Encoder(
            s.embed_dim,
            s.num_heads,
            s.num_layers,
            positional=encoding,
            positional_options=options or None,
            max_len=s.train_length,
        )
        self.readout = nn.Linear(s.embed_dim, s.vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(self.embed(x), mask=masks.causal()).output
        return self.readout(h)  # (B, N, vocab)


def _accuracy(model: _Model, task: DelayedCopy, s: Settings, length: int, device: str | torch.device = "cpu") -> float:
    gen = torch.Generator().manual_seed(10_000 + length)  # the same test set for every encoding and seed
    correct = total = 0
    with torch.no_grad():
        for start in range(0, s.test_sequences, s.batch_size):
            x, y = (t.to(device) for t in task.batch(min(s.batch_size, s.test_sequences - start), length, gen))
            pred = model(x).argmax(-1)
            scored = y != -100
            correct += int((pred[scored] == y[scored]).sum())
            total += int(scored.sum())
    return correct / total


def train_one(
    encoding: str, options: dict, s: Settings, seed: int = 0, on_step: Callable[[int, float], None] | None = None,
    device: str | torch.device = "cpu",
) -> Result:
    """Train a fresh model with ``encoding`` (initialisation and data from ``seed``) on the
    delayed copy task on ``device`` and test it at every length (weights and data drawn on the
    CPU, then moved: the same draws on every device)."""
    device = torch.device(device)
    torch.manual_seed(seed)
    task = DelayedCopy(s.vocab, s.delay)
    model = _Model(s, encoding, options).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=0.01)
    warmup = max(1, s.steps // 10)

    def lr_at(step: int) -> float:  # linear warm-up, cosine decay
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, s.steps - warmup)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    gen = torch.Generator().manual_seed(seed)  # the same training stream for every encoding
    loss_fn = nn.CrossEntropyLoss(ignore_index=-100)
    t0 = time.perf_counter()
    model.train()
    recent: list[float] = []
    for step in range(s.steps):
        x, y = (t.to(device) for t in task.batch(s.batch_size, s.train_length, gen))
        loss = loss_fn(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        recent = (recent + [loss.item()])[-20:]
        if on_step is not None:
            on_step(step, recent[-1])
    synchronize(device)
    seconds = time.perf_counter() - t0
    model.eval()
    acc: dict[int, float | None] = {}
    errors: dict[int, str] = {}
    for length in s.test_lengths:
        try:
            acc[length] = _accuracy(model, task, s, length, device)
        except ValueError as e:  # learned: no vector past max_len
            acc[length], errors[length] = None, str(e).split(";")[0]
    return Result(encoding, dict(options), seed, sum(recent) / len(recent), acc, errors, seconds)


def run(
    encodings: dict[str, dict] | Iterable[str] | None = None,
    settings: Settings = Settings(),
    on_result: Callable[[Result], None] | None = None,
    on_step: Callable[[str, int, int, float], None] | None = None,
    *,
    device: str | torch.device = "cpu",
) -> list[Result]:
    """Train and test every encoding with every seed of ``settings.seeds`` (default encodings:
    :data:`DEFAULT_ENCODINGS`) on ``device``; one :class:`Result` per run.

    Args:
        encodings: names (default options) or ``{name: options}``.
        settings: the task, model and training knobs.
        on_result: called with each :class:`Result` as soon as it is measured.
        on_step: called with ``(encoding, seed, step, loss)`` after every training step.
    """
    if encodings is None:
        encodings = DEFAULT_ENCODINGS
    if not isinstance(encodings, dict):
        encodings = {name: DEFAULT_ENCODINGS.get(name, {}) for name in encodings}
    known = set(positional_registry.names())
    for name in encodings:
        if name not in known:
            raise ValueError(f"unknown positional encoding {name!r}; choose from {', '.join(sorted(known))}")
    results = []
    for name, options in encodings.items():
        for seed in settings.seeds:
            step_cb = None if on_step is None else (lambda step, loss, _n=name, _s=seed: on_step(_n, _s, step, loss))
            res = train_one(name, options, settings, seed, step_cb, device)
            results.append(res)
            if on_result is not None:
                on_result(res)
    return results


def summarize(results: list[Result]) -> list[dict]:
    """Per encoding: mean, min and max accuracy over its seeds at every test length (None where
    any run could not be tested at that length), the runs' errors and mean training seconds."""
    by_name: dict[str, list[Result]] = {}
    for r in results:
        by_name.setdefault(r.encoding, []).append(r)
    out = []
    for name, runs in by_name.items():
        lengths = list(runs[0].accuracy)
        acc, lo, hi = {}, {}, {}
        for n in lengths:
            vals = [r.accuracy.get(n) for r in runs]
            if any(v is None for v in vals):
                acc[n] = lo[n] = hi[n] = None
            else:
                acc[n], lo[n], hi[n] = sum(vals) / len(vals), min(vals), max(vals)
        errors = {n: e for r in runs for n, e in r.errors.items()}
        out.append(
            {
                "encoding": name,
                "options": runs[0].options,
                "seeds": [r.seed for r in runs],
                "accuracy": acc,
                "accuracy_min": lo,
                "accuracy_max": hi,
                "train_loss": sum(r.train_loss for r in runs) / len(runs),
                "train_seconds": sum(r.train_seconds for r in runs) / len(runs),
                "errors": errors,
            }
        )
    return out
