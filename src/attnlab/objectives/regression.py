"""``regression``: one value per set (a molecule's logP). Mean squared error; metric: the
coefficient of determination ``R^2 = 1 - SSE / SST`` over the whole split."""

from __future__ import annotations

import torch
from torch import nn

from ..tasks.base import Task
from .base import Objective, batches, model_device, register

__all__ = ["Regression"]


@register("regression")
class Regression(Objective):
    """One value per set: outputs ``(B, 1)``, float labels ``(B,)``."""

    def loss(self, model: nn.Module, inputs: dict, labels: torch.Tensor) -> torch.Tensor:
        """Mean squared error, in float32 or wider (a bfloat16 output is widened, the labels never rounded)."""
        out = model(**inputs).output
        out = out.float() if out.dtype in (torch.bfloat16, torch.float16) else out
        return nn.functional.mse_loss(out.squeeze(-1), labels.to(out.dtype))

    @torch.no_grad()
    def score(self, model: nn.Module, task: Task, split: str, batch_size: int | None = None) -> float:
        """``R^2`` over the split (0 when the labels do not vary)."""
        model.eval()
        preds, wants = [], []
        for inputs, labels in batches(self, task, task.split(split), batch_size, device=model_device(model)):
            preds.append(model(**inputs).output.squeeze(-1).double())
            wants.append(labels.double())
        p, y = torch.cat(preds), torch.cat(wants)
        sst = float(((y - y.mean()) ** 2).sum())
        return 1.0 - float(((p - y) ** 2).sum()) / sst if sst > 0 else 0.0
