"""``seq2seq``: a new sequence from a source (translation). Teacher forcing: the decoder reads
BOS then the target and predicts the target then EOS, cross-entropy over real target positions;
metric: exact match of the greedy decoding."""

from __future__ import annotations

import torch
from torch import nn

from ..models.base import BOS, EOS, TGT_PAD
from ..tasks.base import Task
from .base import Objective, batches, model_device, register

__all__ = ["Seq2Seq"]


@register("seq2seq")
class Seq2Seq(Objective):
    """Source tokens ``(B, N)`` -> target ids ``(B, M)`` ending with EOS, padded with ``TGT_PAD``."""

    def trim_labels(self, labels: torch.Tensor, keep: int) -> torch.Tensor:
        """Targets keep the columns any row of the batch uses."""
        return labels[:, : max(int((labels != TGT_PAD).sum(1).max()), 1)]

    def loss(self, model: nn.Module, inputs: dict, labels: torch.Tensor) -> torch.Tensor:
        """Teacher-forced cross-entropy (padding ignored)."""
        tgt_in = torch.cat([torch.full_like(labels[:, :1], BOS), labels[:, :-1]], dim=1)
        logits = model(inputs["tokens"], tgt_in).output
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=TGT_PAD)

    @torch.no_grad()
    def score(self, model: nn.Module, task: Task, split: str, batch_size: int | None = None) -> float:
        """Exact match of the greedy decoding against the target (EOS and padding left out)."""
        model.eval()
        right = total = 0
        for inputs, labels in batches(self, task, task.split(split), batch_size, device=model_device(model)):
            decoded = model.greedy(inputs["tokens"], max_len=labels.shape[1] + 4)
            for row, want in zip(decoded, labels.tolist()):
                right += row == [t for t in want if t not in (TGT_PAD, EOS)]
            total += len(decoded)
        return right / max(total, 1)
