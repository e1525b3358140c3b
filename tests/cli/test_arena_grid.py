"""attnlab arena refuses a grid that cannot run before it trains, exits non-zero when every run
failed, shows one grid per board, and names each run's level (runs faked: the command's flow is
tested here, not the learning)."""

import dataclasses
import json
import sqlite3
import time

import pytest
from typer.testing import CliRunner

from attnlab.cli import app

LOOKUP = ["arena", "--tasks", "lookup", "--variants", "dense,linear", "--seeds", "0", "--budget-steps", "5"]


@pytest.fixture
def fake_runs(monkeypatch):
    """Runs that finish at once with a score (or fail, where ``fail`` says), and a cost phase that records its calls."""
    import attnlab.arena.cost
    import attnlab.arena.runner

    calls: dict = {"runs": [], "cost": [], "fail": False}

    def run_one(spec, out, **kw):
        calls["runs"].append(spec)
        row = {"run_id": spec.run_id, "task": spec.task, "variant": spec.variant, "seed": spec.seed, "sweep": spec.sweep,
               "config": dataclasses.asdict(spec.config), "data_sha256": spec.data_sha256, "level": spec.level, "finished_at": time.time()}
        if calls["fail"]:
            return {**row, "status": "failed", "error": "RuntimeError: a failure at run time"}
        return {**row, "status": "done", "metric": "query_accuracy", "value": 0.5 + 0.01 * len(calls["runs"]), "train_seconds": 1.0,
                "steps": 5, "steps_per_second": 10.0, "peak_bytes": 1000, "params": 10, "history": []}

    def measure_cost(out, task, variants, **kw):
        calls["cost"].append(task)
        return {}

    monkeypatch.setattr(attnlab.arena.runner, "run_one", run_one)
    monkeypatch.setattr(attnlab.arena.cost, "measure_cost", measure_cost)
    return calls


def _stored(folder):
    if not (folder / "results.sqlite").exists():
        return 0
    with sqlite3.connect(folder / "results.sqlite") as con:
        return con.execute("SELECT COUNT(*) FROM runs").fetchone()[0]


@pytest.mark.parametrize("contents, expected", [
    ('{"text": "a b", "label": "x"}\n' * 100 + "not json\n", "line 101: not valid JSON"),
    ("", "holds no"),
])
def test_a_bad_data_file_is_refused_before_any_run(tmp_path, fake_runs, contents, expected):
    data = tmp_path / "bad.jsonl"
    data.write_text(contents)
    res = CliRunner().invoke(app, ["arena", "--tasks", "jsonl", "--data", str(data), "--variants", "dense", "--seeds", "0",
                                   "--budget-steps", "5", "--out", str(tmp_path / "a")])
    assert res.exit_code == 2, res.output
    assert expected in " ".join(res.output.split()) and res.output.count("error:") == 1
    assert fake_runs["runs"] == [] and _stored(tmp_path / "a") == 0


def test_a_one_class_file_is_refused_before_any_run(tmp_path, fake_runs):
    data = tmp_path / "one.jsonl"
    data.write_text("".join(json.dumps({"text": f"row {i} of words", "label": "x"}) + "\n" for i in range(80)))
    res = CliRunner().invoke(app, ["arena", "--tasks", "jsonl", "--data", str(data), "--variants", "dense", "--seeds", "0",
                                   "--budget-steps", "5", "--out", str(tmp_path / "a")])
    assert res.exit_code == 2 and "every record has the label 'x'" in " ".join(res.output.split()), res.output
    assert fake_runs["runs"] == []


@pytest.mark.parametrize("option, expected", [
    ("lookup.length=512", "lookup at level keys=8, repeats=32: length 512 cannot hold the log"),
    ("lookup.keys=-3", "keys must be a positive int, got -3"),
])
def test_a_task_option_no_level_can_hold_is_refused_before_any_run_and_any_cost(tmp_path, fake_runs, option, expected):
    res = CliRunner().invoke(app, [*LOOKUP, "--task-option", option, "--out", str(tmp_path)])
    assert res.exit_code == 2 and expected in " ".join(res.output.split()), res.output
    assert fake_runs["runs"] == [] and fake_runs["cost"] == [] and not (tmp_path / "results.sqlite").exists()


def test_a_grid_whose_every_run_failed_exits_1_and_measures_no_cost(tmp_path, fake_runs):
    fake_runs["fail"] = True
    res = CliRunner().invoke(app, [*LOOKUP, "--out", str(tmp_path)])
    assert res.exit_code == 1, res.output
    assert "every run of the grid failed (6 runs" in " ".join(res.output.split())
    assert len(fake_runs["runs"]) == 6 and fake_runs["cost"] == []  # the failures are stored and shown, no cost beside them
    assert _stored(tmp_path) == 6 and "a failure at run time" in res.output


def test_progress_lines_name_the_level_and_a_level_given_by_options_is_not_said_to_be_left_out(tmp_path, fake_runs):
    res = CliRunner().invoke(app, [*LOOKUP, "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    for level in ("keys=8, repeats=32", "keys=16, repeats=16", "keys=32, repeats=8"):
        assert f"lookup ({level}) / dense / seed 0: query_accuracy" in text
    assert fake_runs["cost"] == ["lookup"]
    one = CliRunner().invoke(app, [*LOOKUP, "--task-option", "lookup.keys=8", "--task-option", "lookup.repeats=32",
                                   "--out", str(tmp_path / "one")])
    said = " ".join(one.output.split())
    assert one.exit_code == 0 and "are not run" not in said
    assert "keys=8, repeats=32 given, so it runs at that setting alone, in place of its difficulty levels" in said


def test_a_rerun_with_changed_options_shows_its_own_grid_and_counts_the_others(tmp_path, fake_runs):
    first = CliRunner().invoke(app, [*LOOKUP, "--json", "--out", str(tmp_path)])
    assert first.exit_code == 0, first.output
    changed = CliRunner().invoke(app, [*LOOKUP, "--task-option", "lookup.keys=4", "--task-option", "lookup.length=512",
                                       "--task-option", "lookup.repeats=8", "--json", "--out", str(tmp_path)])
    assert changed.exit_code == 0, changed.output
    board = json.loads(changed.stdout[changed.stdout.index("{"):])
    entries = board["tasks"]["lookup"]
    assert sorted(e["variant"] for e in entries) == ["dense", "linear"]  # one entry each: no run of the first grid merged in
    assert all(e["setting"] == "" and "levels" not in e for e in entries)
    assert any("6 stored runs not on this board: 6 of other settings (lookup 6)" in n for n in board["notes"])
    again = CliRunner().invoke(app, [*LOOKUP, "--json", "--out", str(tmp_path)])  # the first command again: its grid alone
    board = json.loads(again.stdout[again.stdout.index("{"):])
    assert [len(e["levels"]) for e in board["tasks"]["lookup"]] == [3, 3] and all(e["setting"] == "" for e in board["tasks"]["lookup"])
    assert all("level" not in e for e in board["tasks"]["lookup"])  # the mean over levels is at no one level
    assert any("2 stored runs not on this board" in n for n in board["notes"])
    assert len(fake_runs["runs"]) == 8  # the rerun trained nothing: its runs were stored


def test_a_changed_data_file_is_a_new_grid_and_its_earlier_version_is_named_not_averaged(tmp_path, fake_runs):
    from tests.cli.conftest import labelled_lines

    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in labelled_lines(80)))
    args = ["arena", "--tasks", "jsonl", "--data", str(data), "--variants", "dense", "--seeds", "0", "--budget-steps", "5", "--json",
            "--out", str(tmp_path / "a")]
    assert CliRunner().invoke(app, args).exit_code == 0
    data.write_text("".join(json.dumps(r) + "\n" for r in labelled_lines(96)))
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    board = json.loads(res.stdout[res.stdout.index("{"):])
    assert len(board["tasks"]) == 1 and [e["tasks"] for e in board["average"]] == [1]
    assert any("1 on an earlier version of mine.jsonl" in n for n in board["notes"])
    from attnlab.arena import build_report
    from attnlab.arena.scope import GRID_FILE

    (tmp_path / "a" / GRID_FILE).unlink()  # a folder from before the grid was kept: every run, less the superseded file's
    _, board = build_report(tmp_path / "a")
    assert len(board["tasks"]) == 1 and any("earlier version of mine.jsonl" in n for n in board["notes"])


def test_a_grid_with_no_run_is_refused_and_the_last_board_stays(tmp_path, fake_runs):
    assert CliRunner().invoke(app, [*LOOKUP, "--out", str(tmp_path)]).exit_code == 0
    grid = (tmp_path / "grid.json").read_text()
    res = CliRunner().invoke(app, ["arena", "--tasks", "lookup", "--variants", "linformer", "--seeds", "0", "--out", str(tmp_path)])
    assert res.exit_code == 2 and "the grid has no run (lookup / linformer left out: linformer has no causal form" in " ".join(
        res.output.split()), res.output
    assert (tmp_path / "grid.json").read_text() == grid
    assert CliRunner().invoke(app, ["report", str(tmp_path)]).exit_code == 0


def test_the_board_shows_the_cost_of_its_own_grid_s_variants(tmp_path, fake_runs):
    from attnlab.arena import build_report
    from attnlab.arena.cost import MODEL_FIELDS, cost_table

    assert CliRunner().invoke(app, [*LOOKUP, "--out", str(tmp_path)]).exit_code == 0
    asked = json.loads((tmp_path / "grid.json").read_text())["cost"]
    model = {k: v for k, v in asked["train"].items() if k in MODEL_FIELDS}
    rows = [{"variant": v, "length": n, "seconds": 0.1, "peak_bytes": 100, "params": 1}
            for v in ("dense", "linear", "performer", "dense_naive") for n in (1024, 2048)]
    table = {"task": "lookup", "key": json.dumps(["lookup", asked["task_options"], model, "cpu", 1], sort_keys=True), "rows": rows}
    (tmp_path / "cost.json").write_text(json.dumps(table))
    _, board = build_report(tmp_path)  # performer was measured by an earlier grid, 2,048 is no length of this one
    assert set(board["cost"]["variants"]) == {"dense", "linear", "dense_naive"} and board["cost"]["lengths"] == [1024]
    other = {**table, "key": json.dumps(["lookup", {"size": 64}, model, "cpu", 1])}
    (tmp_path / "cost.json").write_text(json.dumps(other))
    _, board = build_report(tmp_path)
    assert board["cost"] is None and cost_table(tmp_path) == other  # another model's measurements: kept, not shown
