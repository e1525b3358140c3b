"""The arena's results store: one SQLite file (standard library), one row per finished run.

A row is written once, whole, in one transaction, when its run has ended (``done`` with its
metric, or ``failed`` with the error); the run id is the primary key, so a run can never be
stored twice. A run in progress lives only in its checkpoint folder, never in the store: a
crash at any moment leaves complete rows and at most one interrupted run, which the next
``attnlab arena`` resumes from its checkpoint.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

from ..validate import DataError

__all__ = ["COLUMNS", "Store", "task_label"]

COLUMNS = (
    "run_id", "task", "variant", "seed", "config", "status", "metric", "value", "train_seconds", "steps",
    "steps_per_second", "peak_bytes", "params", "error", "finished_at", "history", "test_size", "precision",
    "flop_rate", "peak_fraction", "sweep", "data_sha256", "level", "device",
)
"""The columns of table ``runs`` (``config``: the run's full :class:`attnlab.training.TrainConfig` as JSON;
``history``: its validations as JSON, ``[{"step", "val", "loss", "seconds"}, ...]`` with ``seconds``
the training time so far; ``test_size``: the examples, or nodes, the test score was measured on;
``precision``: ``fp32`` or ``bf16``; ``flop_rate``: FLOP/s of its training steps, ``peak_fraction``
that over the machine's peak in its precision (:class:`attnlab.training.TrainResult`);
``sweep``: the settings of the sweep point the run is, as JSON (``{}``: not swept;
:mod:`attnlab.arena.sweep`); ``data_sha256``: the SHA-256 of the user's file a run read (``jsonl``; None for generated
tasks: :func:`attnlab.tasks.data_digest`); ``level``: the task options of the difficulty level a run is, as JSON
(``{}``: the task has no levels; :attr:`attnlab.arena.TaskSetting.levels`); ``device``: the device it trained on in
words (``cpu``, ``cuda (NVIDIA H100 80GB HBM3)``; empty: the CPU, before the column); stores written before a column
have it added, empty)."""

_ADDED = (("history", "TEXT"), ("test_size", "INTEGER"), ("precision", "TEXT"), ("flop_rate", "REAL"),
          ("peak_fraction", "REAL"), ("sweep", "TEXT"), ("data_sha256", "TEXT"), ("level", "TEXT"), ("device", "TEXT"))
"""Columns added after the first stores were written: a store without them gains them (empty)."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    task TEXT NOT NULL,
    variant TEXT NOT NULL,
    seed INTEGER NOT NULL,
    config TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('done', 'failed')),
    metric TEXT,
    value REAL,
    train_seconds REAL,
    steps INTEGER,
    steps_per_second REAL,
    peak_bytes INTEGER,
    params INTEGER,
    error TEXT,
    finished_at REAL NOT NULL,
    history TEXT,
    test_size INTEGER,
    precision TEXT,
    flop_rate REAL,
    peak_fraction REAL,
    sweep TEXT,
    data_sha256 TEXT,
    level TEXT
)
"""


class Store:
    """The ``results.sqlite`` of an arena folder.

    Args:
        path: the database file (created with its table if missing).
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with self._connect() as con:
                con.execute(_SCHEMA)
                have = {r[1] for r in con.execute("PRAGMA table_info(runs)")}
                for column, kind in _ADDED:
                    if column not in have:  # a store from before the column
                        try:
                            con.execute(f"ALTER TABLE runs ADD COLUMN {column} {kind}")
                        except sqlite3.OperationalError:  # read-only, or another process added it first: rows() copes
                            pass
        except sqlite3.DatabaseError as e:
            raise DataError(f"{self.path} is not an attnlab results store ({e})") from None

    def _connect(self) -> sqlite3.Connection:
        con = sqlite3.connect(self.path, timeout=30)
        con.execute("PRAGMA journal_mode=WAL")
        return con

    def finished(self) -> set[str]:
        """The run ids that have a row (done or failed)."""
        with self._connect() as con:
            return {r[0] for r in con.execute("SELECT run_id FROM runs")}

    def add(self, row: dict) -> bool:
        """Insert one finished run in one transaction; False (nothing written) if its id is
        already stored. ``row`` has :data:`COLUMNS` (``config`` a dict, ``finished_at`` optional)."""
        row = {**row, "config": json.dumps(row["config"], sort_keys=True),
               "finished_at": row.get("finished_at") or time.time(),
               "history": json.dumps(row["history"]) if row.get("history") is not None else None,
               "sweep": json.dumps(row.get("sweep") or {}, sort_keys=True),
               "level": json.dumps(row.get("level") or {}, sort_keys=True)}
        optional = ("error", "metric", "value", "train_seconds", "steps", "steps_per_second", "peak_bytes", "params",
                    *(c for c, _ in _ADDED))
        missing = [c for c in COLUMNS if c not in row and c not in optional]
        if missing:
            raise ValueError(f"a run row needs {', '.join(missing)}")
        if row["status"] not in ("done", "failed"):
            raise ValueError(f"status must be 'done' or 'failed', got {row['status']!r}")
        if row["status"] == "done" and (row.get("metric") is None or row.get("value") is None):
            raise ValueError("a done run needs its metric and value")
        values = [row.get(c) for c in COLUMNS]
        con = self._connect()
        try:
            with con:  # one transaction: the whole row or nothing
                con.execute(f"INSERT INTO runs ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})", values)
            return True
        except sqlite3.IntegrityError:
            return False
        finally:
            con.close()

    def rows(self, *, status: str | None = None) -> list[dict]:
        """Every stored run as a dict (``config`` parsed), in the order they finished."""
        with self._connect() as con:
            con.row_factory = sqlite3.Row
            q = "SELECT * FROM runs" + (" WHERE status = ?" if status else "") + " ORDER BY finished_at"
            out = [dict(r) for r in con.execute(q, (status,) if status else ())]
        for r in out:
            for column, _ in _ADDED[1:]:
                r.setdefault(column, None)
            r["config"] = json.loads(r["config"])
            r["history"] = json.loads(r["history"]) if r.get("history") else []
            r["sweep"] = json.loads(r["sweep"]) if r.get("sweep") else {}
            r["level"] = json.loads(r["level"]) if r.get("level") else {}
        return out

    def remove_failed(self) -> int:
        """Delete the failed runs (so that they are tried again); returns how many."""
        con = self._connect()
        try:
            with con:
                return con.execute("DELETE FROM runs WHERE status = 'failed'").rowcount
        finally:
            con.close()


def task_label(row: dict) -> str:
    """A stored run's task as the leaderboard names it: its name, and for the user's file, the file
    and the first 12 hex digits of its contents' SHA-256 (``"jsonl (mine.jsonl, sha256 1a2b3c4d5e6f)"``):
    runs of two versions of one file are two tasks, never averaged."""
    from ..tasks import data_files

    digest = row.get("data_sha256")
    if not digest:
        return row["task"]
    try:
        files = data_files(row["task"], row["config"].get("task_options") or {})
    except ValueError:  # a task no longer registered
        files = {}
    named = ", ".join(Path(f).name for f in files.values())
    return f"{row['task']} ({named + ', ' if named else ''}sha256 {digest[:12]})"
