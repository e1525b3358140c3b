"""The training loop: AdamW with warm-up and cosine decay, validation and atomic checkpoints
every ``eval_every`` steps, early stopping, a time budget, resuming, and data parallelism.

The loop knows no kind of output: the task's :class:`attnlab.objectives.Objective` gives the
loss and the metric, :func:`attnlab.objectives.collate` the batches. The order of the training
examples is a function of the seed and the step, and the RNG state is saved, so a run resumed
from a checkpoint continues exactly as the uninterrupted run would have (bitwise on CPU).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .. import objectives
from .. import tasks as task_registry
from ..devices import resolve as resolve_device
from ..devices import set_rng_state
from ..models.base import BACKBONES
from ..models.build import build_model
from ..objectives import collate
from ..profiling import flop_counter, peak_flops
from ..tasks import Task
from . import parallel
from .checkpoint import CheckpointError, load_checkpoint
from .config import TrainConfig, model_config
from .draws import drawn_from
from .precision import autocast, resolve, warn_if_emulated
from .pretraining import pretrain
from .run import Run, copy_weights, save
from .schedule import batch_indices, learning_rate

__all__ = ["BUDGET_FIELDS", "PLACE_FIELDS",
           "ConfigMismatchError", "RunExistsError", "TrainResult", "attention_label", "config_differences", "train"]


@dataclass
class TrainResult:
    """The end of a run: test score with the best weights, and where they are.

    ``step_seconds`` is the time spent in optimizer steps by this call (``steps_run`` of them;
    a resumed run counts only its own), so ``steps_run / step_seconds`` is the training speed.
    ``stopped_by``: ``"steps"``, ``"patience"`` or ``"budget"``. ``kind``: the task's kind.
    ``precision``: the arithmetic it trained in (``fp32`` or ``bf16``, ``auto`` resolved).
    ``flops_per_step``: floating-point operations of one training step (forward and backward,
    counted once per run, during the first step it runs, on that step's batch, by
    :func:`attnlab.profiling.flop_counter`;
    0 when not counted: under torchrun, or with nothing to train);
    ``flop_rate``: those achieved per second of this call's steps; ``peak_fraction``: that rate
    over this machine's peak in the run's precision (:func:`attnlab.profiling.peak_flops`; for bf16 the
    higher of bfloat16's and float32's: where bfloat16 is emulated, the work autocast leaves in float32
    outruns the bfloat16 products, and only float32's peak bounds the rate).
    ``pretrain``: the self-pretraining phase (steps, seconds, mean loss of its first and last ten
    steps, None when it ran none, validation accuracy of the restored tokens), or None.
    ``notes``: the task's lines for the summary (:attr:`attnlab.tasks.Task.notes`).
    ``train_seconds``: the run's seconds of training (self-pretraining and optimizer steps) over
    every call, as its checkpoint records them; ``call_train_seconds``: this call's share of them;
    ``seconds``: this call's, setup, validation and test included. ``device``: where it ran.
    """

    task: str
    model: str
    attention: str
    metric: str
    value: float
    seconds: float
    checkpoint: str
    steps: int
    history: list[dict]
    step_seconds: float = 0.0
    steps_run: int = 0
    stopped_by: str = "steps"
    kind: str = ""
    test_size: int = 0
    test_unit: str = "examples"
    precision: str = "fp32"
    flops_per_step: int = 0
    flop_rate: float | None = None
    peak_fraction: float | None = None
    pretrain: dict | None = None
    notes: list[str] = dataclasses.field(default_factory=list)
    train_seconds: float = 0.0
    call_train_seconds: float = 0.0
    device: str = "cpu"

    def summary(self) -> dict:
        """The JSON object ``attnlab train --json`` prints (``test_size``: the examples, or nodes,
        the score was measured on)."""
        keys = ("task", "model", "attention", "metric", "value", "test_size", "test_unit", "steps", "seconds",
                "checkpoint", "precision", "flop_rate", "peak_fraction", "pretrain", "device")
        return {k: getattr(self, k) for k in keys}


BUDGET_FIELDS = ("steps", "epochs", "seconds", "patience")
PLACE_FIELDS = ("device",)
"""Config fields a resumed run may change besides its budget: where it runs."""
"""The :class:`TrainConfig` fields a resumed run may change: its budget and stopping rule (a finished run extended)."""


class RunExistsError(CheckpointError):
    """The output folder already holds a run, and neither resuming nor replacing it was asked for."""

    def __init__(self, folder: Path, step: int, total: int | None):
        self.folder, self.step, self.total = folder, step, total
        done = f"{step} of {total} steps" if total else f"{step} steps"
        super().__init__(f"{folder} already holds a run ({done}); pass resume=True to continue it, overwrite=True to "
                         "replace it, or another folder")


class ConfigMismatchError(CheckpointError):
    """A resumed run whose config differs from the checkpoint's in more than its budget.

    Attributes:
        differences: ``[(field, value in the checkpoint, value now), ...]``.
    """

    def __init__(self, folder: Path, differences: list[tuple[str, object, object]]):
        self.folder, self.differences = folder, differences
        diff = "; ".join(f"{f}: {old!r} there, {new!r} now" for f, old, new in differences)
        super().__init__(f"{folder} holds a run with other settings ({diff}); resume with the same settings "
                         f"(only {', '.join(BUDGET_FIELDS + PLACE_FIELDS)} may change) or use another folder")


def config_differences(old: TrainConfig, new: TrainConfig,
                       ignore=BUDGET_FIELDS + PLACE_FIELDS) -> list[tuple[str, object, object]]:
    """``[(field, old value, new value), ...]`` where two run configs differ, less ``ignore``."""
    a, b = dataclasses.asdict(old), dataclasses.asdict(new)
    return [(f, a[f], b[f]) for f in a if f not in ignore and a[f] != b[f]]


def attention_label(cfg: TrainConfig) -> str:
    """What the run's summary names as its attention: the variant for attention backbones, the
    backbone's own kind (``"edges"`` for graph attention) otherwise, or ``"none"``."""
    backbone = BACKBONES.get(cfg.model)
    if backbone.uses_attention:
        return cfg.attention
    return getattr(backbone, "attention_kind", "none")


def train(
    cfg: TrainConfig,
    out: str | Path,
    *,
    resume: bool = False,
    on_step: Callable[[int, int, float], None] | None = None,
    on_eval: Callable[[int, float], None] | None = None,
    max_seconds: float | None = None,
    task: Task | None = None,
    sequence_parallel: int = 1,
    overwrite: bool = False,
    on_pretrain_step: Callable[[int, int, float], None] | None = None,
) -> TrainResult:
    """Run (or resume) training; returns the test score of the best validation weights.

    Args:
        cfg: the run. out: the output folder (``checkpoint/`` goes in it).
        resume: continue from ``out``'s checkpoint. Its config must equal ``cfg`` but for the
            budget (:data:`BUDGET_FIELDS`): more steps or seconds extend a finished run, the
            learning rate following the new budget's schedule from the step reached
            (:class:`ConfigMismatchError` names every other difference).
        overwrite: replace a run already in ``out``; without it (or ``resume``) such a run is
            never touched (:class:`RunExistsError`).
        on_step: ``(step, total, loss)`` after each step. on_eval: ``(step, val score)``.
        on_pretrain_step: ``(step, total, loss)`` after each self-pretraining step.
        max_seconds: stop (validate, checkpoint, test) once this call has run this long (setup and
            validation included; ``cfg.seconds`` is the run's own budget of training time).
        task: a task built in Python (e.g. :func:`attnlab.tasks.graphs.task_from_graphs` on
            PyTorch Geometric ``Data`` objects) instead of ``cfg.task`` by name; pass it again to
            resume, and to :func:`evaluate`.
        sequence_parallel: P processes share every sequence (ring attention: each holds 1/P of
            its positions; :mod:`attnlab.distributed`); P must divide the number of processes,
            and the rest is data parallelism (a 2-D mesh: consecutive ranks form a sequence group).

    Data parallel under ``torchrun --nproc-per-node N -m attnlab train ...`` (``WORLD_SIZE > 1``):
    each process trains a ``DistributedDataParallel`` copy on rows ``rank::N`` of every global batch
    (gloo on the CPU, NCCL on CUDA), every process validates and rank 0 alone writes checkpoints; with
    equal shares, and under sequence parallelism, the loss follows the single-process trajectory
    (docs/guides/sequence-parallelism.md).
    """
    t0 = time.perf_counter()
    with _removed_if_left_empty(Path(out)):  # failed or interrupted before its first checkpoint: no empty folder left
        run = _start(cfg, Path(out), task, sequence_parallel, resume=resume, overwrite=overwrite)
        spent_before = run.spent  # a resumed run's seconds of training in earlier calls
        if cfg.pretrain_steps and run.pretrain is None:
            deadline = None if max_seconds is None else t0 + max_seconds
            run.pretrain = pretrain(run.model, run.task, cfg, run.precision, on_pretrain_step, deadline)
            run.spent = run.pretrain["seconds"]
            run.best_state = copy_weights(run.model)
            save(run)  # the pretrained weights survive a crash: a resumed run fine-tunes them
        stopped_by, step_seconds, steps_run = _fine_tune(run, t0, max_seconds, on_step, on_eval)
    folder = save(run) if not (run.out / "checkpoint").exists() else run.out / "checkpoint"
    value = _test(run)
    parallel.finish(run.own_group)
    flops, precision, device = run.flops, run.precision, run.device
    rate = flops * steps_run / step_seconds if flops and step_seconds > 0 else None
    # bf16: its products' or fp32's
    peak = max(peak_flops(p, str(device)) for p in ("float32", precision)) if rate else None
    return TrainResult(run.task.name, cfg.model, attention_label(cfg), run.task.metric, value, time.perf_counter() - t0,
                       str(folder), run.step, run.history, step_seconds, steps_run, stopped_by, run.task.kind,
                       *run.task.split_size("test"), precision=precision, flops_per_step=flops, flop_rate=rate,
                       peak_fraction=rate / peak if rate else None, pretrain=run.pretrain, notes=list(run.task.notes),
                       train_seconds=run.spent, call_train_seconds=run.spent - spent_before, device=str(device))


@contextlib.contextmanager
def _removed_if_left_empty(out: Path):
    """The folders this call creates for ``out`` (it and any missing parent) are removed again
    when setting the run up fails or is interrupted before anything was written into them: a
    failed or interrupted ``train`` leaves no empty output folder behind. Only the process that
    writes the run (rank 0 under torchrun, which creates the folder) removes anything."""
    writer = int(os.environ.get("RANK", "0")) == 0
    new = [p for p in (out, *out.parents) if not p.exists()] if writer else []  # deepest first
    try:
        yield
    except BaseException:
        for folder in new:
            try:
                folder.rmdir()  # only an empty one
            except OSError:
                break
        raise


def _start(cfg: TrainConfig, out: Path, task: Task | None, sequence_parallel: int, *, resume: bool,
           overwrite: bool) -> Run:
    """The setup of a call of :func:`train`: the processes, the checks that leave a run in ``out``
    untouched, the task, the model (seeded) and its optimizer, resumed from ``out``'s checkpoint
    when ``resume``, then compiled or wrapped for parallelism."""
    device = parallel.local_device(resolve_device(cfg.device))
    rank, world, own_group = parallel.process_group(device)
    sp, dp_rank, dp_world = parallel.sequence_groups(rank, world, sequence_parallel)
    if (cfg.pretrain_steps or cfg.compile) and (world > 1 or sp is not None):
        raise ValueError("self-pretraining and compile run in one process: not under torchrun")
    if not resume and not overwrite and (out / "checkpoint" / "config.json").exists():
        meta = load_checkpoint(out).meta  # a damaged one raises CheckpointError: still not overwritten
        raise RunExistsError(out, meta.get("step", 0), meta.get("total_steps"))
    if rank == 0:  # an unwritable --out fails now, not after the first stretch of training
        out.mkdir(parents=True, exist_ok=True)
    ck = load_checkpoint(out, weights="last", with_state=True) if resume else None
    # before the task: a run on another file is this
    if ck is not None and (differences := config_differences(ck.config, cfg)):
        raise ConfigMismatchError(out, differences)
    saved = None if ck is None else ck.meta.get("task_artifacts") or {}
    # resumed: the task the run trained on (the user's file unchanged, its saved tokenizers), never derived anew
    if task is None:
        task = task_registry.create(cfg.task, saved=saved, **cfg.task_options)
    else:
        task_registry.check_saved(task, saved, f"the run in {out}")
    objective = objectives.get(task)
    mcfg = model_config(cfg, task)
    train_split = task.split("train")
    total = cfg.total_steps(len(train_split))
    torch.manual_seed(cfg.seed)
    model = build_model(mcfg).to(device)  # drawn on the CPU: the same initial weights on every device
    precision = resolve(cfg.precision, device)
    warn_if_emulated(cfg.precision, device, stacklevel=4)  # the warning names the line that called train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    run = Run(cfg, out, task, objective, mcfg, train_split, model, opt, device, precision, total, rank, world,
              own_group, sp, dp_rank, dp_world, sequence_parallel, best_state=copy_weights(model))
    if ck is not None:
        _resume(run, ck)
    run.train_model = torch.compile(model) if cfg.compile else model
    if sp is not None:
        from ..distributed.sequence import parallelize

        parallelize(model, sp)
    elif world > 1:
        from torch.nn.parallel import DistributedDataParallel

        run.train_model = DistributedDataParallel(model)
    return run


def _resume(run: Run, ck) -> None:
    """Load ``run.out``'s checkpoint ``ck`` (its last weights, with its state) into ``run``: weights,
    optimizer, random state, progress."""
    run.model.load_state_dict(ck.model.state_dict())
    run.opt.load_state_dict(ck.state["optimizer"])
    set_rng_state(ck.state, run.device)
    run.step, run.best, run.since_best = ck.state["step"], ck.state["best"], ck.state["since_best"]
    run.history = ck.meta.get("history", [])
    run.resumes = ck.meta.get("resumes", []) + [run.step]
    run.losses = ck.meta.get("losses", [])
    run.spent = ck.meta.get("train_seconds", 0.0)
    run.pretrain = ck.meta.get("pretrain")
    # the run keeps its arithmetic, wherever it resumes (auto resolved once)
    run.precision = ck.meta.get("precision") or run.precision
    run.flops = ck.meta.get("flops_per_step", 0)
    run.best_state = load_checkpoint(run.out, weights="best").model.state_dict()


def _fine_tune(run: Run, t0: float, max_seconds: float | None, on_step: Callable[[int, int, float], None] | None,
               on_eval: Callable[[int, float], None] | None) -> tuple[str, float, int]:
    """The steps on the task's labels until the steps, the patience or a time budget run out,
    validating (and saving) every ``eval_every`` steps and at the end. Returns what stopped it, and
    this call's seconds in steps and number of steps."""
    cfg = run.cfg
    pre_seconds = run.pretrain["seconds"] if run.pretrain else 0.0
    # fine-tuning's share of the time budget
    budget = None if cfg.seconds is None else max(cfg.seconds - pre_seconds, 1e-9)
    stopped = cfg.seconds is not None and run.spent >= cfg.seconds  # resumed after its budget ran out: nothing to train
    stopped_by = "budget" if stopped else "steps"
    step_seconds, steps_run = 0.0, 0
    while run.step < run.total and not stopped:
        t_step = time.perf_counter()
        loss = _step(run, learning_rate(cfg, run.step, run.total, run.spent - pre_seconds, budget))
        steps_run += 1
        took = time.perf_counter() - t_step
        over_budget = max_seconds is not None and time.perf_counter() - t0 >= max_seconds
        # the global loss, one step time (the slowest) and one decision about the budget for all processes
        if run.world > 1:
            loss, over_budget, took = parallel.agree(loss, over_budget, took, run.world)
        step_seconds += took
        run.spent += took  # the same on every process: the learning rate follows it
        over_budget = over_budget or (cfg.seconds is not None and run.spent >= cfg.seconds)
        run.losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(run.step, run.total, float(loss.detach()))
        if run.step % cfg.eval_every == 0 or run.step == run.total or over_budget:
            stop = _validate(run, loss, over_budget, on_eval)
            if stop is not None:
                stopped, stopped_by = True, stop
    return stopped_by, step_seconds, steps_run


def _step(run: Run, lr: float) -> torch.Tensor:
    """One optimizer step at learning rate ``lr`` on the step's batch (this process's share of it);
    counts the FLOPs of the run's first step. Returns the loss."""
    model, opt = run.model, run.opt
    model.train()
    idx = batch_indices(len(run.train_split), run.cfg.batch_size, run.cfg.seed, run.step)
    if run.dp_world > 1:
        idx = idx[run.dp_rank :: run.dp_world]  # this process's share of the global batch (its sequence group's)
    inputs, labels = collate(run.task, run.train_split, idx, run.objective, device=run.device)
    for group in opt.param_groups:
        group["lr"] = lr
    opt.zero_grad(set_to_none=True)
    # one process (its rate is over its own peak): the first step it runs is counted, eagerly
    count = not run.flops and run.world == 1
    with flop_counter() if count else contextlib.nullcontext() as counter:
        with autocast(run.precision, run.device):
            loss = run.objective.loss(model if count else run.train_model, inputs, labels)
        loss.backward()
    if count:
        run.flops = int(counter.get_total_flops())
    if run.sp is not None:
        parallel.average_gradients(model, run.world)
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    run.step += 1
    return loss


def _validate(run: Run, loss: torch.Tensor, over_budget: bool,
              on_eval: Callable[[int, float], None] | None) -> str | None:
    """Score the validation split, keep the best weights, save; returns what stops the run now
    (``"patience"``, ``"budget"``), or None."""
    with autocast(run.precision, run.device):
        val = run.objective.score(run.model, run.task, "val")
    run.history.append({"step": run.step, "val": val, "loss": float(loss.detach()), "seconds": run.spent})
    if run.objective.better(val, run.best):
        run.best, run.since_best = val, 0
        run.best_state = copy_weights(run.model)
    else:
        run.since_best += 1
    if on_eval is not None:
        on_eval(run.step, val)
    stop = None
    if run.cfg.patience is not None and run.since_best >= run.cfg.patience:
        stop = "patience"
    if over_budget:
        stop = "budget"
    save(run)
    return stop


def _test(run: Run) -> float:
    """The test score of the best validation weights (under sequence parallelism the test sequences
    are sharded too: no process holds a whole one)."""
    best_model = build_model(run.mcfg).to(run.device)
    best_model.load_state_dict(run.best_state)
    if run.sp is not None:
        from ..distributed.sequence import parallelize

        parallelize(best_model, run.sp)
    with drawn_from(run.cfg.seed), autocast(run.precision, run.device):  # eval's score of the same weights
        value = run.objective.score(best_model, run.task, "test")
    if run.sp is not None:
        parallelize(best_model, None)
    return value
