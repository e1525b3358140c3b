"""Where a call of :func:`attnlab.training.train` stands: what it set up, its progress, and the
checkpoint that saves both (the training loop's state, passed between its steps)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..devices import rng_state
from ..models.config import ModelConfig
from ..objectives import Objective
from ..tasks import Split, Task
from .checkpoint import write_checkpoint
from .config import TrainConfig

if TYPE_CHECKING:
    from ..distributed.sequence import SequenceParallel

__all__ = ["Run", "copy_weights", "save"]


@dataclass
class Run:
    """One call of :func:`attnlab.training.train`: its setup (``model`` is the one whose weights are
    saved, ``train_model`` the one the steps run: compiled, or DistributedDataParallel's copy; ``sp``:
    the sequence-parallel group or None; ``dp_rank`` / ``dp_world``: the data-parallel place), and
    where the run stands, as each checkpoint saves it."""

    cfg: TrainConfig
    out: Path
    task: Task
    objective: Objective
    mcfg: ModelConfig
    train_split: Split
    model: nn.Module
    opt: torch.optim.Optimizer
    device: torch.device
    precision: str
    total: int
    rank: int
    world: int
    own_group: bool
    sp: SequenceParallel | None
    dp_rank: int
    dp_world: int
    sequence_parallel: int
    best_state: dict
    train_model: nn.Module | None = None
    step: int = 0
    best: float | None = None
    since_best: int = 0
    history: list[dict] = field(default_factory=list)
    resumes: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    spent: float = 0.0  # seconds in optimizer steps, over every call of the run (self-pretraining's included)
    pretrain: dict | None = None  # the self-pretraining phase's record, once run
    flops: int = 0  # FLOPs of one training step, counted once per run


def copy_weights(model: nn.Module) -> dict:
    """A copy of ``model``'s weights (the best so far, kept while training goes on)."""
    return {k: v.clone() for k, v in model.state_dict().items()}


def save(run: Run) -> Path:
    """Write the run's checkpoint (rank 0 only; every rank returns the folder)."""
    state = {"optimizer": run.opt.state_dict(), **rng_state(run.device), "step": run.step, "best": run.best,
             "since_best": run.since_best}
    meta = {"step": run.step, "total_steps": run.total, "history": run.history, "metric": run.task.metric,
            "task_artifacts": run.task.artifacts, "resumes": run.resumes, "losses": run.losses, "world_size": run.world,
            "train_seconds": run.spent, "sequence_parallel": run.sequence_parallel, "precision": run.precision,
            "pretrain": run.pretrain, "flops_per_step": run.flops, "device": str(run.device)}
    if run.sp is not None:  # this process's ring traffic and time, this call's steps and validations
        t = run.sp.timings
        meta["ring"] = {"sent_bytes": t.sent, "wait_seconds": t.wait, "compute_seconds": t.compute, "steps": t.steps}
    if run.rank != 0:
        return run.out / "checkpoint"
    return write_checkpoint(run.out, run.model, run.best_state, run.cfg, run.mcfg, meta, state)
