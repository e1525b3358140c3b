"""The arena's live grid: the table ``attnlab arena`` redraws while its runs train.

One row per task, one column per variant; a cell shows whether the runs of that pair are queued,
running, failed or stored, and their score by the leaderboard's rule (:func:`attnlab.arena.leaderboard`:
mean over seeds and levels, a sweep's point chosen on validation), counting the runs stored by
earlier calls, with how many of the cell's runs it has while some are still to come. A line under the table follows the
run in progress (step, loss, last validation, time left). :meth:`LiveGrid.on_event` takes the
events of :func:`attnlab.arena.run_grid`; :meth:`LiveGrid.render` draws the current state.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from rich import box
from rich.console import Group
from rich.table import Table

from ..training.config import TIME_BUDGET_STEPS

__all__ = ["LiveGrid", "run_name"]

_FINISHED = ("done", "failed", "stored")


class LiveGrid:
    """The state of an arena's runs, fed by :func:`~attnlab.arena.run_grid`'s events, drawn by :meth:`render`.

    Args:
        specs: the planned runs (:class:`~attnlab.arena.RunSpec`: ``run_id``, ``task``, ``variant``, ``seed``).
        clock: seconds, for the elapsed time and the ETA (default :func:`time.perf_counter`).
        stored: the rows already in the store (:meth:`attnlab.arena.Store.rows`), so that a cell
            counts the runs of earlier calls as the leaderboard does.
    """

    def __init__(self, specs: Iterable, clock: Callable[[], float] = time.perf_counter, stored: Iterable[dict] = ()):
        self.specs = list(specs)
        self.clock = clock
        self.start = clock()
        self.state = {s.run_id: "queued" for s in self.specs}  # queued, running, done, failed or stored
        planned = set(self.state)
        by_id = {s.run_id: s for s in self.specs}
        self.rows: dict = {r["run_id"]: self._full(by_id[r["run_id"]], r) for r in stored if r.get("run_id") in planned}
        self.current = ""  # the line that follows the run in progress
        self.tasks = list(dict.fromkeys(s.task for s in self.specs))
        self.variants = list(dict.fromkeys(s.variant for s in self.specs))
        self._started: dict = {}
        self._validation: dict = {}

    def elapsed(self) -> float:
        """Seconds since the grid was made."""
        return self.clock() - self.start

    def on_event(self, kind: str, spec, **info) -> None:
        """Take one event of :func:`~attnlab.arena.run_grid` (``skip``, ``start``, ``eval``, ``step`` or ``end``)."""
        run = spec.run_id
        if kind == "skip":
            self.state[run] = "stored"
        elif kind == "start":
            self.state[run] = "running"
            self._started[run] = self.clock()
        elif kind == "eval":
            self._validation[run] = info["value"]
        elif kind == "step":
            elapsed = self.clock() - self._started.get(run, self.start)
            eta = elapsed / max(info["step"], 1) * (info["total"] - info["step"])
            step = f"step {info['step']}/{info['total']}"
            seconds = spec.config.seconds
            if seconds is not None:  # time-budgeted: the seconds used of the budget and left (validation not counted)
                eta = max(0.0, seconds - elapsed)
                # the step cap of a time budget is no limit
                of = "" if info["total"] >= TIME_BUDGET_STEPS else f"/{info['total']}"
                step = f"step {info['step']}{of}, {min(elapsed, seconds):.0f} s of {seconds:g} s,"
            val = self._validation.get(run)
            shown = "" if val is None else f", validation {val:.3f}"
            self.current = f"{run_name(spec)}: {step} loss {info['loss']:.4f}{shown}, ETA {eta:.0f} s"
        elif kind == "end":
            row = info["row"]
            self.state[run] = row["status"]
            self.rows[run] = self._full(spec, row)
            self.current = ""

    @staticmethod
    def _full(spec, row: dict) -> dict:
        """A finished run's row with every store column (the spec's task, variant, seed, sweep
        point and level where the row leaves them out), as the leaderboard reads it."""
        from .store import COLUMNS

        sweep = getattr(spec, "sweep", None) or {}
        return {**dict.fromkeys(COLUMNS), "task": spec.task, "variant": spec.variant, "seed": spec.seed,
                "config": dict(sweep), "sweep": sweep, "level": getattr(spec, "level", None) or {}, "history": [],
                "metric": "score", "status": "done", **{k: v for k, v in row.items() if v is not None}}

    def cell(self, task: str, variant: str) -> str:
        """The grid's cell for ``task`` and ``variant`` (over their seeds), with rich markup."""
        specs = [s for s in self.specs if s.task == task and s.variant == variant]
        ids = [s.run_id for s in specs]
        if not ids:  # this variant does not run on this task
            return ""
        states = [self.state[i] for i in ids]
        if "running" in states:
            return "[yellow]running[/]"
        rows = [self.rows[i] for i in ids if i in self.rows]
        if rows:
            from .board import leaderboard

            entries = [e for es in leaderboard(rows)["tasks"].values() for e in es]
            if entries and all(e["value"] is not None for e in entries):
                shown = "  ".join(f"{e['value']:.3f}" for e in entries)  # one per setting the cell holds
                return shown if len(rows) == len(ids) else f"{shown} [dim]({len(rows)}/{len(ids)})[/]"
            if any(r["status"] == "failed" for r in rows):  # a failed run (or level) leaves the cell without a score
                return "[red]failed[/]"
        if all(x in ("done", "stored") for x in states):
            return "stored"
        if "failed" in states:
            return "[red]failed[/]"
        return "[dim]queued[/]"

    def render(self) -> Group:
        """The table (runs finished of all, elapsed seconds and, once a run of this call has ended,
        the time left at the pace so far), then the line of the run in progress."""
        finished = sum(v in _FINISHED for v in self.state.values())
        now = sum(v in ("done", "failed") for v in self.state.values())  # ended in this call (not found stored)
        left = len(self.state) - finished
        eta = f", about {self.elapsed() / now * left:.0f} s left" if now and left else ""
        t = Table(title=f"arena ({finished}/{len(self.state)} runs, {self.elapsed():.0f} s{eta})", box=box.SIMPLE_HEAD)
        t.add_column("task")
        for v in self.variants:
            t.add_column(v, justify="right")
        for task in self.tasks:
            t.add_row(task, *(self.cell(task, v) for v in self.variants))
        return Group(t, self.current)


def run_name(spec) -> str:
    """A run of the grid in a line: ``lookup (keys=8, repeats=32) / dense / seed 0 / lr=0.01``
    (its task, difficulty level, variant, seed and sweep point)."""
    from .board import level_text

    level = getattr(spec, "level", None)
    point = "".join(f" / {k}={v}" for k, v in (getattr(spec, "sweep", None) or {}).items())
    return f"{spec.task}{f' ({level_text(level)})' if level else ''} / {spec.variant} / seed {spec.seed}{point}"
