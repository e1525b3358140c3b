"""The arena: train attention variants on tasks, store every result, compare them.

* :func:`plan` — the runs of a preset (tasks x variants x seeds x difficulty levels), each with
  its full config, as a :class:`Plan` that names every run it leaves out and why;
* :func:`run_grid` — run what is not stored yet (resuming an interrupted run), optionally in
  several worker processes; :class:`Store` — the SQLite results file, one row per finished run;
* :func:`measure_cost` — each variant's training step at 1K, 4K and 16K tokens beside the fused
  and the materialising dense (:mod:`attnlab.arena.cost`);
* :func:`build_report` — leaderboard, the lecture's chart at 16K, the difficulty curve, the
  Long-Range-Arena chart per task, attention maps, ``report.html``;
* :class:`LiveGrid` — the table ``attnlab arena`` redraws from :func:`run_grid`'s events.
"""

from .board import average_over_tasks, budget_of, leaderboard
from .charts import plot_cost, plot_curves, plot_levels, plot_lra, plot_maps
from .cost import cost_table, measure_cost
from .live import LiveGrid
from .planning import Plan, RunSpec, parse_task_options, plan
from .presets import (
    COST_LENGTHS,
    DEFAULT_VARIANTS,
    LOOKUP_LEVELS,
    LOOKUP_VARIANTS,
    NO_ATTENTION,
    PRESETS,
    TEXT_VARIANTS,
    VARIANT_OPTIONS,
    Preset,
    TaskSetting,
    Variants,
)
from .report import build_report
from .runner import attention_maps, run_grid, run_one, training_step_peak
from .store import COLUMNS, Store

__all__ = [
    "COLUMNS",
    "COST_LENGTHS",
    "LOOKUP_LEVELS",
    "Plan",
    "average_over_tasks",
    "cost_table",
    "measure_cost",
    "parse_task_options",
    "plot_cost",
    "plot_levels",
    "DEFAULT_VARIANTS",
    "LOOKUP_VARIANTS",
    "TEXT_VARIANTS",
    "LiveGrid",
    "NO_ATTENTION",
    "PRESETS",
    "VARIANT_OPTIONS",
    "Preset",
    "RunSpec",
    "Store",
    "TaskSetting",
    "Variants",
    "attention_maps",
    "budget_of",
    "build_report",
    "leaderboard",
    "plan",
    "plot_curves",
    "plot_lra",
    "plot_maps",
    "run_grid",
    "run_one",
    "training_step_peak",
]
