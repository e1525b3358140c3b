"""The results store: whole rows, never twice, failures kept with their message."""

import sqlite3

import pytest

from attnlab.arena.store import COLUMNS, Store


def _row(run_id="a1", status="done", **kw):
    base = {"run_id": run_id, "task": "pos", "variant": "dense", "seed": 0, "config": {"task": "pos", "lr": 0.002},
            "status": status, "metric": "token_accuracy", "value": 0.9, "train_seconds": 2.0, "steps": 10,
            "steps_per_second": 5.0, "peak_bytes": 1000, "params": 123}
    return {**base, **kw}


def test_a_run_is_stored_once_whole(tmp_path):
    store = Store(tmp_path / "r.sqlite")
    assert store.add(_row()) is True
    assert store.add(_row(value=0.1)) is False  # same id: refused, the first row kept
    (row,) = store.rows()
    assert row["value"] == 0.9 and row["config"] == {"task": "pos", "lr": 0.002} and set(row) == set(COLUMNS)
    assert store.finished() == {"a1"}
    with sqlite3.connect(tmp_path / "r.sqlite") as con:
        assert con.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 1


def test_failures_are_rows_and_can_be_retried(tmp_path):
    store = Store(tmp_path / "r.sqlite")
    store.add(_row("b", status="failed", metric=None, value=None, error="ValueError: no causal form"))
    store.add(_row("c"))
    assert [r["error"] for r in store.rows(status="failed")] == ["ValueError: no causal form"]
    assert store.remove_failed() == 1 and store.finished() == {"c"}


def test_incomplete_or_bad_rows_are_refused(tmp_path):
    store = Store(tmp_path / "r.sqlite")
    with pytest.raises(ValueError, match="metric and value"):
        store.add(_row(value=None))
    with pytest.raises(ValueError, match="status"):
        store.add(_row(status="running"))
    assert store.rows() == []
    (tmp_path / "junk.sqlite").write_text("this is not a database, just text " * 50)
    with pytest.raises(ValueError, match="not an attnlab results store"):
        Store(tmp_path / "junk.sqlite")


def test_history_round_trips_and_an_old_store_gains_the_column(tmp_path):
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as con:  # the table as stores before histories had it
        con.execute("CREATE TABLE runs (run_id TEXT PRIMARY KEY, task TEXT NOT NULL, variant TEXT NOT NULL, seed INTEGER NOT NULL,"
                    " config TEXT NOT NULL, status TEXT NOT NULL, metric TEXT, value REAL, train_seconds REAL, steps INTEGER,"
                    " steps_per_second REAL, peak_bytes INTEGER, params INTEGER, error TEXT, finished_at REAL NOT NULL)")
        con.execute("INSERT INTO runs VALUES ('old', 'pos', 'dense', 0, '{}', 'done', 'acc', 0.5, 1, 1, 1, 1, 1, NULL, 1.0)")
    store = Store(path)
    hist = [{"step": 5, "val": 0.25, "loss": 1.5, "seconds": 0.75}]
    store.add(_row("new", history=hist))
    rows = {r["run_id"]: r for r in store.rows()}
    assert rows["old"]["history"] == [] and rows["old"]["value"] == 0.5
    assert rows["new"]["history"] == hist
    assert rows["old"]["precision"] is None and rows["old"]["peak_fraction"] is None  # the columns of later issues, empty
    store.add(_row("fast", precision="bf16", flop_rate=2.5e10, peak_fraction=0.06))
    fast = next(r for r in store.rows() if r["run_id"] == "fast")
    assert (fast["precision"], fast["flop_rate"], fast["peak_fraction"]) == ("bf16", 2.5e10, 0.06)
