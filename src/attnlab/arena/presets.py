"""What the arena runs: presets of tasks (with sizes and step budgets) and attention variants
(with the settings that make them efficient at the tasks' lengths)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import efficient

__all__ = ["DEFAULT_VARIANTS", "GATED_VARIANTS", "LOOKUP_VARIANTS", "TEXT_VARIANTS", "NO_ATTENTION", "PRESETS", "VARIANT_OPTIONS", "Preset",
           "TaskSetting"]

VARIANT_OPTIONS: dict[str, dict] = {name: dict(b.short) for name, b in efficient.budgets().items()}
"""Per variant, its ``attention_options`` in the arena (a view of each variant's
:attr:`attnlab.efficient.Budget.short`): short windows and small budgets, so that each is
cheaper than dense at the arena's lengths (16-130 vectors) and its trade-off shows."""

NO_ATTENTION = "none"
"""The arena's baseline "variant": each task's model without attention
(:meth:`attnlab.training.TrainConfig.baseline`; tasks without one skip it)."""

DEFAULT_VARIANTS = ("dense", "local", "linformer", "performer", "linear", "nystrom", "reformer", "bigbird", NO_ATTENTION)

GATED_VARIANTS = ("retnet", "gla", "deltanet", "gated_deltanet", "mamba2")
"""The gated linear-attention family (:class:`attnlab.efficient.GatedRecurrence`): in the
``standard`` and ``lra`` presets, causal on the causal tasks (recall, lookup) and scanning both
ways on the others; the default run has one of them (retnet, on lookup)."""


@dataclass(frozen=True)
class TaskSetting:
    """One task of a preset: its options, the training overrides (steps, or ``seconds`` for a
    time budget, ...) and, optionally, its own variants (default: the preset's), its own seeds
    (default: seed 0) and a sweep of training settings (``{"lr": [...]}``:
    :mod:`attnlab.arena.sweep`; default none)."""

    task_options: dict = field(default_factory=dict)
    train: dict = field(default_factory=dict)
    variants: tuple | None = None
    seeds: tuple | None = None
    sweep: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Preset:
    """Tasks (name -> :class:`TaskSetting`) and the default variants of a preset."""

    tasks: dict
    variants: tuple = DEFAULT_VARIANTS
    description: str = ""


_SMALL_RECALL = {"pairs": 8, "queries": 8, "num_keys": 32, "num_values": 32, "size": 4000}


def _timed(seconds: float, **train) -> dict:
    """Training settings of a time-budgeted task: ``seconds`` each run (no step limit, no early stop:
    :func:`attnlab.training.config.time_budget`)."""
    return {"seconds": float(seconds), **train}


_LRA_VARIANTS = ("dense", "dense_naive", "local", "longformer", "linformer", "performer", "linear", "nystrom", "reformer", "bigbird",
                 *GATED_VARIANTS, NO_ATTENTION)
# listops leaves out dense_naive: at 2000 tokens its N x N weights make each step ~13 s and its
# evaluation minutes (measured), a quarter of the preset's hour for one cell

LOOKUP_VARIANTS = ("dense", "local", "linear", "performer", "retnet", NO_ATTENTION)
"""The variants of the long ``lookup`` task in the default run: the task is causal, so the
variants without a causal form (linformer, nystrom) cannot run it; the block-sparse bigbird and
the gated family beyond retnet are left to the ``standard`` preset for the default run's time."""

TEXT_VARIANTS = ("dense", "linear", NO_ATTENTION)
"""The variants of the default run's ``text`` task (1K bytes, 15 s a run): where the no-attention
baseline is measured beside dense at a budget too short for attention to pay off."""


def _lr_sweep(task: str, factor: float = 3.0) -> dict:
    """A small learning-rate sweep for a preset's long task: its own default (so that runs planned
    before the sweep keep their ids) and ``factor`` times it."""
    from .. import tasks as task_registry

    lr = task_registry.train_defaults(task).get("lr", 1e-3)
    return {"lr": [lr, float(f"{lr * factor:.3g}")]}


PRESETS: dict[str, Preset] = {
    "quick": Preset(
        {
            "lookup": TaskSetting({}, _timed(20, eval_every=100), LOOKUP_VARIANTS, seeds=(0, 1)),
            "text": TaskSetting({"length": 1024}, _timed(15, num_layers=1, eval_every=100, precision="auto"), TEXT_VARIANTS),
        },
        variants=LOOKUP_VARIANTS,
        description="the default: lookup, a 1K-token key-value log that attention must read (seeds 0 and 1, 20 s a run), and a 1K-byte "
                    "real-text task with its no-attention baseline (15 s a run), about 7 minutes on a 2-core CPU",
    ),
    "standard": Preset(
        {
            "recall": TaskSetting(_SMALL_RECALL, {"steps": 2000, "eval_every": 250}, sweep=_lr_sweep("recall")),
            "lookup": TaskSetting({}, _timed(20, eval_every=50), ("dense", "local", "linear", "performer", *GATED_VARIANTS, NO_ATTENTION),
                                  seeds=(0, 1), sweep=_lr_sweep("lookup", 1 / 3)),
            "listops": TaskSetting({}, {"steps": 3000}),
            "pos": TaskSetting({}, {}),
            "digits": TaskSetting({}, {}),
            "speech": TaskSetting({}, {}),
        },
        variants=(*(v for v in DEFAULT_VARIANTS if v != NO_ATTENTION), *GATED_VARIANTS, NO_ATTENTION),
        description="the short tasks at their own default sizes and step counts, and lookup, with the gated linear-attention family; "
                    "recall and lookup sweep the learning rate (an estimated two and a half hours)",
    ),
    "lra": Preset(
        {
            "listops": TaskSetting({"size": 2000, "min_length": 500, "max_length": 2000, "max_args": 10},
                                   _timed(45, batch_size=16, num_layers=2, eval_every=100),
                                   tuple(v for v in _LRA_VARIANTS if v != "dense_naive"), sweep=_lr_sweep("listops")),
            "text": TaskSetting({"length": 2048}, _timed(45, num_layers=2, eval_every=100), sweep=_lr_sweep("text")),
            "retrieval": TaskSetting({"length": 1024}, _timed(45, num_layers=2, eval_every=100), sweep=_lr_sweep("retrieval")),
            "pathfinder": TaskSetting({"resolution": 32}, _timed(45, batch_size=16, num_layers=2, eval_every=100),
                                      sweep=_lr_sweep("pathfinder")),
        },
        variants=_LRA_VARIANTS,
        description="the long tasks after the Long Range Arena, 1K-2K tokens, time-budgeted (45 s a run), each at two learning rates "
                    "(its own and three times it), an estimated two and a half hours on a 2-core CPU",
    ),
}
"""The arena's presets by name (``attnlab arena --preset``)."""
