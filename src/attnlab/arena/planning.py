"""The arena's plan: the runs of a preset (tasks x variants x seeds x difficulty levels x sweep
points), each with its full config and an id that hashes it (and the contents of the user's file
it reads), and a note for every run the grid leaves out and why.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass

from ..training import TrainConfig
from ..training.config import FORMER_NAMES, LATER_FIELDS
from .presets import NO_ATTENTION, PRESETS, VARIANT_OPTIONS, Preset, TaskSetting, Variants
from .sweep import points as sweep_points

__all__ = ["LOWER_IS_BETTER", "Plan", "RunSpec", "check_tasks", "parse_task_options", "plan", "unfit_reason"]


@dataclass(frozen=True)
class RunSpec:
    """One run of the grid: ``task`` x ``variant`` x ``seed`` (x a sweep point) and its full config."""

    run_id: str
    task: str
    variant: str
    seed: int
    config: TrainConfig
    sweep: dict = dataclasses.field(default_factory=dict, hash=False)
    """The settings of the sweep point this run is (``{}``: not part of a sweep; :mod:`attnlab.arena.sweep`)."""
    data_sha256: str | None = None
    """The SHA-256 of the user's file the run reads (:func:`attnlab.tasks.data_digest`; None: a generated task), part of
    its id."""
    level: dict = dataclasses.field(default_factory=dict, hash=False)
    """The task options of the difficulty level this run is (``{}``: the task has no levels;
    :attr:`attnlab.arena.TaskSetting.levels`); they are in ``config.task_options`` too."""


class Plan(list):
    """The runs :func:`plan` gives (a list of :class:`RunSpec`), with ``notes``: one line for each
    run the grid leaves out and why (a variant that cannot run a task, a task without a
    no-attention baseline, levels replaced by a task option, a task compared without dense)."""

    def __init__(self, specs=(), notes=(), cost=None):
        super().__init__(specs)
        self.notes = list(notes)
        self.cost = cost
        """What to measure after the grid (:func:`attnlab.arena.cost.measure_cost`'s arguments: ``task``,
        ``variants``, ``lengths``, ``task_options``, ``train``), or None: no task of the grid asks for it."""




def _run_id(cfg: TrainConfig, data_sha256: str | None = None, beyond: dict | None = None) -> str:
    # hashed under the sizes' earlier names: a run keeps its id
    earlier = {new: old for old, new in FORMER_NAMES.items()}
    fields = {earlier.get(k, k): v for k, v in dataclasses.asdict(cfg).items()}
    for name, before in LATER_FIELDS.items():
        if fields[name] == before:
            del fields[name]
    if data_sha256 is not None:  # the user's file by its contents: a changed file gets new runs
        fields["data_sha256"] = data_sha256
    fields.update(beyond or {})  # what the task derives from the data that changes a run (jsonl's character tokenizer)
    blob = json.dumps(fields, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


LOWER_IS_BETTER = {"docs": "perplexity"}
"""Tasks whose metric falls as models improve: the arena, which ranks and averages accuracies, leaves them out."""


def _budget(train: dict, given: dict) -> dict:
    """``train`` with the settings ``given`` laid over it, where a step count (``steps`` or
    ``epochs``) replaces a time budget and a time budget (``seconds``) replaces a step count:
    a run has one budget, named by what it is (a swept ``steps=30`` is a step budget)."""
    if {"steps", "epochs"} & set(given):
        train.pop("seconds", None)
    if "seconds" in given:  # the time-budget rule sets steps and patience
        train.pop("steps", None), train.pop("epochs", None)
    return {**train, **given}


def _grid_tasks(p: Preset, tasks: Iterable[str] | None, data: str | None) -> tuple[list[str], dict[str, TaskSetting]]:
    """The grid's task names and each one's setting: the preset's, ``tasks`` restricting or adding
    (a task outside the preset at its own defaults), the user's file as ``jsonl``."""
    from .. import tasks as task_registry

    settings = dict(p.tasks)
    if data:
        settings["jsonl"] = TaskSetting({"path": str(data)}, {})
    names = list(settings) if tasks is None else list(tasks)
    if data and "jsonl" not in names:  # the user's file is never dropped for naming other tasks
        names.append("jsonl")
    for t in names:
        if t not in settings:
            known = sorted(set(task_registry.names()) - {"jsonl", "graph_files", "wav_folder", *LOWER_IS_BETTER})
            if t in LOWER_IS_BETTER:
                raise ValueError(f"task {t!r} reports {LOWER_IS_BETTER[t]} (lower is better), the arena ranks "
                                 f"accuracies; train it with attnlab train {t}")
            if t not in known:
                raise ValueError(f"unknown task {t!r}; choose from {', '.join(known)} (or --data FILE for jsonl)")
            settings[t] = TaskSetting({}, {})
    return names, settings


def _lay_task_options(names: list[str], settings: dict[str, TaskSetting], task_options: dict[str, dict]) -> list[str]:
    """Lay each task's options over its setting (in place); an option a level sets replaces the
    levels. Returns a note for each task whose levels were replaced."""
    from .board import level_text

    notes = []
    for t, extra in task_options.items():
        if t not in names:
            raise ValueError(f"task option for {t!r}, which is not a task of this grid ({', '.join(names)})")
        s = settings[t]
        replaced = sorted({k for level in s.levels for k in level} & set(extra))
        if replaced:
            given = ", ".join(f"{k}={extra[k]}" for k in replaced)
            notes.append(f"{t}: {given} given, so it runs at that setting alone, in place of its difficulty levels "
                         f"({'; '.join(level_text(lv) for lv in s.levels)})")
        settings[t] = dataclasses.replace(s, task_options={**s.task_options, **extra},
                                          levels=() if replaced else s.levels)
    return notes


def unfit_reason(variant: str, task: str, setting: TaskSetting | None = None) -> str | None:
    """Why ``variant`` cannot run ``task`` (trained as ``setting`` says), in words, or None when it
    can: a causal task needs a causal form (linformer and nystrom have none), the no-attention
    baseline needs a backbone without attention for the task (none for a seq2seq task's decoder)."""
    from .. import efficient
    from .. import tasks as task_registry
    from .presets import fits, task_is_causal

    setting = setting or TaskSetting()
    if variant == NO_ATTENTION:
        if task in task_registry.TASKS and task_registry.baseline_model(task) is None:
            return (f"{task} has no no-attention baseline (no backbone without attention reads it; a seq2seq decoder "
                    "attends its encoder)")
        return None
    if variant in efficient.VARIANTS and not fits(variant, task_is_causal(task, setting.task_options, setting.train)):
        return f"{variant} has no causal form and {task} is trained causally"
    return None


def parse_task_options(items: Iterable[str], tasks: Iterable[str] | None = None) -> dict[str, dict]:
    """``["lookup.keys=32", "text.length=2048"]`` -> ``{"lookup": {"keys": 32}, "text": {"length": 2048}}``:
    the arena's ``--task-option TASK.KEY=VALUE`` (values parsed as JSON numbers, booleans or lists,
    else kept as words). ``tasks``: the grid's tasks (an option of another task is refused)."""
    from .. import tasks as task_registry

    known = None if tasks is None else list(tasks)
    out: dict[str, dict] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        task, dot, key = name.strip().partition(".")
        if not sep or not dot or not task or not key:
            raise ValueError(f"--task-option takes TASK.KEY=VALUE (e.g. lookup.keys=32), got {item!r}")
        if known is not None and task not in known:
            raise ValueError(f"--task-option {name.strip()}: {task} is not a task of this grid ({', '.join(known)})")
        if task not in task_registry.TASKS:
            raise ValueError(f"--task-option {name.strip()}: unknown task {task!r}")
        accepted = task_registry.TASKS.options(task)
        if accepted is not None and key not in accepted:
            raise ValueError(f"--task-option {task}.{key}: {task} has no option {key!r}; it takes "
                             f"{', '.join(accepted)} (attnlab list tasks {task})")
        if key in out.get(task, {}):
            raise ValueError(f"--task-option {task}.{key} given twice")
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        out.setdefault(task, {})[key] = value
    return out


def plan(
    preset: str | Preset = "quick",
    *,
    tasks: Iterable[str] | None = None,
    variants: Iterable[str] | None = None,
    seeds: Iterable[int] | None = None,
    data: str | None = None,
    seconds: float | None = None,
    steps: int | None = None,
    precision: str | None = None,
    sweep: dict[str, list] | None = None,
    task_options: dict[str, dict] | None = None,
    device: str = "cpu",
) -> Plan:
    """The runs of a preset (restricted to ``tasks`` / ``variants`` when given; otherwise each
    task's own variants, or the preset's), one per seed (``seeds``; default: each task's own,
    :attr:`TaskSetting.seeds`, else seed 0), per difficulty level (:attr:`TaskSetting.levels`) and
    per point of the sweep (``sweep``, as :func:`attnlab.arena.sweep.parse_sweep` gives it, replaces every task's own
    :attr:`TaskSetting.sweep`; ``{}``: no sweep anywhere);
    ``data`` adds the user's jsonl file as task ``jsonl`` (also when ``tasks`` names others). The variant
    :data:`NO_ATTENTION` (``"none"``) is each task's no-attention baseline.

    Budgets: ``steps`` makes every run step-budgeted (that many optimizer steps: the same scores on any machine);
    ``seconds`` makes every run time-budgeted (:attr:`attnlab.training.TrainConfig.seconds`: each variant gets the same
    training seconds, the learning rate annealed over them: this machine's result). ``precision``
    (``fp32``, ``bf16``, ``auto``) replaces every task's own (:mod:`attnlab.training.precision`).
    ``task_options``: per task, options laid over the preset's (:func:`parse_task_options`); one
    that a level sets replaces the task's levels. ``device``: the kind of device every run trains on
    (``cpu``, ``cuda``, ``mps``; a run off the CPU is a run of its own, never taken for the CPU's).

    Returns a :class:`Plan`: the runs, and a note for each run left out and why
    (:func:`unfit_reason`), for levels replaced by an option, and for a task compared without dense."""
    from .. import efficient
    from .. import tasks as task_registry

    if isinstance(preset, str) and preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    if seconds is not None and steps is not None:
        raise ValueError("give a budget in steps or in seconds, not both")
    swept_budget = sorted({"steps", "epochs", "seconds"} & set(sweep or {}))
    if swept_budget and (seconds is not None or steps is not None):
        raise ValueError(f"--sweep {swept_budget[0]} and a --budget-{'steps' if steps is not None else 'seconds'}: the "
                         "sweep sets each run's budget, give it once")
    p = PRESETS[preset] if isinstance(preset, str) else preset
    names, settings = _grid_tasks(p, tasks, data)
    notes = _lay_task_options(names, settings, task_options or {})

    def chosen(t: str, setting: TaskSetting) -> list[str]:
        """The variants asked by name (as they are), or the preset's that fit task ``t`` (a causal task: a causal
        form)."""
        if variants is not None:
            return list(variants)
        picked = setting.variants if setting.variants is not None else p.variants
        return list(Variants.of(picked).for_task(t, setting))

    for v in dict.fromkeys(v for t in names for v in chosen(t, settings[t])):
        if v not in efficient.names() and v != NO_ATTENTION:
            raise ValueError(f"unknown variant {v!r}; choose from {', '.join(efficient.names())} (or "
                             f"{NO_ATTENTION!r}: no attention)")
    runnable = {t: _runnable(t, settings[t], chosen(t, settings[t]), notes) for t in names}
    task_seeds = {t: list(seeds) if seeds is not None else list(settings[t].seeds or (0,)) for t in names}
    digests = {t: task_registry.data_digest(t, dict(settings[t].task_options)) for t in names}
    derived: dict[str, dict] = {}  # per task and options, what a run derives from the data beyond them (read once)

    def beyond(t: str, options: dict) -> dict:
        fields = getattr(task_registry.TASKS.get(t), "run_id_fields", None)
        key = json.dumps([t, options], sort_keys=True)
        if fields is not None and key not in derived:
            derived[key] = fields(**options)
        return derived.get(key, {})

    specs = []
    for seed in dict.fromkeys(x for t in names for x in task_seeds[t]):  # seed by seed: every task's seed 0 first
        for t in (t for t in names if seed in task_seeds[t]):
            s = settings[t]
            train = _budget(dict(s.train), {"seconds": float(seconds)} if seconds is not None else
                            {"steps": int(steps)} if steps is not None else {})
            if precision is not None:
                train["precision"] = precision
            train["device"] = device
            for level in s.levels or ({},):
                for v in runnable[t]:
                    opts = VARIANT_OPTIONS.get(v, {})
                    for point in sweep_points(s.sweep if sweep is None else sweep):
                        cfg = TrainConfig.for_task(
                            t, attention="dense" if v == NO_ATTENTION else v, seed=seed,
                            task_options={**s.task_options, **level},
                            **({"attention_options": dict(opts)} if opts else {}), **_budget(dict(train), point),
                        )
                        if v == NO_ATTENTION:
                            cfg = cfg.baseline()
                        run_id = _run_id(cfg, digests[t], beyond(t, cfg.task_options))
                        specs.append(RunSpec(run_id, t, v, seed, cfg, dict(point), digests[t], dict(level)))
    seen: set[str] = set()  # two points that make one config (a setting the variant ignores) are one run
    costed = next((t for t in names if settings[t].cost and runnable[t]), None)
    cost = None if costed is None else {
        "task": costed, "variants": list(dict.fromkeys(["dense", *runnable[costed]])),
        "lengths": tuple(settings[costed].cost),
        "task_options": {k: v for k, v in settings[costed].task_options.items() if k != "length"},
        "train": dict(settings[costed].train)}
    return Plan([x for x in specs if not (x.run_id in seen or seen.add(x.run_id))], notes, cost)


def check_tasks(specs: Iterable[RunSpec]) -> None:
    """Refuse a grid that cannot run, before it trains: each task of ``specs`` is built once at
    each of its settings (its options, every difficulty level's, the user's file read and parsed),
    so a bad option, an unreadable or one-class file or a level the task cannot hold raises the
    ``ValueError`` that ``attnlab train`` gives, naming the task and level."""
    from .. import tasks as task_registry
    from .board import level_text

    seen: set[str] = set()
    for s in specs:
        key = json.dumps([s.config.task, s.config.task_options], sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        try:
            task_registry.create(s.config.task, **s.config.task_options)
        except (ValueError, TypeError) as e:
            at = f" at level {level_text(s.level)}" if s.level else ""
            raise ValueError(f"{s.task}{at}: {e}") from None


def _runnable(task: str, setting: TaskSetting, variants: list[str], notes: list[str]) -> list[str]:
    """Of ``variants``, those that can run ``task``; a note (added to ``notes``) for each left out
    and why (:func:`unfit_reason`), and for a task without dense, the reference of speed and memory."""
    kept = []
    for v in variants:
        why = unfit_reason(v, task, setting)
        if why is None:
            kept.append(v)
        else:
            notes.append(f"{task} / {v} left out: {why}")
    if kept and "dense" not in kept:
        notes.append(f"{task}: no dense run, so no speed or memory is compared there (dense is the reference)")
    return kept


