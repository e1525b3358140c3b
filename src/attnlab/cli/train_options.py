"""The settings of ``attnlab train``: what the run trains and how (the options of its
:class:`~attnlab.training.TrainConfig`), declared once, away from the command's body; the command
receives them as one dict (:func:`attnlab.cli.options.gathered`)."""

from __future__ import annotations

import typing

import typer

from .. import efficient
from .. import positional as encodings
from .. import tasks as task_registry
from ..models.base import BACKBONES
from .errors import usage_error
from .options import (
    Precision,
    blocks_option,
    device_option,
    heads_option,
    one_of,
    option,
    precision_option,
    width_option,
)

__all__ = ["ATTENTION", "DEVICE", "EVALUATION", "MODEL", "OUTPUT", "RUN_OPTIONS", "TASK", "TASK_HELP", "TRAINING",
           "TaskName", "task_options"]

TASK, MODEL, ATTENTION, TRAINING, EVALUATION, DEVICE, OUTPUT = (
    "Task", "Model", "Attention", "Training", "Evaluation", "Device & speed", "Output & resume")
"""The panels of ``attnlab train --help``, in the order it shows them: what is learnt, the network,
its attention, the optimisation, validation and the baseline, where and how fast it runs, the run's
folder (:class:`attnlab.cli.options.PanelledCommand`)."""

TaskName = one_of(task_registry.names())
"""``TASK``: a registered task (``attnlab list tasks``)."""

TASK_HELP = f"The task: {', '.join(task_registry.names())}."
"""``TASK``'s help: the tasks by name."""

_INT, _FLOAT, _BOOL = typing.Optional[int], typing.Optional[float], typing.Optional[bool]  # noqa: UP045
_STR, _LIST = typing.Optional[str], list[str]  # noqa: UP045


def _choice(panel: str, what: str, names: list[str]):
    """``NAME``, one of ``names``: the option's annotation and its help (``what``, then the names)."""
    return typing.Optional[one_of(names)], typer.Option(  # noqa: UP045
        None, metavar="NAME", rich_help_panel=panel, help=f"{what}: {', '.join(names)}.")


def _pairs(flag: str, panel: str, help: str):
    """A repeatable ``KEY=VALUE`` option."""
    return typer.Option([], flag, metavar="KEY=VALUE", rich_help_panel=panel, help=help)


RUN_OPTIONS = [
    option("size", _INT, typer.Option(None, min=1, rich_help_panel=TASK,
                                      help="Training examples (the task's size knob).")),
    option("task_option", _LIST, _pairs("--task-option", TASK,
                                        "A task option, repeatable; TASK.KEY=VALUE is taken too.")),
    option("model", *_choice(MODEL, "Backbone (default: the task's)", BACKBONES.names())),
    option("model_option", _LIST, _pairs("--model-option", MODEL, "A backbone option, repeatable.")),
    option("embed_dim", _INT, width_option(None, "Model width E (default: the task's, else 64).", panel=MODEL)),
    option("num_layers", _INT, blocks_option(None, "Blocks (default: the task's, else 2).", panel=MODEL)),
    option("num_heads", _INT, heads_option(None, "Attention heads, dividing --embed-dim (default: the task's, else 4).",
                                           panel=MODEL)),
    option("positional", *_choice(MODEL, "Positional encoding (default: the task's)", encodings.names())),
    option("attention", *_choice(ATTENTION, "Attention variant (default dense)", efficient.names())),
    option("attention_option", _LIST, _pairs("--attention-option", ATTENTION,
                                             "An option of the attention variant, e.g. window=16, repeatable.")),
    option("causal", _BOOL, typer.Option(None, "--causal/--bidirectional", rich_help_panel=ATTENTION,
                                         help="Causal attention or not (default: the task's).")),
    option("steps", _INT, typer.Option(None, min=1, rich_help_panel=TRAINING,
                                       help="Optimizer steps (default: the task's).")),
    option("epochs", _INT, typer.Option(None, min=1, rich_help_panel=TRAINING,
                                        help="Passes over the training split instead of --steps.")),
    option("seconds", _FLOAT, typer.Option(
        None, "--seconds", min=0.1, rich_help_panel=TRAINING,
        help="Time budget: train this many seconds, the learning rate annealed over them.")),
    option("batch_size", _INT, typer.Option(None, "--batch-size", min=1, rich_help_panel=TRAINING,
                                            help="Examples per optimizer step (default: the task's).")),
    option("lr", _FLOAT, typer.Option(None, min=0.0, rich_help_panel=TRAINING,
                                      help="Peak learning rate of AdamW (default: the task's).")),
    option("seed", _INT, typer.Option(None, rich_help_panel=TRAINING,
                                      help="Seed of the weights, dropout and example order (default 0).")),
    option("pretrain_steps", _INT, typer.Option(
        None, "--pretrain-steps", min=0, rich_help_panel=TRAINING,
        help="Self-pretraining steps on the task's inputs before its labels (default 0).")),
    option("pretrain_share", _FLOAT, typer.Option(
        None, "--pretrain-share", min=0.01, max=0.99, rich_help_panel=TRAINING,
        help="Under --seconds: the most of it self-pretraining may take (default 0.5).")),
    option("eval_every", _INT, typer.Option(None, "--eval-every", min=1, rich_help_panel=EVALUATION,
                                            help="Steps between validations and checkpoints.")),
    option("patience", _INT, typer.Option(None, min=1, rich_help_panel=EVALUATION,
                                          help="Stop after this many validations without improvement.")),
    option("device", _STR, device_option(None, panel=DEVICE)),
    option("precision", typing.Optional[Precision], precision_option(None, panel=DEVICE)),  # noqa: UP045
    option("compile", _BOOL, typer.Option(None, "--compile/--no-compile", rich_help_panel=DEVICE,
                                          help="Run the training forward through torch.compile.")),
]
"""``attnlab train``'s settings of the run (the :class:`~attnlab.training.TrainConfig` it builds;
None: the task's default, or a resumed run's own value)."""


def task_options(task: str, given: list[str]) -> list[str]:
    """``--task-option`` as ``KEY=VALUE``: the arena's ``TASK.KEY=VALUE`` (``lookup.keys=32``) with
    ``TASK`` the task trained loses its prefix; a prefix naming another task is a usage error."""
    keys = []
    for item in given:
        key, sep, value = item.partition("=")
        prefix, dot, rest = key.partition(".")
        if sep and dot and prefix == task:
            item = f"{rest}={value}"
        elif sep and dot:
            usage_error(f"--task-option {item}: {prefix!r} is not the task trained ({task!r}); give {rest}={value} "
                        f"(or {task}.{rest}={value})")
        keys.append(item)
    return keys
