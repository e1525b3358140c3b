"""``attnlab train | eval | predict``: train a model on a task, score a checkpoint, predict with it."""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Callable

import typer
from rich.markup import escape

from .common import err, out, output_folder, print_json, progress, refuse_overwrite
from .errors import device_or_fail, fail, usage_error
from .options import choices, device_option, gathered, json_option, plain, plot_option
from .tables import on_device
from .train_options import DEVICE, EVALUATION, OUTPUT, RUN_OPTIONS, TASK, TASK_HELP, TaskName, task_options
from .training_bar import TrainingBar, interrupted_message

__all__ = ["USER_DATA_TASKS", "Split", "eval_cmd", "predict", "train"]

Split = choices("Split", ("train", "val", "test"), "``eval --split``: the split scored.")


@gathered(RUN_OPTIONS, into="settings")
def train(
    task: TaskName = typer.Argument(..., metavar="TASK", show_choices=False, help=TASK_HELP),
    extra: list[str] | None = typer.Argument(None, hidden=True),
    data: str | None = typer.Option(
        None, "--data", metavar="FILE", rich_help_panel=TASK,
        help="Your own data, for a task that reads it (jsonl's file, wav_folder's folder)."),
    baseline: bool | None = typer.Option(
        None, "--baseline/--no-baseline", rich_help_panel=EVALUATION,
        help="Also train the no-attention baseline (default: on for jsonl and graph_files)."),
    out_dir: str = typer.Option("runs/latest", "--out", metavar="DIR", rich_help_panel=OUTPUT,
                                help="Output folder (its checkpoint/ is written atomically)."),
    resume: bool = typer.Option(False, "--resume", rich_help_panel=OUTPUT,
                                help="Continue the run in --out; more --steps or --seconds extend a finished one."),
    force: bool = typer.Option(False, "--force", rich_help_panel=OUTPUT, help="Replace a run already in --out."),
    as_json: bool = json_option("End by printing one JSON object: the score, the run and its warnings.", panel=OUTPUT),
    sequence_parallel: int = typer.Option(1, "--sequence-parallel", min=1, rich_help_panel=DEVICE,
                                          help="Under torchrun: P processes share every sequence (ring attention)."),
    settings: dict | None = None,
) -> None:
    """Train a model on a task with validation, early stopping and atomic checkpoints.

    A run already in --out is never overwritten: --resume continues it (more --steps or --seconds
    extend a finished one), --force replaces it.
    """
    from ..tasks import baseline_model

    if resume and force:
        usage_error("--resume continues the run in --out and --force replaces it: give one of them, not both")
    output_folder("--out", out_dir)
    run = dict(settings or {})
    given = [task_options(task, run.pop("task_option")), run.pop("model_option"), run.pop("attention_option")]
    cfg = _config(task, run.pop("size"), [*given[0], *_data_option(task, data, given[0], extra)], given[1], given[2],
                  previous=_previous_run(out_dir, task) if resume else None, **run)
    device_or_fail(cfg.device)
    base_cfg = cfg.baseline() if (baseline if baseline is not None
                                  else task in USER_DATA_TASKS and baseline_model(task)) else None
    done = _run(task, cfg, base_cfg, out_dir, resume=resume, force=force, sequence_parallel=sequence_parallel,
                baseline=baseline)
    if done is not None:
        _summary(*done, cfg, resume=resume, as_json=as_json)


def _run(task: str, cfg, base_cfg, out_dir: str, *, resume: bool, force: bool, sequence_parallel: int,
         baseline: bool | None):
    """Train ``cfg`` into ``out_dir`` (and the baseline ``base_cfg`` into its ``baseline/``) with
    progress bars; ``(result, the baseline's or None)``, None on another process of torchrun's."""
    from ..training import ConfigMismatchError, RunExistsError
    from ..training import train as run_train

    base_dir = os.path.join(out_dir, "baseline")
    base_resume = resume and os.path.exists(os.path.join(base_dir, "checkpoint", "config.json"))
    phases: list = []  # the runs started: (folder, bar, self-pretraining's bar)
    try:
        # torchrun: the other processes train silently (both runs, as rank 0)
        if int(os.environ.get("RANK", "0")) > 0:
            first = run_train(cfg, out_dir, resume=resume, sequence_parallel=sequence_parallel, overwrite=force)
            if base_cfg is not None and first.kind != "seq2seq":
                run_train(base_cfg, base_dir, resume=base_resume, overwrite=force)
            return None
        with progress() as bar:
            meter = TrainingBar(bar, f"{task} {cfg.model}", cfg.seconds, notice=not cfg.pretrain_steps)
            pre = TrainingBar(bar, f"{task} {cfg.model} self-pretraining") if cfg.pretrain_steps else None
            phases.append((out_dir, meter, pre))
            result = run_train(cfg, out_dir, resume=resume, on_step=meter.on_step, on_eval=meter.on_eval,
                               sequence_parallel=sequence_parallel, overwrite=force,
                               on_pretrain_step=pre.on_step if pre else None)
            base = None
            if base_cfg is not None and result.kind != "seq2seq":  # a seq2seq decoder attends whatever its encoder
                meter = TrainingBar(bar, f"{task} {base_cfg.model} (no attention)", base_cfg.seconds)
                phases.append((base_dir, meter, None))
                base = run_train(base_cfg, base_dir, resume=base_resume, on_step=meter.on_step, on_eval=meter.on_eval,
                                 overwrite=force)
        return result, base
    except KeyboardInterrupt:
        if not phases:  # another process of torchrun's, or before training began: nothing to say
            raise typer.Exit(130) from None
        folder, meter, pre = phases[-1]
        again = f"attnlab train {task} --out {shlex.quote(out_dir)} --resume" + (
            "" if baseline is None else " --baseline" if baseline else " --no-baseline")
        err.print(interrupted_message(folder, meter, pre, baseline=folder != out_dir, again=again), markup=False,
                  highlight=False, soft_wrap=True)
        raise typer.Exit(130) from None
    except ConfigMismatchError as e:
        fail(_mismatch_message(out_dir, e))
    except RunExistsError as e:
        fail(_exists_message(e.folder, e.step, e.total))
    finally:  # ended, failed or interrupted: no notice of a setup comes after it
        for _, *bars in phases:
            for b in bars:
                if b is not None:
                    b.close()


def _summary(result, base, cfg, *, resume: bool, as_json: bool) -> None:
    """The run's score, its baseline's beside it, and its caveats (or one JSON object)."""
    caveats = _caveats(result, cfg)
    if resume and result.steps_run == 0:
        caveats.append(f"nothing was trained: the run had already reached its budget ({result.steps} steps); give "
                       "more --steps or --seconds to extend it")
    if as_json:
        summary = {**result.summary(), "train_seconds": result.train_seconds,
                   "call_train_seconds": result.call_train_seconds, "warnings": caveats}
        if base is not None:
            summary["baseline"] = {"model": base.model, "value": base.value}
        if result.notes:
            summary["notes"] = result.notes
        print_json(summary)
        return
    if result.pretrain:
        p = result.pretrain
        # None: no step before the deadline
        loss = "-" if p["loss_first"] is None else f"{p['loss_first']:.3f} -> {p['loss_last']:.3f}"
        out.print(f"self-pretraining: {p['steps']} steps, {p['seconds']:.0f} s, "
                  f"{'next' if p['causal'] else 'masked'}-token loss {loss}, validation accuracy "
                  f"{p['val_accuracy']:.3f}", highlight=False)
    _show(result, lambda r: f"test {r.metric} = {r.value:.4f} on {r.test_size} {r.test_unit}, after {r.steps} steps, "
                            f"{_seconds(r, resume)}{on_device(r.device)}; {_utilisation(r)}checkpoint {r.checkpoint}")
    for note in result.notes:  # the task's: what it chose from the data (a tokenizer), a majority label's score
        out.print(note, highlight=False, soft_wrap=True, markup=False)
    if base is not None:
        from ..objectives import create as objective

        lower = objective(result.kind).lower_is_better
        out.print(f"no-attention baseline ({base.model}): test {base.metric} = {base.value:.4f} on the same "
                  f"{base.test_size} {base.test_unit}; attention {'changes it by' if lower else 'adds'} "
                  f"{result.value - base.value:+.4f}" + (" (lower is better)" if lower else ""), highlight=False)
    for c in caveats:
        err.print(f"[yellow]warning:[/] {escape(c)}", soft_wrap=True, highlight=False)


def _data_option(task: str, data: str | None, task_option: list[str], extra: list[str] | None) -> list[str]:
    """``--data FILE`` as the ``--task-option`` it stands for: the one option naming the task's file
    (:func:`attnlab.tasks.data_files`; jsonl's ``path``), or a one-line error for a task that reads
    no file or several, when the option is also given, or for a file given after the task
    (``extra``: ``attnlab train jsonl FILE``)."""
    from .. import tasks as task_registry

    if extra:
        usage_error(f"unexpected {' '.join(extra)!r} after the task: give your data as --data {shlex.quote(extra[0])} "
             f"(attnlab train {task} --data FILE)")

    if data is None or task not in task_registry.names():
        return []
    files = getattr(task_registry.TASKS.get(task), "files", ())
    if len(files) != 1:
        usage_error(f"--data: the task {task!r} reads " + ("no file of yours (its data is generated)" if not files else
             f"several files: give each as --task-option {', '.join(f + '=FILE' for f in files)}"))
    if any(o.partition("=")[0] == files[0] for o in task_option):
        usage_error(f"--data and --task-option {files[0]}=... both name the file: give it once, as --data FILE")
    return [f"{files[0]}={data}"]


def _seconds(r, resume: bool) -> str:
    """The run's seconds of training, as its checkpoint records them (``"T s of training"``); resumed,
    this call's too (``"T s of training in all, C s in this call"``)."""
    if not resume:
        return f"{r.train_seconds:.1f} s of training"
    return f"{r.train_seconds:.1f} s of training in all, {r.call_train_seconds:.1f} s in this call"


def _utilisation(r) -> str:
    """``"bf16, 23.4 GFLOP/s (6% of peak); "``: the run's precision and how much of the machine it used."""
    if not r.flop_rate:
        return f"{r.precision}; "
    return f"{r.precision}, {r.flop_rate / 1e9:.1f} GFLOP/s ({100 * r.peak_fraction:.0f}% of this machine's peak); "


def _caveats(result, cfg) -> list[str]:
    """The warnings a run's score deserves (:mod:`attnlab.training.caveats`)."""
    from ..training.caveats import few_steps, tiny_test

    return [c for c in (tiny_test(result.test_size, result.test_unit),
                        few_steps(result.steps, cfg.seconds is not None)) if c]


FLAGS = {
    "task": "TASK", "task_options": "--task-option/--size", "model": "--model", "attention": "--attention",
    "positional": "--positional", "causal": "--causal/--bidirectional", "embed_dim": "--embed-dim",
    "num_heads": "--num-heads", "num_layers": "--num-layers", "model_options": "--model-option",
    "attention_options": "--attention-option", "batch_size": "--batch-size", "lr": "--lr", "seed": "--seed",
    "eval_every": "--eval-every", "steps": "--steps", "epochs": "--epochs", "seconds": "--seconds",
    "patience": "--patience", "precision": "--precision", "compile": "--compile", "pretrain_steps": "--pretrain-steps",
    "pretrain_share": "--pretrain-share", "device": "--device",
}
"""The command-line spelling of each :class:`~attnlab.training.TrainConfig` field (others have no flag)."""


def _previous_run(out_dir: str, task: str):
    """``--resume``: the :class:`~attnlab.training.TrainConfig` of the run in ``out_dir`` (its options are
    the defaults of the resumed run), or a one-line error when there is none or it is another task's."""
    from ..training import load_checkpoint

    cfg = load_checkpoint(out_dir).config  # none, or damaged: CheckpointError, one line at the boundary
    if cfg.task != task:
        fail(f"--out {out_dir} holds a run of task {cfg.task!r}, not {task!r}: resume it as "
             f"'attnlab train {cfg.task} --out {out_dir} --resume'")
    return cfg


def _exists_message(folder, step: int, total) -> str:
    state = "a finished run" if total and step >= total else "an unfinished run"
    done = f"{step} of {total} steps" if total else f"{step} steps"
    return (f"--out {folder} already holds {state} ({done}); add --resume to continue it (more --steps or --seconds "
            "extend it), --force to replace it, or choose another --out")


def _mismatch_message(out_dir: str, e) -> str:
    diff = "; ".join(f"{FLAGS.get(f, f)}: {_show_value(old)} there, {_show_value(new)} now"
                     for f, old, new in e.differences)
    return (f"--out {out_dir} holds a run with other options ({diff}); resume without them (the run's own are kept; "
            "only --steps, --epochs, --seconds and --patience may change), --force to replace the run, or choose "
            "another --out")


def _show_value(v) -> str:
    return json.dumps(v) if isinstance(v, (dict, list)) else str(v)


USER_DATA_TASKS = ("jsonl", "graph_files")
"""Tasks on the user's own data: ``attnlab train`` reports the no-attention baseline by default."""


def _config(task: str, size: int | None, task_option: list[str], model_option: list[str],
            attention_option: list[str], *, previous=None, **overrides):
    """The :class:`~attnlab.training.TrainConfig` of ``attnlab train``'s options (None: the task's
    default, or with ``previous``, a resumed run's config, that run's own value), its option keys
    checked against what the task, backbone and attention variant take."""
    import dataclasses

    from .. import efficient
    from .. import tasks as task_registry
    from ..models.base import BACKBONES
    from ..training import TrainConfig
    from ..training.config import time_budget

    topts = _option_pairs(task_option, "--task-option")
    if size is not None:
        topts["size"] = size
    given = {"task_options": topts, "model_options": _option_pairs(model_option, "--model-option"),
             "attention_options": _option_pairs(attention_option, "--attention-option")}
    if overrides["steps"] is not None and overrides["epochs"] is not None:
        usage_error("give --steps or --epochs, not both")
    if previous is not None:  # the resumed run's own options, then those given now
        # a run resumes where it is resumed, not where it began
        values = {**dataclasses.asdict(previous), "device": "auto"}
        values.update({k: v for k, v in overrides.items() if v is not None})
        for k, v in given.items():
            values[k] = {**values[k], **v}
        if overrides["epochs"] is not None and overrides["steps"] is None:
            values["steps"] = None
        elif overrides["steps"] is not None and overrides["epochs"] is None:
            values["epochs"] = None
        cfg = TrainConfig(**time_budget(values, overrides))
    else:
        # epochs replace the task's default steps
        cfg = TrainConfig.for_task(task, **overrides, **{k: v for k, v in given.items() if v})
    from .. import positional as encodings

    for flag, name, known in (("--model", cfg.model, BACKBONES.names()),
                              ("--attention", cfg.attention, efficient.names()),
                              ("--positional", cfg.positional, encodings.names())):
        if name not in known:
            usage_error(f"unknown {flag} {name!r}; choose one of {', '.join(known)}")
    task_registry.TASKS.check_options(task, given["task_options"], what="--task-option")
    if cfg.model in BACKBONES:
        BACKBONES.check_options(cfg.model, given["model_options"], what="--model-option", hidden=_SET_BY_FLAGS)
    for what, opts in (("--model-option", given["model_options"]), ("--attention-option", given["attention_options"])):
        fixed = sorted(set(opts) & set(_SET_BY_FLAGS))
        if fixed:
            usage_error(f"{what} {', '.join(fixed)}: set by the model from its own flags (--embed-dim, --num-heads, "
                        "--num-layers, --attention, --positional, --causal) and the task, not as an option")
    if cfg.attention in efficient.names() and given["attention_options"]:
        if cfg.attention in ("dense", "dense_naive"):
            usage_error(f"--attention-option: the {cfg.attention} attention takes none (its score and normaliser are "
                        "--model-option score=... / normalize=...); the efficient variants take them "
                        "('attnlab list variants')")
        efficient.VARIANTS.check_options(cfg.attention, given["attention_options"], what="--attention-option",
                                         hidden=_SET_BY_FLAGS)
    return cfg


_SET_BY_FLAGS = ("vocab_size", "dim", "embed_dim", "feature_dim", "edge_dim", "num_heads", "num_layers", "attention",
                 "attention_options", "positional", "causal", "max_len", "image_size", "kdim", "vdim",
                 "positional_options")
"""Backbone and attention options set by their own flags (--embed-dim, --num-heads, --num-layers, --attention, ...)
or by the task (``dim``: the width's earlier name, refused as well)."""


def _option_pairs(pairs: list[str], what: str) -> dict:
    """``key=value`` strings -> a dict; values parsed as JSON where they are (numbers, true, lists)."""
    options = {}
    for item in pairs:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            usage_error(f"{what} takes key=value, got {item!r}")
        try:
            options[key] = json.loads(raw)
        except ValueError:
            options[key] = raw
    return options


def _show(result, detail: Callable[[object], str]) -> None:
    """Print ``task / model / attention: detail(result)``."""
    out.print(f"{result.task} / {result.model} / {result.attention}: " + detail(result), highlight=False,
              soft_wrap=True)


def eval_cmd(
    checkpoint: str = typer.Argument(
        ..., metavar="DIR", help="A checkpoint folder, or the --out folder of 'attnlab train'."),
    split: Split = typer.Option(Split.test, help="The split scored."),
    as_json: bool = json_option("Print one JSON object: the score, the split and its warnings."),
    plot: str | None = plot_option("seq2seq: draw the cross-attention of one decoded example to this PNG."),
    index: int | None = typer.Option(
        None, min=0, help="The example of the split that --plot draws (default 0); needs --plot."),
    device: str = device_option(),
) -> None:
    """Score a checkpoint's best weights on a split of its task (and draw a cross-attention map)."""
    from ..training import CheckpointError, cross_attention_example, evaluate
    from ..training.caveats import tiny_test
    from ..training.inference import split_summary

    split = plain(split)
    if index is not None and not plot:
        usage_error(f"--index picks the example --plot draws: give --plot FILE.png with --index {index}, "
                    "or leave --index out")
    where = device_or_fail(device)
    try:
        result = evaluate(checkpoint, split, device=where)
        if plot:
            from ..viz.complexity import plot_cross_attention

            index = index or 0
            w, src, tgt = cross_attention_example(checkpoint, index, split)
            err.print("cross-attention written to "
                      f"{plot_cross_attention(w, src, tgt, plot, title=f'{split} example {index}')}")
    except (CheckpointError, ValueError) as e:
        fail(e)
    caveat = tiny_test(result.test_size, result.test_unit, split)
    if as_json:
        # the evaluation's
        summary = {("eval_seconds" if k == "seconds" else k): v for k, v in split_summary(result, split).items()}
        print_json({**summary, "split": split, "warnings": [caveat] if caveat else []})
        return
    _show(result, lambda r: f"{split} {r.metric} = {r.value:.4f} on {r.test_size} {r.test_unit} ({r.checkpoint})")
    if caveat:
        err.print(f"[yellow]warning:[/] {escape(caveat)}", soft_wrap=True, highlight=False)


def predict(
    checkpoint: str = typer.Argument(..., metavar="DIR",
                                     help="A checkpoint trained on a jsonl file (attnlab train jsonl --data FILE)."),
    input_file: str = typer.Argument(
        ..., metavar="INPUT", help="jsonl with the input field: tokens, text or source (labels optional)."),
    beam: int | None = typer.Option(None, min=1, help="seq2seq: beam search of this width instead of greedy decoding."),
    output: str | None = typer.Option(
        None, "-o", "--output", metavar="FILE", help="Write the JSON lines here instead of stdout."),
    force: bool = typer.Option(False, "--force", help="With -o: replace an existing file."),
    as_json: bool = json_option("JSON lines on stdout (the default output; the accuracy line goes to stderr)."),
    device: str = device_option(),
) -> None:
    """Predict with a checkpoint trained on user data: each input line again, with its "prediction".

    Output: JSON lines, one per input line, every field of the input kept (a label too) and the
    model's "prediction" beside it. When the input has labels, the accuracy is printed on stderr.
    """

    from ..tasks.jsonl import read_records
    from ..training import CheckpointError, load_checkpoint, prediction_accuracy
    from ..training import predict as run_predict
    from ..training.inference import unseen_labels

    refuse_overwrite("-o", output, force)
    where = device_or_fail(device)
    try:
        art = load_checkpoint(checkpoint).meta.get("task_artifacts") or {}
        if "kind" not in art:
            raise CheckpointError(f"{checkpoint} was not trained on user data (attnlab train jsonl): nothing to "
                                  "predict from")
        _, records = read_records(input_file, art["kind"], inputs_only=True)
        rows = run_predict(checkpoint, records, beam_size=beam, device=where)
    except (CheckpointError, ValueError) as e:
        fail(e)
    if output:
        from .common import write_text

        write_text(output, "".join(json.dumps(r) + "\n" for r in rows))
        err.print(f"{len(rows)} predictions written to {output}", highlight=False)
    else:
        for row in rows:
            print_json(row)
    scored = prediction_accuracy(art, rows)
    unseen = unseen_labels(art, rows)
    if unseen:
        err.print(f"[yellow]warning:[/] {len(unseen)} label(s) of the input the model never saw in training, never "
                  f"predicted and so counted wrong: {escape(', '.join(unseen))}", highlight=False, soft_wrap=True)
    if scored is not None:
        right, total, unit = scored
        err.print(f"accuracy {right / max(total, 1):.4f} ({right} of {total} {unit} right, against the input's labels)",
                  highlight=False)
