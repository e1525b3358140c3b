"""``lm``: language modelling, the next token at every position. Cross-entropy over the real
positions; metric: perplexity, ``exp`` of the mean negative log-likelihood per token over the
split (lower is better)."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..models.base import IGNORE, PAD
from ..tasks.base import Task
from .base import Objective, batches, model_device, register

__all__ = ["LanguageModelling"]


@register("lm")
class LanguageModelling(Objective):
    """Tokens ``(B, N)`` -> labels ``(B, N)``: the token after each one (``IGNORE`` where none)."""

    lower_is_better = True

    def trim_labels(self, labels: torch.Tensor, keep: int) -> torch.Tensor:
        """Per-token labels keep the batch's ``keep`` columns."""
        return labels[:, :keep]

    def loss(self, model: nn.Module, inputs: dict, labels: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of the next token (padding and ``IGNORE`` left out)."""
        logits = model(**inputs).output
        return nn.functional.cross_entropy(logits.flatten(0, 1), _scored(labels).flatten(), ignore_index=IGNORE)

    @torch.no_grad()
    def score(self, model: nn.Module, task: Task, split: str, batch_size: int | None = None) -> float:
        """Perplexity over every scored token of the split."""
        model.eval()
        nll, count = 0.0, 0
        for inputs, labels in batches(self, task, task.split(split), batch_size, device=model_device(model)):
            logits = model(**inputs).output
            labels = _scored(labels)
            nll += float(nn.functional.cross_entropy(logits.flatten(0, 1).double(), labels.flatten(),
                                                     ignore_index=IGNORE, reduction="sum"))
            count += int((labels != IGNORE).sum())
        return math.exp(nll / max(count, 1))


def _scored(labels: torch.Tensor) -> torch.Tensor:
    return labels.masked_fill(labels == PAD, IGNORE)
