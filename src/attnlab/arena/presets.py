"""What the arena runs: presets of tasks (with sizes and step budgets) and attention variants
(with the settings that make them efficient at the tasks' lengths)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import efficient

__all__ = ["DEFAULT_VARIANTS", "GATED_VARIANTS", "LONG_VARIANTS", "NO_ATTENTION", "PRESETS", "QUICK_VARIANTS", "VARIANT_OPTIONS", "Preset",
           "TaskSetting"]

VARIANT_OPTIONS: dict[str, dict] = {name: dict(b.short) for name, b in efficient.budgets().items()}
"""Per variant, its ``attention_options`` in the arena (a view of each variant's
:attr:`attnlab.efficient.Budget.short`): short windows and small budgets, so that each is
cheaper than dense at the arena's lengths (16-130 vectors) and its trade-off shows."""

NO_ATTENTION = "none"
"""The arena's baseline "variant": each task's model without attention
(:meth:`attnlab.training.TrainConfig.baseline`; tasks without one skip it)."""

DEFAULT_VARIANTS = ("dense", "local", "linformer", "performer", "linear", "nystrom", "reformer", "bigbird", NO_ATTENTION)

LONG_VARIANTS = ("dense", "dense_naive", "local", "linformer", "performer", "linear", "nystrom", "bigbird", NO_ATTENTION)
"""The default run's variants on its long task: ``dense_naive`` (the N x N weights held, as in
2020) beside ``dense`` (PyTorch's fused kernel) shows what fused kernels changed in the memory
column; reformer, the slowest variant per step at 1K, is left to the ``lra`` preset."""


GATED_VARIANTS = ("retnet", "gla", "deltanet", "gated_deltanet", "mamba2")
"""The gated linear-attention family (:class:`attnlab.efficient.GatedRecurrence`): in the
``standard`` and ``lra`` presets, causal on the causal tasks (recall) and scanning both ways on
the others; left out of the default run, whose ten minutes they would stretch by about half."""

QUICK_VARIANTS = tuple(v for v in DEFAULT_VARIANTS if v != "reformer")
"""The default run's variants on its short tasks: reformer, the slowest per step there (about 95 s
of the default run's ten minutes on recall and digits), is left to the ``standard`` and ``lra`` presets."""


@dataclass(frozen=True)
class TaskSetting:
    """One task of a preset: its options, the training overrides (steps, or ``seconds`` for a
    time budget, ...) and, optionally, its own variants (default: the preset's)."""

    task_options: dict = field(default_factory=dict)
    train: dict = field(default_factory=dict)
    variants: tuple | None = None


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

PRESETS: dict[str, Preset] = {
    "quick": Preset(
        {
            "text": TaskSetting({"length": 1024}, _timed(20, num_layers=1, eval_every=100, precision="auto"), LONG_VARIANTS),
            "recall": TaskSetting(_SMALL_RECALL, {"steps": 1000, "eval_every": 250}),
            "digits": TaskSetting({}, {"steps": 400, "eval_every": 100, "num_layers": 2}),
        },
        variants=QUICK_VARIANTS,
        description="the default: a 1K-byte real-text task (time-budgeted, 20 s a run, bfloat16 where the CPU has it) and two short "
                    "ones, about 8 minutes on a 2-core CPU",
    ),
    "standard": Preset(
        {
            "recall": TaskSetting(_SMALL_RECALL, {"steps": 2000, "eval_every": 250}),
            "listops": TaskSetting({}, {"steps": 3000}),
            "pos": TaskSetting({}, {}),
            "digits": TaskSetting({}, {}),
            "speech": TaskSetting({}, {}),
        },
        variants=(*(v for v in DEFAULT_VARIANTS if v != NO_ATTENTION), *GATED_VARIANTS, NO_ATTENTION),
        description="the short tasks at their own default sizes and step counts, with the gated linear-attention family (an estimated "
                    "two hours)",
    ),
    "lra": Preset(
        {
            "listops": TaskSetting({"size": 2000, "min_length": 500, "max_length": 2000, "max_args": 10},
                                   _timed(45, batch_size=16, num_layers=2, eval_every=100),
                                   tuple(v for v in _LRA_VARIANTS if v != "dense_naive")),
            "text": TaskSetting({"length": 2048}, _timed(45, num_layers=2, eval_every=100)),
            "retrieval": TaskSetting({"length": 1024}, _timed(45, num_layers=2, eval_every=100)),
            "pathfinder": TaskSetting({"resolution": 32}, _timed(45, batch_size=16, num_layers=2, eval_every=100)),
        },
        variants=_LRA_VARIANTS,
        description="the long tasks after the Long Range Arena, 1K-2K tokens, time-budgeted (45 s a run), an estimated 75 minutes on a "
                    "2-core CPU",
    ),
}
"""The arena's presets by name (``attnlab arena --preset``)."""
