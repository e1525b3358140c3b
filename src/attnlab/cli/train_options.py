"""The settings of ``attnlab train``: what the run trains and how (the options of its
:class:`~attnlab.training.TrainConfig`), declared once, away from the command's body; the command
receives them as one dict (:func:`attnlab.cli.options.gathered`)."""

from __future__ import annotations

import typing

import typer

from .common import fail
from .options import blocks_option, device_option, heads_option, option, precision_option, width_option

__all__ = ["RUN_OPTIONS", "task_options"]

_INT, _FLOAT, _STR, _BOOL = typing.Optional[int], typing.Optional[float], typing.Optional[str], typing.Optional[bool]  # noqa: UP045
_LIST = list[str]

RUN_OPTIONS = [
    option("model", _STR, typer.Option(None, help="Backbone (default: the task's, else transformer; 'attnlab list models').")),
    option("attention", _STR, typer.Option(None, help="Attention variant (default dense; 'attnlab list variants').")),
    option("positional", _STR, typer.Option(None, help="Positional encoding (default: the task's; 'attnlab list encodings').")),
    option("causal", _BOOL, typer.Option(None, "--causal/--bidirectional", help="Causal attention (default: the task's).")),
    option("steps", _INT, typer.Option(None, min=1, help="Optimizer steps (default: the task's).")),
    option("epochs", _INT, typer.Option(None, min=1, help="Passes over the training split instead of --steps.")),
    option("seed", _INT, typer.Option(None, help="Seed of the weights, dropout and example order (default 0).")),
    option("size", _INT, typer.Option(None, min=1, help="Task size knob: training examples.")),
    option("task_option", _LIST, typer.Option([], "--task-option", metavar="KEY=VALUE",
                                              help="A task option (repeatable); TASK.KEY=VALUE, as the arena spells it, is taken too.")),
    option("model_option", _LIST, typer.Option([], "--model-option", metavar="KEY=VALUE", help="A backbone option (repeatable).")),
    option("attention_option", _LIST, typer.Option([], "--attention-option", metavar="KEY=VALUE",
                                                   help="An option of the attention variant, e.g. window=16 (repeatable).")),
    option("embed_dim", _INT, width_option(None, "Model width E (default: the task's, else 64).")),
    option("num_layers", _INT, blocks_option(None, "Blocks (default: the task's, else 2).")),
    option("num_heads", _INT, heads_option(None, "Attention heads, dividing --embed-dim (default: the task's, else 4).")),
    option("batch_size", _INT, typer.Option(None, "--batch-size", min=1, help="Examples per optimizer step (default: the task's).")),
    option("lr", _FLOAT, typer.Option(None, min=0.0, help="Peak learning rate of AdamW (default: the task's).")),
    option("eval_every", _INT, typer.Option(None, "--eval-every", min=1, help="Steps between validations and checkpoints.")),
    option("patience", _INT, typer.Option(None, min=1, help="Stop after this many validations without improvement.")),
    option("seconds", _FLOAT, typer.Option(
        None, "--seconds", min=0.1,
        help="Time budget: train this many seconds, the learning rate annealed over them (no step limit unless --steps, no "
             "early stop unless --patience).")),
    option("precision", _STR, precision_option(None)),
    option("device", _STR, device_option(None)),
    option("compile", _BOOL, typer.Option(None, "--compile/--no-compile", help="Run the training forward through torch.compile.")),
    option("pretrain_steps", _INT, typer.Option(
        None, "--pretrain-steps", min=0,
        help="Self-pretraining first: this many steps restoring masked tokens (next token for causal models) on the task's own "
             "inputs, then fine-tuning on the labels (default 0: none).")),
    option("pretrain_share", _FLOAT, typer.Option(
        None, "--pretrain-share", min=0.01, max=0.99,
        help="Under --seconds: the share of the budget self-pretraining may take at most (default 0.5).")),
]
"""``attnlab train``'s settings of the run (the :class:`~attnlab.training.TrainConfig` it builds;
None: the task's default, or a resumed run's own value)."""


def task_options(task: str, given: list[str]) -> list[str]:
    """``--task-option`` as ``KEY=VALUE``: the arena's ``TASK.KEY=VALUE`` (``lookup.keys=32``) with
    ``TASK`` the task trained loses its prefix; a prefix naming another task is a one-line error."""
    keys = []
    for item in given:
        key, sep, value = item.partition("=")
        prefix, dot, rest = key.partition(".")
        if sep and dot and prefix == task:
            item = f"{rest}={value}"
        elif sep and dot:
            fail(f"--task-option {item}: {prefix!r} is not the task trained ({task!r}); give {rest}={value} "
                 f"(or {task}.{rest}={value})")
        keys.append(item)
    return keys
