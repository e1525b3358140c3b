"""What the arena runs: presets of tasks (with sizes and step budgets) and attention variants
(with the settings that make them efficient at the tasks' lengths).

No list of variants here is kept by hand where a rule says it: the ``standard`` and ``lra``
presets take the registered variants by their declared capabilities
(:func:`attnlab.efficient.select`), read when the grid is planned (:class:`Variants`), so a variant
registered later is planned too; ``quick`` keeps a small curated choice for ``make demo``'s time.
Whatever the choice, each task of a preset plans only the variants whose capabilities fit it
(:func:`fits`: a task trained causally needs a causal form).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from .. import efficient
from ..registry import RegistryView

__all__ = ["COST_LENGTHS", "DEFAULT_VARIANTS", "LOOKUP_LEVELS", "LOOKUP_STEPS", "LOOKUP_VARIANTS", "LRA_STEPS",
           "TEXT_STEPS", "TEXT_VARIANTS", "NO_ATTENTION", "PRESETS", "VARIANT_OPTIONS", "Preset",
           "TaskSetting", "Variants", "fits", "task_is_causal"]

VARIANT_OPTIONS: Mapping[str, dict] = RegistryView(efficient.VARIANTS, lambda name: dict(efficient.budget(name).short))
"""Per variant, its ``attention_options`` in the arena (a live view of each registered variant's
:attr:`attnlab.efficient.Budget.short`): short windows and small budgets, so that each is
cheaper than dense at the arena's lengths (16-130 vectors) and its trade-off shows."""

NO_ATTENTION = "none"
"""The arena's baseline "variant": each task's model without attention
(:meth:`attnlab.training.TrainConfig.baseline`; tasks without one skip it)."""


def task_is_causal(task: str, task_options: Mapping | None = None, train: Mapping | None = None) -> bool:
    """Whether the arena trains ``task`` causally: its training defaults
    (:func:`attnlab.tasks.train_defaults`; ``recall`` and ``lookup`` say ``causal``), then ``train``'s
    overrides. An unknown task: False (planning names it)."""
    from .. import tasks as task_registry

    if task not in task_registry.TASKS:
        return False
    return bool({**task_registry.train_defaults(task, dict(task_options or {})), **(train or {})}.get("causal", False))


def fits(variant: str, causal: bool) -> bool:
    """Whether ``variant`` can run a task (trained causally or not), by its declared capabilities:
    a causal task needs a causal form (:attr:`attnlab.layers.step.Capabilities.causal`; linformer and
    nystrom have none). The no-attention baseline and unknown names fit (planning names the latter)."""
    if variant == NO_ATTENTION or variant not in efficient.VARIANTS:
        return True
    return not causal or efficient.capabilities(variant).causal is not None


class Variants(Sequence[str]):
    """A preset's (or one task's) variants, read each time they are asked for, so a variant
    registered after the preset was written is in them.

    Give either ``names`` or ``select``.

    Args:
        names: a curated choice, as given (:data:`NO_ATTENTION` among them if wanted).
        select: criteria of :func:`attnlab.efficient.select` (``{}``: all): the registered variants
            they give, in the order of registration, then :data:`NO_ATTENTION`.
        task, task_options, train: the task they are for (None: any), its options and training
            overrides: only the variants that :func:`fits` it as trained so are kept.
    """

    def __init__(self, names: Iterable[str] | None = None, *, select: Mapping | None = None, task: str | None = None,
                 task_options: Mapping | None = None, train: Mapping | None = None):
        if (names is None) == (select is None):
            raise ValueError("give Variants either names or select criteria")
        self.names = None if names is None else tuple(names)
        self.select = None if select is None else dict(select)
        self.task, self.task_options, self.train = task, dict(task_options or {}), dict(train or {})

    @classmethod
    def of(cls, variants: Iterable[str]) -> Variants:
        """``variants`` as a :class:`Variants` (itself when it is one)."""
        return variants if isinstance(variants, Variants) else cls(variants)

    def for_task(self, task: str, setting: TaskSetting) -> Variants:
        """The same choice for ``task`` trained as ``setting`` says: only the ones that fit it."""
        return Variants(self.names, select=self.select, task=task, task_options=setting.task_options,
                        train=setting.train)

    def resolve(self) -> tuple[str, ...]:
        """The names, read now."""
        picked = list(self.names) if self.select is None else [*efficient.select(**self.select), NO_ATTENTION]
        if self.task is None:
            return tuple(picked)
        causal = task_is_causal(self.task, self.task_options, self.train)
        return tuple(v for v in picked if fits(v, causal))

    def __getitem__(self, index):
        return self.resolve()[index]

    def __bool__(self) -> bool:  # a choice is given even where nothing fits: the planner takes it, not the preset's
        return True

    def __len__(self) -> int:
        return len(self.resolve())

    def __iter__(self) -> Iterator[str]:
        return iter(self.resolve())

    def __eq__(self, other) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str):
            return tuple(self) == tuple(other)
        return NotImplemented

    __hash__ = None

    def __repr__(self) -> str:
        rule = (f"select({', '.join(f'{k}={v!r}' for k, v in self.select.items())}) + {NO_ATTENTION!r}"
                if self.select is not None else repr(self.names))
        return f"Variants({rule}{f' fitting {self.task!r}' if self.task else ''}: {', '.join(self)})"


DEFAULT_VARIANTS = Variants(select={"reference": False})
"""A preset's variants unless it says otherwise: every registered variant but the references of
another (``dense_naive``), in the order of registration, then the no-attention baseline."""


@dataclass(frozen=True)
class TaskSetting:
    """One task of a preset: its options, the training overrides (steps, or ``seconds`` for a
    time budget, ...) and, optionally, its own variants (default: the preset's), its own seeds
    (default: seed 0), a sweep of training settings (``{"lr": [...]}``:
    :mod:`attnlab.arena.sweep`; default none) and difficulty ``levels``.

    ``levels``: task options laid over ``task_options``, one dict per level, easiest first
    (``({"keys": 8, "repeats": 32}, {"keys": 16, "repeats": 16}, ...)``); every variant and seed
    runs at each, and a variant's score on the task is its mean over the levels (MAD's rule,
    Poli et al. 2024), with each level's in the report. Empty: one level, ``task_options`` alone.

    ``cost``: lengths at which the arena measures each variant's training step on this task's
    model after the grid (:mod:`attnlab.arena.cost`; empty: none)."""

    task_options: dict = field(default_factory=dict)
    train: dict = field(default_factory=dict)
    variants: Sequence[str] | None = None
    seeds: tuple | None = None
    sweep: dict = field(default_factory=dict)
    levels: tuple = ()
    cost: tuple = ()


@dataclass(frozen=True)
class Preset:
    """Tasks (name -> :class:`TaskSetting`) and the default variants of a preset. Each task's
    variants (its own, else the preset's) become a :class:`Variants` for that task: only those
    whose capabilities fit it are planned."""

    tasks: dict
    variants: Sequence[str] = field(default_factory=lambda: DEFAULT_VARIANTS)
    description: str = ""

    def __post_init__(self):
        object.__setattr__(self, "tasks",
                           {t: replace(s, variants=Variants.of(s.variants or self.variants).for_task(t, s))
                            for t, s in self.tasks.items()})


_SMALL_RECALL = {"pairs": 8, "queries": 8, "num_keys": 32, "num_values": 32, "size": 4000}


COST_LENGTHS = (1024, 4096, 16384)
"""The lengths at which the arena measures each variant's training step after the grid
(:mod:`attnlab.arena.cost`; its chart uses the last): where efficient attention pays."""

LOOKUP_LEVELS = tuple({"keys": k, "repeats": 256 // k} for k in (8, 16, 32))
"""The difficulty levels of ``lookup`` in the default run: 8, 16 and 32 keys per sequence, each
written ``256 / keys`` times (the same 256 past writes, positions and length at every level).
A fixed-size state (linear, performer, retnet: four heads of 16 channels at lookup's width 64)
must hold every key's value across the gap, so it falls off as the keys grow, while attention
reads the writes back at any count: Zoology's finding on MQAR (Arora et al. 2023), whose axis
is the model's width at a fixed number of keys; here the keys grow at a fixed width, the same
ratio of keys to state."""

LOOKUP_STEPS = 200
"""Optimizer steps of each ``lookup`` run in the default run: enough for dense attention's mean
over seeds 0 and 1 to reach 0.93 at 32 keys, while retnet and linear stay near 0.50 and 0.62 there
(step-budgeted scores, the same on any machine: benchmarks/results/arena-repro-*.json)."""

TEXT_STEPS = 150
"""Optimizer steps of each ``text`` run in the default run (1K bytes, one layer, fp32)."""

LRA_STEPS = 100
"""Optimizer steps of each run of the ``lra`` preset (LRA fixes the steps of every model; its own
are thousands on accelerators: on a 2-core CPU this is a first look, not the paper's budget)."""


# The default run (quick) keeps a curated choice, for make demo's time (README, Set-up): no rule over the
# capabilities gives it (one causal variant per family would drop linear and add reformer). Like every
# preset's, it is planned only where the capabilities fit (Preset binds each task's variants to the task).
LOOKUP_VARIANTS = ("dense", "local", "linear", "performer", "retnet", NO_ATTENTION)
"""The variants of the long ``lookup`` task in the default run (a curated choice: an exact, a
pattern, the two kernels and the first of the gated family; the task is causal, and the variants
without a causal form could not run it); the others are left to the ``standard`` preset."""

TEXT_VARIANTS = ("dense", "linear", NO_ATTENTION)
"""The variants of the default run's ``text`` task (1K bytes, a curated choice): where the
no-attention baseline is measured beside dense at a budget too short for attention to pay off."""


def _lr_sweep(task: str, factor: float = 3.0) -> dict:
    """A small learning-rate sweep for a preset's long task: its own default (so that runs planned
    before the sweep keep their ids) and ``factor`` times it."""
    from .. import tasks as task_registry

    lr = task_registry.train_defaults(task).get("lr", 1e-3)
    return {"lr": [lr, float(f"{lr * factor:.3g}")]}


PRESETS: dict[str, Preset] = {
    "quick": Preset(
        {
            "lookup": TaskSetting({"size": 512}, {"steps": LOOKUP_STEPS, "eval_every": 100, "precision": "fp32"},
                                  LOOKUP_VARIANTS, seeds=(0, 1), levels=LOOKUP_LEVELS, cost=COST_LENGTHS),
            "text": TaskSetting({"length": 1024}, {"steps": TEXT_STEPS, "num_layers": 1, "eval_every": 75,
                                                   "precision": "fp32"}, TEXT_VARIANTS),
        },
        variants=LOOKUP_VARIANTS,
        description="the default: lookup, a 1K-token key-value log that attention must read, at three difficulty "
                    f"levels (8, 16 and 32 keys; seeds 0 and 1, {LOOKUP_STEPS} steps a run), and a 1K-byte real-text "
                    f"task with its no-attention baseline ({TEXT_STEPS} steps), all in steps and fp32 (the same scores "
                    "on any machine), then each variant's cost at 1K, 4K and 16K tokens; a few minutes on a 2-core CPU",
    ),
    "standard": Preset(
        {
            "recall": TaskSetting(_SMALL_RECALL, {"steps": 2000, "eval_every": 250}, sweep=_lr_sweep("recall")),
            "lookup": TaskSetting({}, {"steps": LOOKUP_STEPS, "eval_every": 50}, seeds=(0, 1),
                                  sweep=_lr_sweep("lookup", 1 / 3), levels=LOOKUP_LEVELS, cost=COST_LENGTHS),
            "listops": TaskSetting({}, {"steps": 3000}),
            "pos": TaskSetting({}, {}),
            "digits": TaskSetting({}, {}),
            "speech": TaskSetting({}, {}),
        },
        variants=DEFAULT_VARIANTS,
        description="the short tasks at their own default sizes and step counts, and lookup at its three levels, every "
                    "registered variant that can run each (the causal recall and lookup: those with a causal form); "
                    "recall and lookup sweep the learning rate (an estimated two and a half hours)",
    ),
    "lra": Preset(
        {  # listops leaves out the references (dense_naive): at 2000 tokens its N x N weights make its steps and
            # evaluation the slowest of the grid, a quarter of the preset's time for one cell
            "listops": TaskSetting({"size": 2000, "min_length": 500, "max_length": 2000, "max_args": 10},
                                   {"steps": LRA_STEPS, "batch_size": 16, "num_layers": 2, "eval_every": 50},
                                   DEFAULT_VARIANTS, sweep=_lr_sweep("listops")),
            "text": TaskSetting({"length": 2048}, {"steps": LRA_STEPS, "num_layers": 2, "eval_every": 50},
                                sweep=_lr_sweep("text")),
            "retrieval": TaskSetting({"length": 1024}, {"steps": LRA_STEPS, "num_layers": 2, "eval_every": 50},
                                     sweep=_lr_sweep("retrieval")),
            "pathfinder": TaskSetting({"resolution": 32},
                                      {"steps": LRA_STEPS, "batch_size": 16, "num_layers": 2, "eval_every": 50},
                                      sweep=_lr_sweep("pathfinder")),
        },
        variants=Variants(select={}),  # every variant, the references too: dense_naive is the LRA's memory baseline
        description=f"the long tasks after the Long Range Arena, 1K-2K tokens, {LRA_STEPS} steps a run as LRA fixes "
                    "its steps, each at two learning rates (its own and three times it), an estimated hour and a "
                    "quarter on a 2-core CPU (dense_naive's steps are the longest)",
    ),
}
"""The arena's presets by name (``attnlab arena --preset``)."""
