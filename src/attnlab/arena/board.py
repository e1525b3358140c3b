"""The arena's leaderboard: per task, one entry per variant and setting (the mean over seeds,
a sweep's point chosen on validation, the mean over difficulty levels), speed and memory relative
to dense, caveats, and the average over tasks that ranks only the variants that ran them all.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable

from .store import task_label
from .sweep import choose

__all__ = ["average_over_tasks", "budget_of", "caveats", "leaderboard", "level_names", "level_text", "level_values",
           "setting_of", "sweep_text", "task_budget"]


def budget_of(config: dict) -> str:
    """How a run was limited, in words: ``"60 s"`` (time-budgeted: this machine's) or ``"400 steps"``."""
    if config.get("seconds") is not None:
        return f"{config['seconds']:g} s"
    if config.get("steps") is not None:
        return f"{config['steps']} steps"
    return f"{config.get('epochs') or 10} epochs"


def sweep_text(entry: dict) -> str:
    """``"lr=0.01 of 3: 0.31-0.93"``: an entry's chosen sweep point, the number of points and the
    range of their mean test scores (``""``: not swept)."""
    sw = entry.get("sweep")
    if not sw:
        return ""
    chosen = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in sw["chosen"].items())
    return f"{chosen} of {len(sw['points'])}: {sw['low']:.2f}-{sw['high']:.2f}"


def task_budget(entries: list[dict]) -> str:
    """The budget of a task's finished entries in words (of all, when none finished), or ``"budgets
    differ"`` when they do (each entry's setting says how)."""
    budgets = {e["budget"] for e in entries if e["value"] is not None} or {e["budget"] for e in entries}
    return budgets.pop() if len(budgets) == 1 else "budgets differ"


def setting_of(row: dict, swept: Iterable[str] = ()) -> str:
    """A run's setting: its configuration less its seed, the swept fields (``swept``, default
    its own sweep's) and the task options of its difficulty level (``row["level"]``; JSON, sizes
    under their current names, :data:`attnlab.training.config.FORMER_NAMES`). Runs of one setting
    differ only in their seed, sweep point and level; runs of two settings are never averaged."""
    from ..training.config import FORMER_NAMES, LATER_FIELDS

    skip = {"seed", *(swept or row.get("sweep") or {})}
    # a field added since: its value of then
    config = {**LATER_FIELDS, **{FORMER_NAMES.get(k, k): v for k, v in row["config"].items()}}
    config = {k: v for k, v in config.items() if k not in skip}
    level = row.get("level") or {}
    if level and isinstance(config.get("task_options"), dict):
        config["task_options"] = {k: v for k, v in config["task_options"].items() if k not in level}
    return json.dumps(config, sort_keys=True)


def level_text(level: dict) -> str:
    """A difficulty level in words: ``"keys=8, repeats=32"`` (``""``: no level)."""
    return ", ".join(f"{k}={v}" for k, v in level.items())


def level_names(entries: list[dict]) -> list[str]:
    """The difficulty levels of a task's entries, in words, easiest first (``[]``: none)."""
    return list(dict.fromkeys(level_text(p["level"]) for e in entries for p in e.get("levels") or []))


def level_values(entry: dict, names: list[str]) -> list[float | None]:
    """An entry's score at each of the levels ``names`` (None where it has none)."""
    got = {level_text(p["level"]): p["value"] for p in entry.get("levels") or []}
    return [got.get(n) for n in names]


def _leaves(config: dict) -> dict[str, str]:
    """A setting's fields as ``name -> value`` in words, nested options flattened (``task_options``'
    ``keys`` is ``keys``, the name a user gives it)."""
    out = {}
    for k, v in config.items():
        if isinstance(v, dict) and k.endswith("_options"):
            out.update({f"{kk}": json.dumps(vv) if isinstance(vv, (dict, list)) else str(vv) for kk, vv in v.items()})
        else:
            out[k] = json.dumps(v) if isinstance(v, (dict, list)) else str(v)
    return out


def _differences(settings: list[str], most: int = 3) -> dict[str, str]:
    """Each setting's fields that differ from the others', in a few words (``"keys=4, length=512"``;
    ``default`` where a setting leaves the field to the task; at most ``most`` fields, then a count)."""
    if len(settings) < 2:
        return {s: "" for s in settings}
    parsed = {s: _leaves(json.loads(s)) for s in settings}
    keys = sorted({k for c in parsed.values() for k in c if len({p.get(k) for p in parsed.values()}) > 1})
    shown, rest = keys[:most], len(keys) - most

    def words(c: dict) -> str:
        return ", ".join(f"{k}={c.get(k, 'default')}" for k in shown) + (f", {rest} more" if rest > 0 else "")

    return {s: words(c) for s, c in parsed.items()}


def leaderboard(rows: list[dict]) -> dict:
    """``{"tasks": {task: [entry, ...]}, "average": [entry, ...]}``.

    A cell is one task, one variant and one **setting** (:func:`setting_of`): runs that differ in
    anything but the seed (budget, precision, ...) are never averaged together; when a variant has
    several settings on a task, each is an entry and its ``setting`` names what differs
    (``"seconds=4"``; ``""`` when the variant has one). A cell run as a sweep
    (:mod:`attnlab.arena.sweep`) reports its point with the best mean validation score.

    An entry has ``variant``, ``setting``, ``value`` (mean test score over seeds, at the chosen
    point), ``spread`` (the seeds' sample standard deviation; None with one seed), ``seeds``
    (distinct seeds behind the value), ``sweep`` (None, or ``{"chosen": settings, "points":
    [{"point", "val", "value", "seeds"}, ...], "low", "high"}``: every point's mean validation and
    test scores, and the lowest and highest test means: the sensitivity to the swept setting),
    ``speed`` and ``memory`` relative to dense of the same setting (None without one),
    ``flop_rate`` (FLOP/s) and ``peak_fraction`` (of the machine's peak in the run's
    ``precision``), ``params``, ``metric``, ``budget`` (:func:`budget_of`), ``timed`` (a time
    budget), ``device`` (where its runs trained, in words), ``error`` (failed runs: the message),
    ``caveats`` (:func:`caveats`), ``run_ids`` (the runs behind the value)."""
    tasks: dict[str, list[dict]] = {}
    rows = _with_levels(rows)
    known = {}  # per task, every level its runs were planned at
    for r in rows:
        if r.get("level"):
            known.setdefault(task_label(r), {})[json.dumps(r["level"], sort_keys=True)] = r["level"]
    swept: dict[tuple[str, str], set[str]] = {}  # per task and variant, every field a sweep of it varied
    for r in rows:
        swept.setdefault((task_label(r), r["variant"]), set()).update(r.get("sweep") or {})
    cells: dict[tuple[str, str], dict[str, list[dict]]] = {}
    for r in rows:
        names = swept[(task_label(r), r["variant"])]
        if names:  # a run stored before the sweep, at one of its values, is that point of it
            r = {**r, "sweep": {k: r["config"].get(k) for k in sorted(names)}}
        cells.setdefault((task_label(r), r["variant"]), {}).setdefault(setting_of(r, names), []).append(r)
    for (task, variant), by_setting in cells.items():
        labels = _differences(list(by_setting))
        for setting, rs in by_setting.items():
            # a cell of levels has them all
            levels = list(known.get(task, {}).values()) if any(r.get("level") for r in rs) else None
            tasks.setdefault(task, []).append(_entry(variant, labels[setting], rs, rows, levels))
    for entries in tasks.values():
        for e in entries:
            same = [d for d in entries if d["variant"] == "dense" and d["value"] is not None]
            dense = next((d for d in same if d["setting"] == e["setting"]), same[0] if same else None)
            e["speed"] = e["steps_per_second"] / dense["steps_per_second"] if dense and e["steps_per_second"] else None
            e["memory"] = (e["peak_bytes"] / dense["peak_bytes"] if dense and e["peak_bytes"] and dense["peak_bytes"]
                           else None)
        entries.sort(key=lambda e: (e["value"] is None, -(e["value"] or 0)))
    return {"tasks": tasks, "average": average_over_tasks(tasks)}


def _with_levels(rows: list[dict]) -> list[dict]:
    """The rows, where a run stored without a level (planned by a task option that set exactly a
    level's options) takes the level of its task whose options its own contain: it is that run."""
    levels: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("level") and r["level"] not in levels.setdefault(r["task"], []):
            levels[r["task"]].append(r["level"])
    out = []
    for r in rows:
        if not r.get("level") and levels.get(r["task"]):
            opts = r["config"].get("task_options") or {}
            hit = next((lv for lv in levels[r["task"]] if all(opts.get(k) == v for k, v in lv.items())), None)
            r = {**r, "level": hit} if hit else r
        out.append(r)
    return out


def average_over_tasks(tasks: dict[str, list[dict]]) -> list[dict]:
    """The leaderboard's average: each variant (and setting) that finished **every** task of the
    board is ranked by its mean score over them (``ranked`` True); a variant that finished fewer is
    listed after them, unranked, with its mean over its own tasks, their count, and dense's mean over
    those same tasks (``dense_same_tasks``): a mean over fewer tasks is never placed above a full
    one. ``speed`` and ``memory``: geometric means over the tasks where dense was the reference."""
    everyone = sum(any(e["value"] is not None for e in es) for es in tasks.values())  # tasks where some run finished
    out = []
    labels = dict.fromkeys((e["variant"], e["setting"]) for es in tasks.values() for e in es)
    for v, setting in labels:
        cells = {t: e for t, es in tasks.items() for e in es if (e["variant"], e["setting"]) == (v, setting)
                 and e["value"] is not None}
        if not cells:
            continue
        timed = [c for c in cells.values() if c["speed"] is not None]
        sized = [c for c in timed if c["memory"]]
        dense = [next((e["value"] for e in sorted(tasks[t], key=lambda d: d["setting"] != setting)
                       if e["variant"] == "dense" and e["value"] is not None), None) for t in cells]
        out.append({
            "variant": v, "setting": setting, "value": statistics.fmean(c["value"] for c in cells.values()),
            "tasks": len(cells), "of": everyone, "ranked": len(cells) == everyone, "task_names": list(cells),
            "speed": math.exp(statistics.fmean(math.log(c["speed"]) for c in timed)) if timed else None,
            "memory": math.exp(statistics.fmean(math.log(c["memory"]) for c in sized)) if sized else None,
            "dense_same_tasks": (statistics.fmean(dense) if dense and None not in dense and len(cells) < everyone
                                 else None),
        })
    out.sort(key=lambda e: (not e["ranked"], -e["value"]))
    return out


def _entry(variant: str, setting: str, rs: list[dict], rows: list[dict], levels: list[dict] | None = None) -> dict:
    """One leaderboard entry from the runs ``rs`` of one cell (see :func:`leaderboard`): at one
    level, :func:`_level_entry`; at several (``levels``: the task's difficulty levels), their mean
    (MAD's rule, Poli et al. 2024), with each level's entry in ``levels`` (easiest first) and the
    spread over seeds of each seed's mean over the levels. A level without a score (failed, or
    not run) leaves the mean undefined; a sweep's range is over each point's mean over the levels."""
    by_level: dict[str, list[dict]] = {json.dumps(lv, sort_keys=True): [] for lv in levels or []}
    for r in rs:
        by_level.setdefault(json.dumps(r.get("level") or {}, sort_keys=True), []).append(r)
    if len(by_level) == 1 and next(iter(by_level)) == "{}":
        return _level_entry(variant, setting, rs, rows)
    order = sorted(by_level, key=lambda k: [(0, v, "") if isinstance(v, (int, float)) else (1, 0, str(v))
                                            for v in json.loads(k).values()])
    parts = [{**_level_entry(variant, setting, by_level[k], rows), "level": json.loads(k)} if by_level[k] else
             {**_level_entry(variant, setting, rs[:1], rows), "level": json.loads(k), "value": None, "spread": None,
              "seeds": 0, "run_ids": [], "caveats": [], "error": "no finished run at this level"} for k in order]
    first = {k: v for k, v in parts[0].items() if k != "level"}  # the mean over the levels is at no one level
    entry = {**first, "levels": parts, "run_ids": [i for p in parts for i in p["run_ids"]],
             "caveats": list(dict.fromkeys(f"{level_text(p['level'])}: {c}" for p in parts for c in p["caveats"]))}
    missing = [p for p in parts if p["value"] is None]
    if missing:
        entry.update(value=None, spread=None, error=f"{level_text(missing[0]['level'])}: {missing[0]['error']}",
                     steps_per_second=None, peak_bytes=None, flop_rate=None, peak_fraction=None, sweep=None)
        return entry
    by_id = {r.get("run_id"): r for r in rs}
    per_seed: dict[int, list[float]] = {}
    for p in parts:
        for i in p["run_ids"]:
            per_seed.setdefault(by_id[i]["seed"], []).append(by_id[i]["value"])
    seed_means = [statistics.fmean(v) for v in per_seed.values() if len(v) == len(parts)]
    sweeps = [p["sweep"] for p in parts if p.get("sweep")]
    entry.update(
        value=statistics.fmean(p["value"] for p in parts), spread=_spread(seed_means), seeds=len(seed_means),
        steps_per_second=statistics.fmean(p["steps_per_second"] for p in parts),
        peak_bytes=max(p["peak_bytes"] or 0 for p in parts) or None,
        flop_rate=_mean_of(parts, "flop_rate"), peak_fraction=_mean_of(parts, "peak_fraction"),
        sweep=_levels_sweep(sweeps),
    )
    return entry


def _levels_sweep(sweeps: list[dict]) -> dict | None:
    """A cell's sweep over its levels: each point's mean validation and test scores over the levels,
    the range of those means (the sensitivity to the swept setting of the task's score), and the
    chosen point (``"by level"`` where the levels chose differently)."""
    if not sweeps:
        return None
    means: dict[str, list[dict]] = {}
    for w in sweeps:
        for p in w["points"]:
            means.setdefault(json.dumps(p["point"], sort_keys=True), []).append(p)
    points = [{"point": json.loads(k), "value": statistics.fmean(p["value"] for p in ps),
               "val": statistics.fmean(p["val"] for p in ps) if all(p["val"] is not None for p in ps) else None,
               "seeds": min(p["seeds"] for p in ps)} for k, ps in means.items()]
    same = all(w["chosen"] == sweeps[0]["chosen"] for w in sweeps)
    return {"chosen": sweeps[0]["chosen"] if same else {k: "by level" for k in sweeps[0]["chosen"]}, "points": points,
            "low": min(p["value"] for p in points), "high": max(p["value"] for p in points)}


def _level_entry(variant: str, setting: str, rs: list[dict], rows: list[dict]) -> dict:
    """The entry of the runs ``rs`` of one cell at one level (see :func:`leaderboard`)."""
    done = [r for r in rs if r["status"] == "done"]
    swept = any(r.get("sweep") for r in rs)
    sweep = None
    ok = done
    if swept and done:
        chosen, ok, points = choose(done)
        means = [p["value"] for p in points]
        sweep = {"chosen": json.loads(chosen), "points": points, "low": min(means), "high": max(means)}
    first = (ok or rs)[0]
    by_size = sorted(rs, key=lambda r: [r["config"].get(k) or 0 for k in ("seconds", "steps", "epochs")])
    budgets = list(dict.fromkeys(budget_of(r["config"]) for r in by_size))
    budget = budget_of(first["config"]) if len(budgets) == 1 else " or ".join(budgets) + " (swept)"
    entry = {"variant": variant, "setting": setting, "seeds": len({r["seed"] for r in ok}), "sweep": sweep,
             "metric": first["metric"] or (ok[0]["metric"] if ok else None), "budget": budget,
             "timed": first["config"].get("seconds") is not None, "caveats": caveats(ok, rows),
             "run_ids": [r.get("run_id") for r in ok],
             "device": next((r.get("device") for r in (ok or rs) if r.get("device")), "cpu")}
    if ok:
        values = [r["value"] for r in ok]
        entry.update(
            value=statistics.fmean(values), spread=_spread(values),
            steps_per_second=sum(r["steps_per_second"] or 0 for r in ok) / len(ok),
            peak_bytes=max(r["peak_bytes"] or 0 for r in ok) or None,
            params=ok[0]["params"], error=None, precision=ok[0].get("precision"),
            flop_rate=_mean_of(ok, "flop_rate"), peak_fraction=_mean_of(ok, "peak_fraction"),
        )
    else:
        entry.update(value=None, spread=None, steps_per_second=None, peak_bytes=None, params=None, error=rs[0]["error"],
                     precision=None, flop_rate=None, peak_fraction=None)
    return entry


def _spread(values: list[float]) -> float | None:
    """The sample standard deviation of the seeds' scores: None with one seed, NaN when one
    diverged (a NaN or infinite score)."""
    if len(values) < 2:
        return None
    if not all(math.isfinite(v) for v in values):
        return math.nan
    return statistics.stdev(values)


def _mean_of(rows: list[dict], key: str) -> float | None:
    """The mean of ``key`` over the rows that have it (None: none has; stores from before the column)."""
    got = [r[key] for r in rows if r.get(key) is not None]
    return statistics.fmean(got) if got else None


def _same_setup(config: dict) -> str:
    """A run's configuration less its seed and budget: runs with the same key train the same model
    on the same task, so they should make the same steps per second (rows stored before the sizes
    were renamed hold them under their earlier names: :data:`attnlab.training.config.FORMER_NAMES`)."""
    from ..training.config import FORMER_NAMES

    return json.dumps({FORMER_NAMES.get(k, k): v for k, v in config.items()
                       if k not in ("seed", "seconds", "steps", "epochs", "patience")},
                      sort_keys=True)


def caveats(cell: list[dict], rows: list[dict]) -> list[str]:
    """Why a leaderboard cell's score (its finished runs ``cell``) means less than it seems
    (:mod:`attnlab.training.caveats`): a tiny test split, a time-budgeted run with too few steps,
    or one whose steps per second fell far below other stored runs of the same configuration
    (a busy machine), or a share of the machine's peak above 100 %. Rows stored before ``test_size`` existed skip that
    check."""
    from ..training.caveats import busy, few_steps, tiny_test

    sizes = [r["test_size"] for r in cell if r.get("test_size") is not None]
    found = [tiny_test(min(sizes)) if sizes else None]

    def first(rule) -> str | None:  # the rule's caveat for the first run of the cell it holds for, naming its seed
        for r in cell:
            if (c := rule(r)) is not None:
                return c + (f" (seed {r['seed']})" if len(cell) > 1 else "")
        return None

    def peers(r) -> list[float]:
        key = _same_setup(r["config"])
        return [o["steps_per_second"] for o in rows if o is not r and o["status"] == "done"
                and _same_setup(o["config"]) == key]

    over = max((r.get("peak_fraction") or 0 for r in cell), default=0)
    if over > 1:  # FLOP/s over the peak measured at another time: the two were timed under different loads
        found.append(f"its share of this machine's peak ({100 * over:.0f}%) is above 100%: the peak and its steps were "
                     "timed under different loads (other work on the cores), so the share is not shown")
    timed = lambda r: r["config"].get("seconds") is not None  # noqa: E731
    found.append(first(lambda r: few_steps(r["steps"] or 0, timed(r))))
    found.append(first(lambda r: busy(r["steps_per_second"], peers(r)) if timed(r) else None))
    return [c for c in found if c]
