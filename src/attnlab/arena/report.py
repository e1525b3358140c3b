"""The arena's report: a leaderboard, the Long-Range-Arena chart and attention maps, as a
self-contained ``report.html`` (images inlined, no script, opens offline) plus PNG copies.

Long Range Arena (Tay et al. 2021, https://arxiv.org/abs/2011.04006, Fig. 3) plots each
variant at x = its speed relative to the full Transformer, y = its score, with the bubble's
area proportional to its memory. Here speed is training steps per second relative to
``dense`` on the same task, memory the peak tensor bytes of one training step relative to
``dense``; the averaged chart averages over the tasks where both the variant and dense finished.
"""

from __future__ import annotations

import base64
import html
import json
import math
import statistics
from collections.abc import Iterable
from pathlib import Path

from .charts import label, plot_curves, plot_levels, plot_lra, plot_maps, slug
from .store import Store, task_label
from .sweep import choose

__all__ = ["average_over_tasks", "budget_of", "build_report", "caveats", "label", "leaderboard", "level_names", "level_text",
           "level_values", "plan_notes", "peak_share", "plot_curves", "plot_lra", "plot_maps",
           "setting_of", "sweep_text", "task_budget", "task_label"]


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
    from ..training.config import FORMER_NAMES

    skip = {"seed", *(swept or row.get("sweep") or {})}
    config = {FORMER_NAMES.get(k, k): v for k, v in row["config"].items() if k not in skip}
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


def plan_notes(out: str | Path) -> list[str]:
    """The notes of the plans run in ``out`` (:attr:`attnlab.arena.runner.Plan.notes`: what each
    grid left out and why), kept in ``out/notes.json`` by :func:`attnlab.arena.run_grid`."""
    path = Path(out) / NOTES_FILE
    return json.loads(path.read_text()) if path.exists() else []


NOTES_FILE = "notes.json"


def _cost_section(out: Path, board: dict) -> list[str]:
    """The report's cost section from ``out/cost.json`` (:mod:`attnlab.arena.cost`): the lecture's
    chart at the longest length and a table per length (``[]`` when nothing was measured)."""
    from .cost import REFERENCE, cost_table, plot_cost, ratios

    table = cost_table(out)
    if not table.get("rows"):
        return []
    task = table["task"]
    entries = next((es for t, es in board["tasks"].items() if t == task), [])
    scores = {e["variant"]: e["value"] for e in entries if not e["setting"] and e["value"] is not None}
    png = plot_cost(table, scores, out / "cost.png", title_task=task)
    lengths = sorted({r["length"] for r in table["rows"]})
    parts = [f"<h2>Where efficient attention pays: {html.escape(task)} at {', '.join(f'{n:,}' for n in lengths)} tokens</h2>",
             f"<p>One training step (forward and backward, batch 1, fp32) of {html.escape(task)}'s own model, per variant. "
             f"The chart places each variant at its score (mean over levels and seeds) and its speed relative to the fused dense at "
             f"{lengths[-1]:,} tokens; the bubble is its peak memory relative to the fused dense. Two truths: against the fused dense "
             f"(memory linear in N) no variant is smaller; against {REFERENCE}, the dense that materialises the N x N weights "
             f"(LRA's memory baseline), they all are. Seconds are this machine's ({html.escape(str(table.get('cpu')))}, "
             f"{table.get('threads')} threads); bytes are the same on any machine.</p>", _img(png, "cost chart"),
             "<table><tr><th>variant</th>" + "".join(f"<th>{n:,}: ms</th><th>speed</th><th>MiB</th><th>memory vs dense</th>"
                                                     f"<th>vs {REFERENCE}</th>" for n in lengths) + "</tr>"]
    at = {n: ratios(table, n) for n in lengths}
    for v in dict.fromkeys(r["variant"] for r in table["rows"]):
        cells = []
        for n in lengths:
            r = at[n].get(v)
            if r is None:
                cells.append("<td colspan='5'>-</td>")
                continue
            projected = next((x.get("projected") for x in table["rows"] if x["variant"] == v and x["length"] == n), False)
            ms = "-" if r["seconds"] is None else f"{1000 * r['seconds']:.0f}"
            mib = f"{r['peak_bytes'] / 2**20:,.0f}" + (" (projected)" if projected else "")
            cells.append(f"<td>{ms}</td><td>{_fmt(r['speed'], '.2f')}x</td><td>{mib}</td><td>{_fmt(r['memory'], '.2f')}x</td>"
                         f"<td>{_fmt(r['memory_vs_naive'], '.3f')}x</td>")
        parts.append(f"<tr><td>{html.escape(v)}</td>{''.join(cells)}</tr>")
    parts.append("</table>")
    if any(r.get("projected") for r in table["rows"]):
        parts.append(f"<p>projected: {REFERENCE}'s peak where its step would take tens of seconds and gigabytes, fitted as "
                     "b N + c N^2 through its two longest measured lengths (its N x N tensors are exactly quadratic).</p>")
    return parts


def _differences(settings: list[str]) -> dict[str, str]:
    """Each setting's fields that differ from the others' (``"seconds=4"``), for telling cells apart."""
    if len(settings) < 2:
        return {s: "" for s in settings}
    parsed = {s: json.loads(s) for s in settings}
    keys = sorted({k for c in parsed.values() for k in c if len({json.dumps(p.get(k), sort_keys=True) for p in parsed.values()}) > 1})
    return {s: ", ".join(f"{k}={json.dumps(c.get(k))}" for k in keys) for s, c in parsed.items()}


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
    budget), ``error`` (failed runs: the message), ``caveats`` (:func:`caveats`), ``run_ids``
    (the runs behind the value)."""
    tasks: dict[str, list[dict]] = {}
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
            tasks.setdefault(task, []).append(_entry(variant, labels[setting], rs, rows))
    for entries in tasks.values():
        for e in entries:
            same = [d for d in entries if d["variant"] == "dense" and d["value"] is not None]
            dense = next((d for d in same if d["setting"] == e["setting"]), same[0] if same else None)
            e["speed"] = e["steps_per_second"] / dense["steps_per_second"] if dense and e["steps_per_second"] else None
            e["memory"] = e["peak_bytes"] / dense["peak_bytes"] if dense and e["peak_bytes"] and dense["peak_bytes"] else None
        entries.sort(key=lambda e: (e["value"] is None, -(e["value"] or 0)))
    return {"tasks": tasks, "average": average_over_tasks(tasks)}


def average_over_tasks(tasks: dict[str, list[dict]]) -> list[dict]:
    """The leaderboard's average: each variant (and setting) that finished **every** task of the
    board is ranked by its mean score over them (``ranked`` True); a variant that finished fewer is
    listed after them, unranked, with its mean over its own tasks, their count, and dense's mean over
    those same tasks (``dense_same_tasks``): a mean over fewer tasks is never placed above a full
    one. ``speed`` and ``memory``: geometric means over the tasks where dense was the reference."""
    everyone = len(tasks)
    out = []
    labels = dict.fromkeys((e["variant"], e["setting"]) for es in tasks.values() for e in es)
    for v, setting in labels:
        cells = {t: e for t, es in tasks.items() for e in es if (e["variant"], e["setting"]) == (v, setting) and e["value"] is not None}
        if not cells:
            continue
        timed = [c for c in cells.values() if c["speed"] is not None]
        sized = [c for c in timed if c["memory"]]
        dense = [next((e["value"] for e in tasks[t] if e["variant"] == "dense" and e["value"] is not None), None) for t in cells]
        out.append({
            "variant": v, "setting": setting, "value": statistics.fmean(c["value"] for c in cells.values()), "tasks": len(cells),
            "of": everyone, "ranked": len(cells) == everyone, "task_names": list(cells),
            "speed": math.exp(statistics.fmean(math.log(c["speed"]) for c in timed)) if timed else None,
            "memory": math.exp(statistics.fmean(math.log(c["memory"]) for c in sized)) if sized else None,
            "dense_same_tasks": statistics.fmean(dense) if dense and None not in dense and len(cells) < everyone else None,
        })
    out.sort(key=lambda e: (not e["ranked"], -e["value"]))
    return out


def _entry(variant: str, setting: str, rs: list[dict], rows: list[dict]) -> dict:
    """One leaderboard entry from the runs ``rs`` of one cell (see :func:`leaderboard`): at one
    level, :func:`_level_entry`; at several (a task's difficulty levels), their mean (MAD's rule,
    Poli et al. 2024), with each level's entry in ``levels`` (easiest first) and the spread over
    seeds of each seed's mean over the levels. A level without a score leaves the mean undefined."""
    by_level: dict[str, list[dict]] = {}
    for r in rs:
        by_level.setdefault(json.dumps(r.get("level") or {}, sort_keys=True), []).append(r)
    if len(by_level) == 1 and next(iter(by_level)) == "{}":
        return _level_entry(variant, setting, rs, rows)
    order = sorted(by_level, key=lambda k: [(0, v, "") if isinstance(v, (int, float)) else (1, 0, str(v)) for v in json.loads(k).values()])
    parts = [{**_level_entry(variant, setting, by_level[k], rows), "level": json.loads(k)} for k in order]
    first = parts[0]
    entry = {**first, "levels": parts, "run_ids": [i for p in parts for i in p["run_ids"]],
             "caveats": list(dict.fromkeys(f"{level_text(p['level'])}: {c}" for p in parts for c in p["caveats"]))}
    missing = [p for p in parts if p["value"] is None]
    if missing:
        entry.update(value=None, spread=None, error=f"{level_text(missing[0]['level'])}: {missing[0]['error']}")
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
        sweep=None if not sweeps else {**sweeps[0], "low": min(w["low"] for w in sweeps), "high": max(w["high"] for w in sweeps),
                                       "chosen": sweeps[0]["chosen"] if all(w["chosen"] == sweeps[0]["chosen"] for w in sweeps)
                                       else {k: "by level" for k in sweeps[0]["chosen"]}},
    )
    return entry


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
    entry = {"variant": variant, "setting": setting, "seeds": len({r["seed"] for r in ok}), "sweep": sweep,
             "metric": first["metric"] or (ok[0]["metric"] if ok else None), "budget": budget_of(first["config"]),
             "timed": first["config"].get("seconds") is not None, "caveats": caveats(ok, rows), "run_ids": [r.get("run_id") for r in ok]}
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
        entry.update(value=None, spread=None, steps_per_second=None, peak_bytes=None, params=None, error=rs[0]["error"], precision=None,
                     flop_rate=None, peak_fraction=None)
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

    return json.dumps({FORMER_NAMES.get(k, k): v for k, v in config.items() if k not in ("seed", "seconds", "steps", "epochs", "patience")},
                      sort_keys=True)


def caveats(cell: list[dict], rows: list[dict]) -> list[str]:
    """Why a leaderboard cell's score (its finished runs ``cell``) means less than it seems
    (:mod:`attnlab.training.caveats`): a tiny test split, a time-budgeted run with too few steps,
    or one whose steps per second fell far below other stored runs of the same configuration
    (a busy machine). Rows stored before ``test_size`` existed skip that check."""
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
        return [o["steps_per_second"] for o in rows if o is not r and o["status"] == "done" and _same_setup(o["config"]) == key]

    timed = lambda r: r["config"].get("seconds") is not None  # noqa: E731
    found.append(first(lambda r: few_steps(r["steps"] or 0, timed(r))))
    found.append(first(lambda r: busy(r["steps_per_second"], peers(r)) if timed(r) else None))
    return [c for c in found if c]


def _fmt(x, spec=".3f") -> str:
    return "-" if x is None else format(x, spec)


def _giga(x: float | None) -> float | None:
    return None if x is None else x / 1e9


def peak_share(fraction: float | None, precision: str | None) -> str:
    """``"12% bf16"``: a share of the machine's peak in the run's precision (``-``: not measured)."""
    return "-" if fraction is None else f"{100 * fraction:.0f}% {precision or ''}".strip()


def _img(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _maps_section(out: Path, task: str, rows: list[dict], seed: int) -> list[str]:
    """The report's attention maps of ``task`` (its runs ``rows`` of seed ``seed`` that saved maps; of a
    task with levels, the hardest level's), as HTML parts."""
    from safetensors.torch import load_file

    levels = sorted({json.dumps(r.get("level") or {}) for r in rows},
                    key=lambda k: [v if isinstance(v, (int, float)) else 0 for v in json.loads(k).values()])
    hardest = levels[-1] if levels else "{}"
    maps = {}
    for r in rows:
        f = out / "runs" / r["run_id"] / "attention.safetensors"
        if r["seed"] == seed and json.dumps(r.get("level") or {}) == hardest and f.exists():
            t = load_file(str(f))
            maps[r["variant"]] = [t[k] for k in sorted(t)]
    if not maps:
        return []
    at = f" at {level_text(json.loads(hardest))}" if hardest != "{}" else ""
    png = plot_maps(maps, out / f"attention-{slug(task)}.png",
                    f"{task}{at}: first-layer attention (mean over heads), two test examples, each row scaled to its maximum")
    return ["<p>First-layer attention maps (rows: queries, or only the scored ones where a task scores a few, such as lookup's "
            "reads, over the keys up to the last of them; columns: keys; each row scaled to its own maximum; efficient variants: "
            "the map they apply implicitly, measured with the identity as values).</p>" + _img(png, f"attention maps {task}")]


def build_report(out: str | Path) -> tuple[Path, dict]:
    """Read ``out/results.sqlite``, write ``out/lra.png``, ``out/curves.png``, ``out/attention-<task>.png`` and the
    self-contained ``out/report.html``; returns the HTML path and the leaderboard."""
    out = Path(out)
    if not (out / "results.sqlite").exists():
        raise ValueError(f"{out} holds no results.sqlite (the --out folder of 'attnlab arena')")
    rows = Store(out / "results.sqlite").rows()
    if not rows:
        raise ValueError(f"{out / 'results.sqlite'} holds no finished run yet")
    board = leaderboard(rows)
    from .cost import cost_summary, cost_table

    board["cost"] = cost_summary(cost_table(out))
    board["notes"] = notes = plan_notes(out)
    lra = plot_lra(board, out / "lra.png")
    behind = {i for es in board["tasks"].values() for e in es for i in e["run_ids"]}  # the runs each entry reports
    labels = {i: label(e) for es in board["tasks"].values() for e in es for i in e["run_ids"]}
    curves = plot_curves([r for r in rows if r["run_id"] in behind], out / "curves.png", labels)
    levels = plot_levels(board, out / "levels.png")
    cost = _cost_section(out, board)
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>attnlab arena</title><style>",
        "body{font-family:sans-serif;margin:2em;max-width:1400px;color:#222}table{border-collapse:collapse;margin:1em 0}",
        "td,th{border:1px solid #ccc;padding:4px 10px;text-align:right}td:first-child,th:first-child{text-align:left}",
        "img{max-width:100%}.failed{color:#a00}.caveat{color:#b60}</style></head><body>",
        "<h1>attnlab arena</h1>",
        (f"<p>{len(rows)} runs ({sum(r['status'] == 'done' for r in rows)} done, {sum(r['status'] == 'failed' for r in rows)} failed). "
         "Speed: training steps per second relative to dense on the same task; memory: peak tensor bytes of one training step "
         "relative to dense.</p>"),
        *(["<p>Left out of the grid:</p><ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>"] if notes else []),
        *cost,
        *(["<h2>Score against difficulty</h2><p>A task measured at several levels: each variant's score at each (mean over "
           "seeds); its score on the task is the mean over the levels (as MAD, Poli et al. 2024).</p>", _img(levels, "difficulty")]
          if levels else []),
        "<h2>Score against speed at each task's own length (the Long Range Arena chart)</h2>", _img(lra, "Long Range Arena chart"),
        ("<p>GFLOP/s: floating-point operations of the training steps per second (counted once per run by PyTorch's "
         "FlopCounterMode); of peak: that over this machine's matrix-product peak in the run's precision (fp32 or bf16). "
         "+- sd: the standard deviation of the score over seeds (one seed: -).</p>"),
        ("<p>Budgets per task: " + "; ".join(f"{html.escape(t)}: {html.escape(task_budget(es))}" for t, es in board["tasks"].items())
         + ". A budget in steps is step-budgeted: the same scores on any machine. A budget in seconds is time-budgeted: every "
         "variant trains for the same seconds with the learning rate annealed over them, so its scores are this machine's.</p>"),
        *(["<h2>Score against training time</h2><p>Validation score at each validation, against the seconds spent "
           "in training steps so far (one line per setting: its first seed, its easiest level).</p>", _img(curves, "score against time")]
          if curves else []),
        ("<h2>Average over tasks</h2><p>Ranked: the variants that ran every task of the grid, by their mean over those tasks. "
         "Below them, unranked: a variant that ran fewer (no causal form for a causal task, no baseline for a task), with its "
         "mean over its own tasks and dense's mean over the same ones.</p>"
         "<table><tr><th>variant</th><th>mean score</th><th>tasks</th><th>dense on the same tasks</th><th>speed</th><th>memory</th></tr>"),
    ]
    for e in board["average"]:
        same = "" if e.get("ranked", True) else _fmt(e.get("dense_same_tasks"))
        name = label(e) + ("" if e.get("ranked", True) else " (unranked)")
        parts.append(f"<tr><td>{html.escape(name)}</td><td>{e['value']:.3f}</td><td>{e['tasks']} of {e.get('of', e['tasks'])}</td>"
                     f"<td>{same}</td><td>{_fmt(e['speed'], '.2f')}x</td><td>{_fmt(e['memory'], '.2f')}x</td></tr>")
    parts.append("</table>")
    for task, entries in board["tasks"].items():
        metric = next((e["metric"] for e in entries if e["metric"]), "score")
        swept = any(e.get("sweep") for e in entries)
        levels = level_names(entries)
        parts.append(f"<h2>{html.escape(task)} ({html.escape(task_budget(entries))} per run)</h2><table><tr><th>variant</th>"
                     f"<th>{html.escape(metric)}{' (mean over levels)' if levels else ''}</th><th>+- sd</th><th>seeds</th>"
                     + "".join(f"<th>{html.escape(n)}</th>" for n in levels)
                     + ("<th>chosen on validation (of the sweep; its test range)</th>" if swept else "")
                     + "<th>steps/s</th><th>GFLOP/s</th><th>of peak</th><th>speed</th><th>peak MiB</th><th>memory</th>"
                     "<th>parameters</th></tr>")
        for e in entries:
            if e["value"] is None:
                parts.append(f"<tr class='failed'><td>{html.escape(label(e))}</td><td colspan='{10 + swept + len(levels)}'>failed: "
                             f"{html.escape(str(e['error']))}</td></tr>")
                continue
            mib = e["peak_bytes"] / 2**20 if e["peak_bytes"] else None
            mark = (f" <span class='caveat' title='{html.escape(' / '.join(e['caveats']), quote=True)}'>&#9888;</span>"
                    if e["caveats"] else "")
            parts.append(f"<tr><td>{html.escape(label(e))}</td><td>{e['value']:.3f}{mark}</td><td>{_fmt(e['spread'])}</td><td>{e['seeds']}</td>"
                         + "".join(f"<td>{_fmt(x)}</td>" for x in level_values(e, levels))
                         + (f"<td>{html.escape(sweep_text(e))}</td>" if swept else "")
                         + f"<td>{_fmt(e['steps_per_second'], '.1f')}</td><td>{_fmt(_giga(e['flop_rate']), '.1f')}</td>"
                         f"<td>{peak_share(e['peak_fraction'], e['precision'])}</td><td>{_fmt(e['speed'], '.2f')}x</td>"
                         f"<td>{_fmt(mib, '.1f')}</td><td>{_fmt(e['memory'], '.2f')}x</td><td>{e['params']:,}</td></tr>")
        parts.append("</table>")
        notes = [f"<li>{html.escape(label(e))}: {html.escape(c)}</li>" for e in entries for c in e.get("caveats", [])]
        if notes:
            parts.append("<p class='caveat'>&#9888; marks a score that means less than it seems:</p><ul>" + "".join(notes) + "</ul>")
        shown = [r for r in rows if task_label(r) == task and r["run_id"] in behind]
        parts += _maps_section(out, task, shown, min(x["seed"] for x in rows))
    parts.append("</body></html>")
    page = out / "report.html"
    tmp = page.with_name("report.html.tmp")
    tmp.write_text("\n".join(parts), encoding="utf-8")
    tmp.replace(page)
    return page, board
