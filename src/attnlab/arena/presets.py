"""What the arena runs: presets of tasks (with sizes and step budgets) and attention variants
(with the settings that make them efficient at the tasks' lengths)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import efficient

__all__ = ["DEFAULT_VARIANTS", "PRESETS", "VARIANT_OPTIONS", "Preset", "TaskSetting"]

VARIANT_OPTIONS: dict[str, dict] = {name: dict(b.short) for name, b in efficient.budgets().items()}
"""Per variant, its ``attention_options`` in the arena (a view of each variant's
:attr:`attnlab.efficient.Budget.short`): short windows and small budgets, so that each is
cheaper than dense at the arena's lengths (16-130 vectors) and its trade-off shows."""

DEFAULT_VARIANTS = ("dense", "local", "linformer", "performer", "linear", "nystrom", "reformer", "bigbird")


@dataclass(frozen=True)
class TaskSetting:
    """One task of a preset: its options and the training overrides (steps, ...)."""

    task_options: dict = field(default_factory=dict)
    train: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Preset:
    """Tasks (name -> :class:`TaskSetting`) and the default variants of a preset."""

    tasks: dict
    variants: tuple = DEFAULT_VARIANTS
    description: str = ""


_SMALL_RECALL = {"pairs": 8, "queries": 8, "num_keys": 32, "num_values": 32, "size": 4000}

PRESETS: dict[str, Preset] = {
    "quick": Preset(
        {
            "recall": TaskSetting(_SMALL_RECALL, {"steps": 1500, "eval_every": 250}),
            "listops": TaskSetting({"size": 2000, "max_length": 64}, {"steps": 300, "eval_every": 100, "layers": 2}),
            "pos": TaskSetting({}, {"steps": 400, "eval_every": 100}),
            "digits": TaskSetting({}, {"steps": 500, "eval_every": 100, "layers": 2}),
        },
        description="the default: 4 small tasks x 8 variants, about 10 minutes on a 2-core CPU",
    ),
    "standard": Preset(
        {
            "recall": TaskSetting(_SMALL_RECALL, {"steps": 2000, "eval_every": 250}),
            "listops": TaskSetting({}, {"steps": 3000}),
            "pos": TaskSetting({}, {}),
            "digits": TaskSetting({}, {}),
            "speech": TaskSetting({}, {}),
        },
        description="the tasks' own default sizes and step counts (about an hour and a half)",
    ),
    "lra": Preset(
        {
            "recall": TaskSetting({"pairs": 32, "queries": 32, "num_keys": 128, "num_values": 128}, {"steps": 8000, "eval_every": 500}),
            "listops": TaskSetting({"size": 40000}, {"steps": 10000, "eval_every": 500}),
            "speech": TaskSetting({"size": 3200}, {"steps": 4000}),
        },
        description="longer sequences and budgets, after the Long Range Arena (hours)",
    ),
}
"""The arena's presets by name (``attnlab arena --preset``)."""
