"""A cell is one configuration (budgets never merged, seeds counted right), --data with --tasks,
and sweeps: planned per point, chosen on validation, reported at the chosen point with their range."""

import json

import pytest
from typer.testing import CliRunner

from attnlab.arena import plan
from attnlab.arena.report import leaderboard, sweep_text
from attnlab.arena.sweep import best_val, choose, parse_sweep, points
from attnlab.cli import app


def _row(run_id, variant, value, seed=0, seconds=3.0, sweep=None, val=None, lr=1e-3):
    config = {"task": "pos", "attention": variant, "seed": seed, "seconds": seconds, "lr": lr, "steps": 1000000}
    return {"run_id": run_id, "task": "pos", "variant": variant, "seed": seed, "config": config, "status": "done",
            "metric": "token_accuracy", "value": value, "train_seconds": seconds, "steps": 50, "steps_per_second": 10.0,
            "peak_bytes": 1000, "params": 100, "error": None, "sweep": sweep or {},
            "history": [{"step": 50, "val": value if val is None else val, "loss": 0.1, "seconds": seconds}]}


def test_runs_with_different_budgets_are_two_cells_each_with_its_own_seeds():
    """The new user's finding: a 4 s run stored beside a 3 s one was averaged into one cell that
    claimed two seeds though only seed 0 ever ran."""
    board = leaderboard([_row("a", "dense", 0.95, seconds=3.0), _row("b", "dense", 0.90, seconds=4.0)])
    entries = board["tasks"]["pos"]
    assert len(entries) == 2
    assert sorted(e["setting"] for e in entries) == ["seconds=3.0", "seconds=4.0"]
    assert all(e["seeds"] == 1 and e["spread"] is None for e in entries)
    assert {e["value"] for e in entries} == {0.95, 0.90}
    assert sorted(e["budget"] for e in entries) == ["3 s", "4 s"]


def test_two_seeds_of_one_setting_are_one_cell():
    e, = leaderboard([_row("a", "dense", 0.9), _row("b", "dense", 0.8, seed=1)])["tasks"]["pos"]
    assert e["seeds"] == 2 and e["value"] == pytest.approx(0.85) and e["setting"] == ""


def test_report_shows_budgets_apart(tmp_path):
    from attnlab.arena.store import Store

    store = Store(tmp_path / "results.sqlite")
    for r in (_row("a", "dense", 0.95, seconds=3.0), _row("b", "dense", 0.90, seconds=4.0)):
        store.add(r)
    res = CliRunner().invoke(app, ["report", str(tmp_path), "--json"])
    assert res.exit_code == 0, res.output
    board = json.loads(res.stdout)
    assert sorted((e["setting"], e["seeds"]) for e in board["tasks"]["pos"]) == [("seconds=3.0", 1), ("seconds=4.0", 1)]
    res = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert "dense (seconds=3.0)" in res.stdout and "dense (seconds=4.0)" in res.stdout and "budgets differ" in res.stdout


def test_data_is_added_to_the_named_tasks(tmp_path):
    """The new user's finding: --data with --tasks was silently dropped."""
    f = tmp_path / "mine.jsonl"
    f.write_text("".join(json.dumps({"text": f"w{i} x", "label": i % 2}) + "\n" for i in range(40)))
    specs = plan(tasks=["pos"], variants=["dense"], data=str(f))
    assert sorted({s.task for s in specs}) == ["jsonl", "pos"]
    assert next(s for s in specs if s.task == "jsonl").config.task_options["path"] == str(f)


def test_a_sweep_plans_every_point_and_leaves_unswept_ids_alone():
    base = plan(tasks=["pos"], variants=["dense", "linear"])
    swept = plan(tasks=["pos"], variants=["dense", "linear"], sweep={"lr": [1e-3, 3e-3], "batch_size": [8, 16]})
    assert len(swept) == 4 * len(base)
    assert {json.dumps(s.sweep, sort_keys=True) for s in swept} == {json.dumps(p, sort_keys=True) for p in points(
        {"lr": [1e-3, 3e-3], "batch_size": [8, 16]})}
    assert all(s.config.lr == s.sweep["lr"] and s.config.batch_size == s.sweep["batch_size"] for s in swept)
    assert len({s.run_id for s in swept}) == len(swept)
    assert [s.run_id for s in plan(tasks=["pos"], variants=["dense", "linear"], sweep={})] == [s.run_id for s in base]
    assert all(s.sweep == {} for s in base)


def test_the_lra_preset_sweeps_its_long_tasks_and_the_sweep_option_replaces_it():
    specs = plan("lra", tasks=["text"], variants=["dense"])
    assert len({s.config.lr for s in specs}) >= 2 and all("lr" in s.sweep for s in specs)
    assert {s.config.lr for s in plan("lra", tasks=["text"], variants=["dense"], sweep={"lr": [5e-4]})} == {5e-4}
    assert all(not s.sweep for s in plan("lra", tasks=["text"], variants=["dense"], sweep={}))


def test_the_cell_is_chosen_on_validation_and_reported_at_that_point():
    rows = [
        _row("a", "dense", 0.70, sweep={"lr": 1e-3}, val=0.80, lr=1e-3),  # best validation, not best test
        _row("b", "dense", 0.60, seed=1, sweep={"lr": 1e-3}, val=0.78, lr=1e-3),
        _row("c", "dense", 0.90, sweep={"lr": 3e-3}, val=0.50, lr=3e-3),
        _row("d", "dense", 0.88, seed=1, sweep={"lr": 3e-3}, val=0.52, lr=3e-3),
    ]
    key, chosen, table = choose(rows)
    assert json.loads(key) == {"lr": 1e-3} and {r["run_id"] for r in chosen} == {"a", "b"}
    e, = leaderboard(rows)["tasks"]["pos"]
    assert e["value"] == pytest.approx(0.65) and e["seeds"] == 2 and e["spread"] == pytest.approx(0.0707, abs=1e-3)
    assert e["sweep"]["chosen"] == {"lr": 1e-3} and e["sweep"]["low"] == pytest.approx(0.65) and e["sweep"]["high"] == pytest.approx(0.89)
    assert sweep_text(e) == "lr=0.001 of 2: 0.65-0.89"
    assert sorted(e["run_ids"]) == ["a", "b"]


@pytest.mark.parametrize("items, message", [
    (["lr"], "FIELD=V1,V2"),
    (["learning_rate=1"], "not a training setting"),
    (["seed=1,2"], "axis of the grid"),
    (["lr=1e-3", "lr=3e-3"], "given twice"),
    (["lr=1e-3,1e-3"], "repeated"),
    (["lr=fast"], "not a float"),
    (["batch_size=8.5"], "not a int"),
    (["compile=maybe"], "not true or false"),
])
def test_bad_sweeps_are_refused(items, message):
    with pytest.raises(ValueError, match=message):
        parse_sweep(items)


def test_parse_sweep_reads_numbers_and_makes_a_product():
    sweep = parse_sweep(["lr=3e-4,1e-3", "batch_size=8,16"])
    assert sweep == {"lr": [3e-4, 1e-3], "batch_size": [8, 16]} and len(points(sweep)) == 4
    res = CliRunner().invoke(app, ["arena", "--tasks", "pos", "--sweep", "lr=fast"])
    assert res.exit_code != 0 and "not a float" in res.output


def test_a_run_stored_before_the_sweep_is_its_point():
    """The task's own value, run first without a sweep (same run id), joins the swept cell."""
    rows = [_row("own", "dense", 0.70, val=0.70, lr=1e-3), _row("x3", "dense", 0.80, sweep={"lr": 3e-3}, val=0.75, lr=3e-3)]
    e, = leaderboard(rows)["tasks"]["pos"]
    assert e["setting"] == "" and len(e["sweep"]["points"]) == 2 and e["sweep"]["chosen"] == {"lr": 3e-3} and e["value"] == 0.80


def test_best_val_is_the_best_finite_validation_or_none():
    hist = [{"step": 1, "val": 0.5}, {"step": 2, "val": 0.8}, {"step": 3, "val": float("nan")}, {"step": 4, "val": 0.7}]
    assert best_val({"history": hist}) == 0.8 and best_val({"history": []}) is None and best_val({}) is None
