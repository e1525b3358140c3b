"""The arena: train attention variants on tasks, store every result, compare them.

* :func:`plan` — the runs of a preset (tasks x variants x seeds), each with its full config;
* :func:`run_grid` — run what is not stored yet (resuming an interrupted run), optionally in
  several worker processes; :class:`Store` — the SQLite results file, one row per finished run;
* :func:`build_report` — leaderboard, Long-Range-Arena chart, attention maps, ``report.html``;
* :class:`LiveGrid` — the table ``attnlab arena`` redraws from :func:`run_grid`'s events.
"""

from .live import LiveGrid
from .presets import (
    DEFAULT_VARIANTS,
    LOOKUP_VARIANTS,
    NO_ATTENTION,
    PRESETS,
    TEXT_VARIANTS,
    VARIANT_OPTIONS,
    Preset,
    TaskSetting,
    Variants,
)
from .report import budget_of, build_report, leaderboard, plot_curves, plot_lra, plot_maps
from .runner import RunSpec, attention_maps, plan, run_grid, run_one, training_step_peak
from .store import COLUMNS, Store

__all__ = [
    "COLUMNS",
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
