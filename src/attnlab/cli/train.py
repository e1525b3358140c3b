"""``attnlab train | eval | predict``: train a model on a task, score a checkpoint, predict with it."""

from __future__ import annotations

import json
import os
import time
from typing import Callable, Optional

import typer

from .common import err, fail, out, progress
from .options import blocks_option, heads_option, json_option, plot_option, width_option

__all__ = ["USER_DATA_TASKS", "eval_cmd", "predict", "train"]


def train(
    task: str = typer.Argument(..., help="Task name (pos, recall, listops, ...)."),
    model: Optional[str] = typer.Option(None, help="Backbone: transformer, mlp, window_mlp, graph_transformer, ... (default: the task's, else transformer)."),
    attention: Optional[str] = typer.Option(None, help="Attention variant by name (transformer only; default dense)."),
    positional: Optional[str] = typer.Option(None, help="Positional encoding by name (transformer only; default: the task's)."),
    causal: Optional[bool] = typer.Option(None, "--causal/--bidirectional", help="Causal attention (default: the task's)."),
    steps: Optional[int] = typer.Option(None, min=1, help="Optimizer steps (default: the task's)."),
    epochs: Optional[int] = typer.Option(None, min=1, help="Passes over the training split instead of --steps."),
    seed: int = typer.Option(0, help="Seed of the weights, dropout and example order."),
    out_dir: str = typer.Option("runs/latest", "--out", help="Output folder (its checkpoint/ is written atomically)."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run in --out from its checkpoint."),
    size: Optional[int] = typer.Option(None, min=1, help="Task size knob: training examples."),
    task_option: list[str] = typer.Option([], "--task-option", help="key=value task option (repeatable)."),
    model_option: list[str] = typer.Option([], "--model-option", help="key=value backbone option (repeatable)."),
    attention_option: list[str] = typer.Option([], "--attention-option", help="key=value option of the attention variant, e.g. window=16 (repeatable)."),
    dim: Optional[int] = width_option(None),
    layers: Optional[int] = blocks_option(None),
    heads: Optional[int] = heads_option(None),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", min=1),
    lr: Optional[float] = typer.Option(None, min=0.0),
    eval_every: Optional[int] = typer.Option(None, "--eval-every", min=1, help="Steps between validations and checkpoints."),
    patience: Optional[int] = typer.Option(None, min=1, help="Stop after this many validations without improvement."),
    seconds: Optional[float] = typer.Option(
        None, "--seconds", min=0.1,
        help="Time budget: train this many seconds of training steps, learning rate annealed over them (no step limit unless "
             "--steps, no early stop unless --patience)."),
    sequence_parallel: int = typer.Option(
        1, "--sequence-parallel", min=1,
        help="Under torchrun: P processes share every sequence, each holding 1/P of its positions (ring attention); P divides "
             "the number of processes, the rest is data parallelism."),
    baseline: Optional[bool] = typer.Option(
        None, "--baseline/--no-baseline",
        help="Also train the task's no-attention baseline (same steps, batch, seed; into --out/baseline) and print its score "
             "beside the model's (default: on for your own data: jsonl, graph_files)."),
    as_json: bool = json_option("End by printing one JSON object (task, model, attention, metric, value, seconds, checkpoint; "
                                "baseline: its model and value)."),
) -> None:
    """Train a model on a task with validation, early stopping and atomic checkpoints; --resume continues a run."""
    from ..audio import MissingToolError
    from ..tasks import baseline_model
    from ..training import CheckpointError, train as run_train

    try:
        cfg = _config(
            task, size, task_option, model_option, attention_option, model=model, attention=attention, positional=positional, causal=causal,
            steps=steps, epochs=epochs, seed=seed, dim=dim, layers=layers, heads=heads, batch_size=batch_size, lr=lr,
            eval_every=eval_every, patience=patience, seconds=seconds,
        )
        base_cfg = cfg.baseline() if (baseline if baseline is not None else task in USER_DATA_TASKS and baseline_model(task)) else None
        base_dir = os.path.join(out_dir, "baseline")
        base_resume = resume and os.path.exists(os.path.join(base_dir, "checkpoint", "config.json"))
        if int(os.environ.get("RANK", "0")) > 0:  # torchrun: the other processes train silently (both runs, as rank 0)
            first = run_train(cfg, out_dir, resume=resume, sequence_parallel=sequence_parallel)
            if base_cfg is not None and first.kind != "seq2seq":
                run_train(base_cfg, base_dir, resume=base_resume)
            return
        with progress() as bar:
            meter = _TrainingBar(bar, f"{task} {cfg.model}")
            result = run_train(cfg, out_dir, resume=resume, on_step=meter.on_step, on_eval=meter.on_eval, sequence_parallel=sequence_parallel)
            base = None
            if base_cfg is not None and result.kind != "seq2seq":  # a seq2seq decoder attends whatever its encoder
                meter = _TrainingBar(bar, f"{task} {base_cfg.model} (no attention)")
                base = run_train(base_cfg, base_dir, resume=base_resume, on_step=meter.on_step, on_eval=meter.on_eval)
    except (CheckpointError, ValueError, TypeError, MissingToolError) as e:
        fail(str(e))
    if as_json:
        summary = result.summary()
        if base is not None:
            summary["baseline"] = {"model": base.model, "value": base.value}
        print(json.dumps(summary))
        return
    _show(result, False, lambda r: f"test {r.metric} = {r.value:.4f} after {r.steps} steps, {r.seconds:.0f} s; checkpoint {r.checkpoint}")
    if base is not None:
        from ..objectives import create as objective

        lower = objective(result.kind).lower_is_better
        out.print(f"no-attention baseline ({base.model}): test {base.metric} = {base.value:.4f}; "
                  f"attention {'changes it by' if lower else 'adds'} {result.value - base.value:+.4f}" + (" (lower is better)" if lower else ""))


USER_DATA_TASKS = ("jsonl", "graph_files")
"""Tasks on the user's own data: ``attnlab train`` reports the no-attention baseline by default."""


def _config(task: str, size: Optional[int], task_option: list[str], model_option: list[str], attention_option: list[str], **overrides):
    """The :class:`~attnlab.training.TrainConfig` of ``attnlab train``'s options (None: the task's default)."""
    import dataclasses

    from .. import tasks as task_registry
    from ..training import TrainConfig
    from ..training.config import TIME_BUDGET_STEPS

    if task not in task_registry.names():
        fail(f"unknown task {task!r}; choose one of {', '.join(task_registry.names())}")
    topts = _option_pairs(task_option, "--task-option")
    if size is not None:
        topts["size"] = size
    if topts:
        overrides["task_options"] = topts
    if model_option:
        overrides["model_options"] = _option_pairs(model_option, "--model-option")
    if attention_option:
        overrides["attention_options"] = _option_pairs(attention_option, "--attention-option")
    if overrides["steps"] is not None and overrides["epochs"] is not None:
        fail("give --steps or --epochs, not both")
    timed = overrides.get("seconds") is not None
    if timed and overrides["steps"] is None and overrides["epochs"] is None:
        overrides["steps"] = TIME_BUDGET_STEPS  # the seconds are the limit
    cfg = TrainConfig.for_task(task, **overrides)  # epochs replace the task's default steps there
    if timed and overrides["patience"] is None:
        cfg = dataclasses.replace(cfg, patience=None)  # a time budget runs to its end
    return cfg


def _option_pairs(pairs: list[str], what: str) -> dict:
    """``key=value`` strings -> a dict; values parsed as JSON where they are (numbers, true, lists)."""
    options = {}
    for item in pairs:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            fail(f"{what} takes key=value, got {item!r}")
        try:
            options[key] = json.loads(raw)
        except ValueError:
            options[key] = raw
    return options


class _TrainingBar:
    """The progress bar of one training run: step, loss, the last validation score, steps per second."""

    def __init__(self, bar, label: str):
        self.bar, self.label = bar, label
        self.task = bar.add_task(label, total=None)
        self.start: float | None = None
        self.first_step = 0
        self.val: float | None = None

    def on_step(self, step: int, total: int, loss: float) -> None:
        """After each optimizer step."""
        now = time.perf_counter()
        if self.start is None:
            self.start, self.first_step = now, step
        rate = (step - self.first_step) / max(now - self.start, 1e-9)
        val = "" if self.val is None else f" val={self.val:.4f}"
        self.bar.update(self.task, completed=step, total=total, description=f"{self.label} loss={loss:.4f}{val} {rate:.1f} steps/s")

    def on_eval(self, step: int, val: float) -> None:
        """After each validation."""
        self.val = val


def _show(result, as_json: bool, detail: Callable[[object], str]) -> None:
    """Print a run's result: one JSON object, or ``task / model / attention: detail(result)``."""
    if as_json:
        print(json.dumps(result.summary()))
        return
    out.print(f"{result.task} / {result.model} / {result.attention}: " + detail(result))


def eval_cmd(
    checkpoint: str = typer.Argument(..., help="A checkpoint folder, or the --out folder of 'attnlab train'."),
    split: str = typer.Option("test", help="train, val or test."),
    as_json: bool = json_option("Print one JSON object (task, model, attention, metric, value, seconds, checkpoint)."),
    plot: Optional[str] = plot_option("seq2seq: draw the cross-attention of one decoded example to this PNG."),
    index: int = typer.Option(0, min=0, help="The example of the split that --plot draws."),
) -> None:
    """Score a checkpoint's best weights on a split of its task (and draw a cross-attention map)."""
    from ..training import CheckpointError, cross_attention_example, evaluate

    try:
        result = evaluate(checkpoint, split)
        if plot:
            from ..viz.complexity import plot_cross_attention

            w, src, tgt = cross_attention_example(checkpoint, index, split)
            err.print(f"cross-attention written to {plot_cross_attention(w, src, tgt, plot, title=f'{split} example {index}')}")
    except (CheckpointError, ValueError) as e:
        fail(str(e))
    _show(result, as_json, lambda r: f"{split} {r.metric} = {r.value:.4f} ({r.checkpoint})")


def predict(
    checkpoint: str = typer.Argument(..., help="A checkpoint trained on a jsonl file (attnlab train jsonl --task-option path=...)."),
    input_file: str = typer.Argument(..., metavar="INPUT", help="jsonl with the input field: tokens, text or source."),
    beam: Optional[int] = typer.Option(None, min=1, help="seq2seq: beam search of this width instead of greedy decoding."),
) -> None:
    """Predict with a checkpoint trained on user data; prints one JSON object per input line."""
    from ..tasks.jsonl import read_records
    from ..training import CheckpointError, load_checkpoint, predict as run_predict

    try:
        art = load_checkpoint(checkpoint).meta.get("task_artifacts") or {}
        if "kind" not in art:
            raise CheckpointError(f"{checkpoint} was not trained on user data (attnlab train jsonl): nothing to predict from")
        _, records = read_records(input_file, art["kind"], inputs_only=True)
        for row in run_predict(checkpoint, records, beam_size=beam):
            print(json.dumps(row))
    except (CheckpointError, ValueError) as e:
        fail(str(e))
