"""Self-pretraining, the first phase of a run with ``pretrain_steps``: the token backbone learns
from the training split's own inputs before it is fine-tuned on the labels."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import nn

from ..objectives import collate
from ..tasks import Task
from .config import TrainConfig
from .precision import autocast
from .schedule import batch_indices, learning_rate

__all__ = ["pretrain"]


def pretrain(model: nn.Module, task: Task, cfg: TrainConfig, precision: str,
              on_step: Callable[[int, int, float], None] | None = None, deadline: float | None = None) -> dict:
    """Self-pretraining of ``model``'s token backbone on the training split's inputs
    (:class:`attnlab.objectives.Denoising`): AdamW at the run's learning rate, warm-up then cosine
    decay over ``cfg.pretrain_steps`` (or the budget's ``pretrain_share``, whichever ends first),
    stopping early at ``deadline`` (a :func:`time.perf_counter` reading: ``train``'s ``max_seconds``).
    Returns the phase's record: steps, seconds, mean loss of its first and last ten steps, and the
    validation accuracy of the restored (or next) tokens."""
    from ..objectives.denoising import Denoising, DenoisingModel, token_backbone

    den = DenoisingModel(token_backbone(model))
    objective = Denoising()
    device = next(model.parameters()).device
    opt = torch.optim.AdamW(den.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    data = task.split("train")
    total = cfg.pretrain_steps
    budget = None if cfg.seconds is None else cfg.seconds * cfg.pretrain_share
    warmup = min(cfg.warmup, max(1, total // 10))
    spent, losses, step = 0.0, [], 0
    while step < total and (budget is None or spent < budget) and (deadline is None or time.perf_counter() < deadline):
        t = time.perf_counter()
        den.train()
        inputs, _ = collate(task, data, batch_indices(len(data), cfg.batch_size, cfg.seed + 1, step), objective,
                            device=device)
        for group in opt.param_groups:
            group["lr"] = learning_rate(cfg, step, total, spent, budget, warmup)
        with autocast(precision, device):
            loss = objective.loss(den, inputs)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(den.parameters(), 1.0)
        opt.step()
        step += 1
        spent += time.perf_counter() - t
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(step, total, losses[-1])
    with autocast(precision, device):
        val = objective.score(den, task, "val")
    return {"steps": step, "seconds": spent, "loss_first": sum(losses[:10]) / len(losses[:10]) if losses else None,
            "loss_last": sum(losses[-10:]) / len(losses[-10:]) if losses else None, "val_accuracy": val,
            "causal": den.causal}
