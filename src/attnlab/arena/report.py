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

from .charts import label, plot_curves, plot_lra, plot_maps, slug
from .store import Store, task_label
from .sweep import choose

__all__ = ["budget_of", "build_report", "caveats", "label", "leaderboard", "peak_share", "plot_curves", "plot_lra", "plot_maps",
           "setting_of", "sweep_text", "task_budget", "task_label"]


def budget_of(config: dict) -> str:
    """How a run was limited, in words: ``"60 s"`` (time-budgeted) or ``"400 steps"``."""
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
    """A run's setting: its configuration less its seed and the swept fields (``swept``, default
    its own sweep's; JSON, sizes under their current names,
    :data:`attnlab.training.config.FORMER_NAMES`). Runs of one setting differ only in their seed and
    sweep point; runs of two settings are never averaged."""
    from ..training.config import FORMER_NAMES

    skip = {"seed", *(swept or row.get("sweep") or {})}
    return json.dumps({FORMER_NAMES.get(k, k): v for k, v in row["config"].items() if k not in skip}, sort_keys=True)


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
    average = []
    labels = dict.fromkeys((e["variant"], e["setting"]) for es in tasks.values() for e in es)
    for v, setting in labels:
        cells_ = [e for es in tasks.values() for e in es
                  if (e["variant"], e["setting"]) == (v, setting) and e["value"] is not None and e["speed"] is not None]
        if not cells_:
            continue
        average.append({
            "variant": v, "setting": setting, "value": sum(c["value"] for c in cells_) / len(cells_), "tasks": len(cells_),
            "speed": math.exp(sum(math.log(c["speed"]) for c in cells_) / len(cells_)),
            "memory": math.exp(sum(math.log(c["memory"]) for c in cells_ if c["memory"]) / max(1, sum(1 for c in cells_ if c["memory"])))
            if any(c["memory"] for c in cells_) else None,
        })
    average.sort(key=lambda e: -e["value"])
    return {"tasks": tasks, "average": average}


def _entry(variant: str, setting: str, rs: list[dict], rows: list[dict]) -> dict:
    """One leaderboard entry from the runs ``rs`` of one cell (see :func:`leaderboard`)."""
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
    """The report's attention maps of ``task`` (its runs ``rows`` of seed ``seed`` that saved maps), as HTML parts."""
    from safetensors.torch import load_file

    maps = {}
    for r in rows:
        f = out / "runs" / r["run_id"] / "attention.safetensors"
        if r["seed"] == seed and f.exists():
            t = load_file(str(f))
            maps[r["variant"]] = [t[k] for k in sorted(t)]
    if not maps:
        return []
    png = plot_maps(maps, out / f"attention-{slug(task)}.png", f"{task}: first-layer attention (mean over heads), two test examples")
    return ["<p>First-layer attention maps (rows: queries, columns: keys; efficient variants: the map they apply "
            "implicitly, measured with the identity as values).</p>" + _img(png, f"attention maps {task}")]


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
    lra = plot_lra(board, out / "lra.png")
    behind = {i for es in board["tasks"].values() for e in es for i in e["run_ids"]}  # the runs each entry reports
    curves = plot_curves([r for r in rows if r["run_id"] in behind], out / "curves.png")
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>attnlab arena</title><style>",
        "body{font-family:sans-serif;margin:2em;max-width:1400px;color:#222}table{border-collapse:collapse;margin:1em 0}",
        "td,th{border:1px solid #ccc;padding:4px 10px;text-align:right}td:first-child,th:first-child{text-align:left}",
        "img{max-width:100%}.failed{color:#a00}.caveat{color:#b60}</style></head><body>",
        "<h1>attnlab arena</h1>",
        (f"<p>{len(rows)} runs ({sum(r['status'] == 'done' for r in rows)} done, {sum(r['status'] == 'failed' for r in rows)} failed). "
         "Speed: training steps per second relative to dense on the same task; memory: peak tensor bytes of one training step "
         "relative to dense.</p>"),
        "<h2>Score against speed (the Long Range Arena chart)</h2>", _img(lra, "Long Range Arena chart"),
        ("<p>GFLOP/s: floating-point operations of the training steps per second (counted once per run by PyTorch's "
         "FlopCounterMode); of peak: that over this machine's matrix-product peak in the run's precision (fp32 or bf16). "
         "+- sd: the standard deviation of the score over seeds (one seed: -).</p>"),
        ("<p>Budgets per task: " + "; ".join(f"{html.escape(t)}: {html.escape(task_budget(es))}" for t, es in board["tasks"].items())
         + ". A budget in seconds is time-budgeted (every variant trains for the same seconds: the fair comparison on "
         "a CPU, not bitwise reproducible); a budget in steps is step-budgeted (reproducible).</p>"),
        *(["<h2>Score against training time</h2><p>Validation score at each validation, against the seconds spent "
           "in training steps so far: which variant is ahead at every budget.</p>", _img(curves, "score against time")]
          if curves else []),
        ("<h2>Average over tasks</h2><p>Each variant's mean over the tasks it completed (a variant with no causal form "
         "cannot run a causal task: its count of tasks is smaller, and its mean is not comparable with a full row).</p>"
         "<table><tr><th>variant</th><th>mean score</th><th>tasks</th><th>speed</th><th>memory</th></tr>"),
    ]
    for e in board["average"]:
        parts.append(f"<tr><td>{html.escape(label(e))}</td><td>{e['value']:.3f}</td><td>{e['tasks']}</td>"
                     f"<td>{_fmt(e['speed'], '.2f')}x</td><td>{_fmt(e['memory'], '.2f')}x</td></tr>")
    parts.append("</table>")
    for task, entries in board["tasks"].items():
        metric = next((e["metric"] for e in entries if e["metric"]), "score")
        swept = any(e.get("sweep") for e in entries)
        parts.append(f"<h2>{html.escape(task)} ({html.escape(task_budget(entries))} per run)</h2><table><tr><th>variant</th>"
                     f"<th>{html.escape(metric)}</th><th>+- sd</th><th>seeds</th>"
                     + ("<th>chosen on validation (of the sweep; its test range)</th>" if swept else "")
                     + "<th>steps/s</th><th>GFLOP/s</th><th>of peak</th><th>speed</th><th>peak MiB</th><th>memory</th>"
                     "<th>parameters</th></tr>")
        for e in entries:
            if e["value"] is None:
                parts.append(f"<tr class='failed'><td>{html.escape(label(e))}</td><td colspan='{10 + swept}'>failed: "
                             f"{html.escape(str(e['error']))}</td></tr>")
                continue
            mib = e["peak_bytes"] / 2**20 if e["peak_bytes"] else None
            mark = (f" <span class='caveat' title='{html.escape(' / '.join(e['caveats']), quote=True)}'>&#9888;</span>"
                    if e["caveats"] else "")
            parts.append(f"<tr><td>{html.escape(label(e))}</td><td>{e['value']:.3f}{mark}</td><td>{_fmt(e['spread'])}</td><td>{e['seeds']}</td>"
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
