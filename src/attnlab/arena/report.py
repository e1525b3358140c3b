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
from pathlib import Path

from ..validate import DataError
from .board import leaderboard, level_names, level_text, level_values, sweep_text, task_budget
from .charts import label, plot_curves, plot_levels, plot_lra, plot_maps, slug
from .scope import grid_cost, scoped
from .store import Store, task_label

__all__ = ["NOTES_FILE", "build_report", "peak_share", "plan_notes"]


def plan_notes(out: str | Path) -> list[str]:
    """The notes of the last plan run in ``out`` (:attr:`attnlab.arena.Plan.notes`: what the
    grid left out and why), kept in ``out/notes.json`` by :func:`attnlab.arena.run_grid`."""
    path = Path(out) / NOTES_FILE
    return json.loads(path.read_text()) if path.exists() else []


NOTES_FILE = "notes.json"


def _cost_section(out: Path, board: dict, table: dict) -> list[str]:
    """The report's cost section from the board's measurements ``table`` (``out/cost.json``'s for its grid,
    :mod:`attnlab.arena.cost`): the lecture's chart at the longest length and a table per length (``[]``: none)."""
    from .charts import plot_cost
    from .cost import REFERENCE, ratios

    if not board.get("cost"):
        return []
    task = table["task"]
    entries = next((es for t, es in board["tasks"].items() if t == task), [])
    scores = {e["variant"]: e["value"] for e in entries if not e["setting"] and e["value"] is not None}
    png = plot_cost(table, scores, out / "cost.png", title_task=task)
    lengths = sorted({r["length"] for r in table["rows"]})
    parts = [f"<h2>Where efficient attention pays: {html.escape(task)} at "
             f"{', '.join(f'{n:,}' for n in lengths)} tokens</h2>",
             f"<p>One training step (forward and backward, batch 1, fp32) of {html.escape(task)}'s own model, per "
             "variant. The chart places each variant at its score (mean over levels and seeds) and its speed relative "
             f"to the fused dense at {lengths[-1]:,} tokens; the bubble is its peak memory relative to the fused "
             "dense. Two truths: against the fused dense (memory linear in N) no variant is smaller; against "
             f"{REFERENCE}, the dense that materialises the N x N weights (LRA's memory baseline), they all are. "
             f"Seconds are this machine's ({html.escape(str(table.get('cpu')))}, {_threads(table.get('threads'))}); "
             "bytes are the same on any machine.</p>", _img(png, "cost chart"),
             "<table><tr><th>variant</th>"
             + "".join(f"<th>{n:,}: ms</th><th>speed</th><th>MiB</th><th>memory vs dense</th><th>vs {REFERENCE}</th>"
                       for n in lengths) + "</tr>"]
    at = {n: ratios(table, n) for n in lengths}
    for v in dict.fromkeys(r["variant"] for r in table["rows"]):
        cells = []
        for n in lengths:
            r = at[n].get(v)
            if r is None:
                cells.append("<td colspan='5'>-</td>")
                continue
            projected = next((x.get("projected") for x in table["rows"] if x["variant"] == v
                              and x["length"] == n), False)
            ms = "-" if r["seconds"] is None else f"{1000 * r['seconds']:.0f}"
            mib = f"{r['peak_bytes'] / 2**20:,.0f}" + (" (projected)" if projected else "")
            cells.append(f"<td>{ms}</td><td>{_times(r['speed'])}</td><td>{mib}</td><td>{_times(r['memory'])}</td>"
                         f"<td>{_times(r['memory_vs_naive'], '.3f')}</td>")
        parts.append(f"<tr><td>{html.escape(v)}</td>{''.join(cells)}</tr>")
    parts.append("</table>")
    if any(r.get("projected") for r in table["rows"]):
        parts.append(f"<p>projected: {REFERENCE}'s peak where its step would take tens of seconds and gigabytes, "
                     "fitted as b N + c N^2 through its two longest measured lengths (its N x N tensors are "
                     "exactly quadratic).</p>")
    return parts


def _threads(n) -> str:
    return f"{n} thread{'' if n == 1 else 's'}"


def _fmt(x, spec=".3f") -> str:
    return "-" if x is None else format(x, spec)


def _times(x, spec=".2f") -> str:
    """A ratio: ``1.23x``, ``-`` when unknown (a projected row has no seconds, so no speed)."""
    return "-" if x is None else f"{format(x, spec)}x"


def _giga(x: float | None) -> float | None:
    return None if x is None else x / 1e9


def peak_share(fraction: float | None, precision: str | None) -> str:
    """``"12% bf16"``: a share of the machine's peak in the run's precision (``-``: not measured, or
    above 100 %, which only a peak timed under another load gives: :func:`attnlab.arena.board.caveats`)."""
    return "-" if fraction is None or fraction > 1 else f"{100 * fraction:.0f}% {precision or ''}".strip()


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
                    f"{task}{at}: first-layer attention (mean over heads), two test examples, each row "
                    "scaled to its maximum")
    return ["<p>First-layer attention maps (rows: queries, or only the scored ones where a task scores a few, such as "
            "lookup's reads, over the keys up to the last of them; columns: keys; each row scaled to its own maximum; "
            "efficient variants: the map they apply implicitly, measured with the identity as values).</p>"
            + _img(png, f"attention maps {task}")]


def _task_section(out: Path, task: str, entries: list[dict], shown: list[dict], seed: int) -> list[str]:
    """A task's part of the report: its table (a column per difficulty level, the sweep's choice),
    its caveats and its attention maps (the runs ``shown`` of seed ``seed``)."""
    parts: list[str] = []
    metric = next((e["metric"] for e in entries if e["metric"]), "score")
    swept = any(e.get("sweep") for e in entries)
    levels = level_names(entries)
    parts.append(f"<h2>{html.escape(task)} ({html.escape(task_budget(entries))} per run)</h2><table><tr>"
                 f"<th>variant</th><th>{html.escape(metric)}{' (mean over levels)' if levels else ''}</th>"
                 "<th>+- sd</th><th>seeds</th>"
                 + "".join(f"<th>{html.escape(n)}</th>" for n in levels)
                 + ("<th>chosen on validation (of the sweep; its test range)</th>" if swept else "")
                 + "<th>steps/s</th><th>GFLOP/s</th><th>of peak</th><th>speed</th><th>peak MiB</th><th>memory</th>"
                 "<th>parameters</th></tr>")
    for e in entries:
        if e["value"] is None:
            parts.append(f"<tr class='failed'><td>{html.escape(label(e))}</td><td "
                         f"colspan='{10 + swept + len(levels)}'>failed: {html.escape(str(e['error']))}</td></tr>")
            continue
        mib = e["peak_bytes"] / 2**20 if e["peak_bytes"] else None
        mark = (f" <span class='caveat' title='{html.escape(' / '.join(e['caveats']), quote=True)}'>&#9888;</span>"
                if e["caveats"] else "")
        parts.append(f"<tr><td>{html.escape(label(e))}</td><td>{e['value']:.3f}{mark}</td><td>{_fmt(e['spread'])}</td>"
                     f"<td>{e['seeds']}</td>"
                     + "".join(f"<td>{_fmt(x)}</td>" for x in level_values(e, levels))
                     + (f"<td>{html.escape(sweep_text(e))}</td>" if swept else "")
                     + f"<td>{_fmt(e['steps_per_second'], '.1f')}</td><td>{_fmt(_giga(e['flop_rate']), '.1f')}</td>"
                     f"<td>{peak_share(e['peak_fraction'], e['precision'])}</td><td>{_times(e['speed'])}</td>"
                     f"<td>{_fmt(mib, '.1f')}</td><td>{_times(e['memory'])}</td><td>{e['params']:,}</td></tr>")
    parts.append("</table>")
    notes = [f"<li>{html.escape(label(e))}: {html.escape(c)}</li>" for e in entries for c in e.get("caveats", [])]
    if notes:
        parts.append("<p class='caveat'>&#9888; marks a score that means less than it seems:</p><ul>"
                     + "".join(notes) + "</ul>")
    return parts + _maps_section(out, task, shown, seed)


def build_report(out: str | Path) -> tuple[Path, dict]:
    """Read ``out/results.sqlite``, write ``out/lra.png``, ``out/curves.png``, ``out/attention-<task>.png`` and the
    self-contained ``out/report.html``; returns the HTML path and the leaderboard."""
    out = Path(out)
    if not (out / "results.sqlite").exists():
        raise DataError(f"{out} holds no results.sqlite (the --out folder of 'attnlab arena')")
    stored = Store(out / "results.sqlite").rows()
    rows, others = scoped(stored, out)
    if not rows:
        raise DataError(f"{out / 'results.sqlite'} holds no finished run "
                        + ("yet" if not stored else f"of the last grid ({others})"))
    board = leaderboard(rows)
    from .cost import REFERENCE, cost_summary, cost_table, measures

    table, asked = cost_table(out), grid_cost(out)
    # another grid's measurements: not this board's
    if asked is not False and (asked is None or not measures(table, asked)):
        table = {}
    elif asked:  # the grid's variants and lengths of them (a grid of more variants before measured more)
        table = {**table, "rows": [r for r in table.get("rows", []) if r["variant"] in {*asked["variants"], REFERENCE}
                                   and r["length"] in asked["lengths"]]}
    board["cost"] = cost_summary(table)
    board["notes"] = notes = plan_notes(out) + ([others] if others else [])
    lra = plot_lra(board, out / "lra.png")
    behind = {i for es in board["tasks"].values() for e in es for i in e["run_ids"]}  # the runs each entry reports
    labels = {i: label(e) for es in board["tasks"].values() for e in es for i in e["run_ids"]}
    curves = plot_curves([r for r in rows if r["run_id"] in behind], out / "curves.png", labels)
    levels = plot_levels(board, out / "levels.png")
    cost = _cost_section(out, board, table)
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>attnlab arena</title><style>",
        "body{font-family:sans-serif;margin:2em;max-width:1400px;color:#222}"
        "table{border-collapse:collapse;margin:1em 0}",
        "td,th{border:1px solid #ccc;padding:4px 10px;text-align:right}td:first-child,th:first-child{text-align:left}",
        "img{max-width:100%}.failed{color:#a00}.caveat{color:#b60}</style></head><body>",
        "<h1>attnlab arena</h1>",
        (f"<p>{len(rows)} runs ({sum(r['status'] == 'done' for r in rows)} done, "
         f"{sum(r['status'] == 'failed' for r in rows)} failed). Speed: training steps per second relative to dense on "
         "the same task; memory: peak tensor bytes of one training step relative to dense.</p>"),
        *(["<p>Left out:</p><ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>"] if notes else []),
        *cost,
        *(["<h2>Score against difficulty</h2><p>A task measured at several levels: each variant's score at each (mean "
           "over seeds); its score on the task is the mean over the levels (as MAD, Poli et al. 2024).</p>",
           _img(levels, "difficulty")]
          if levels else []),
        "<h2>Score against speed at each task's own length (the Long Range Arena chart)</h2>",
        _img(lra, "Long Range Arena chart"),
        ("<p>GFLOP/s: floating-point operations of the training steps per second (counted once per run by PyTorch's "
         "FlopCounterMode); of peak: that over this machine's matrix-product peak in the run's precision (fp32 or "
         "bf16). +- sd: the standard deviation of the score over seeds (one seed: -).</p>"),
        ("<p>Budgets per task: "
         + "; ".join(f"{html.escape(t)}: {html.escape(task_budget(es))}" for t, es in board["tasks"].items())
         + ". A budget in steps is step-budgeted: the same scores on any machine. A budget in seconds is "
         "time-budgeted: every variant trains for the same seconds with the learning rate annealed over them, so its "
         "scores are this machine's.</p>"),
        *(["<h2>Score against training time</h2><p>Validation score at each validation, against the seconds spent "
           "in training steps so far (one line per setting: its first seed, its easiest level).</p>",
           _img(curves, "score against time")]
          if curves else []),
        ("<h2>Average over tasks</h2><p>Ranked: the variants that ran every task of the grid, by their mean over those "
         "tasks. Below them, unranked: a variant that ran fewer (no causal form for a causal task, no baseline for a "
         "task), with its mean over its own tasks and dense's mean over the same ones.</p>"
         "<table><tr><th>variant</th><th>mean score</th><th>tasks</th><th>dense on the same tasks</th><th>speed</th>"
         "<th>memory</th></tr>"),
    ]
    for e in board["average"]:
        same = "" if e.get("ranked", True) else _fmt(e.get("dense_same_tasks"))
        name = label(e) + ("" if e.get("ranked", True) else " (unranked)")
        parts.append(f"<tr><td>{html.escape(name)}</td><td>{e['value']:.3f}</td><td>{e['tasks']} of "
                     f"{e.get('of', e['tasks'])}</td><td>{same}</td><td>{_times(e['speed'])}</td>"
                     f"<td>{_times(e['memory'])}</td></tr>")
    parts.append("</table>")
    for task, entries in board["tasks"].items():
        parts += _task_section(out, task, entries, [r for r in rows if task_label(r) == task and r["run_id"] in behind],
                               min(x["seed"] for x in rows))
    parts.append("</body></html>")
    page = out / "report.html"
    tmp = page.with_name("report.html.tmp")
    tmp.write_text("\n".join(parts), encoding="utf-8")
    tmp.replace(page)
    return page, board
