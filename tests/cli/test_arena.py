"""attnlab arena and report, and the live grid the arena redraws."""

import io
from types import SimpleNamespace

import pytest
from rich.console import Console

from attnlab.arena.live import LiveGrid
from attnlab.cli import app
from tests.cli.helpers import runner


@pytest.mark.slow
def test_arena_runs_stores_reports_and_skips_on_rerun(tmp_path, monkeypatch):
    import sqlite3

    from typer.testing import CliRunner

    from attnlab.arena import PRESETS, Preset, TaskSetting
    from attnlab.cli import app

    # the default preset, shrunk: pos on 400 sentences for 40 steps (the command's path, not the learning, is tested here)
    monkeypatch.setitem(PRESETS, "quick", Preset({"pos": TaskSetting({"size": 400}, {"steps": 40, "eval_every": 20, "embed_dim": 32})}))
    args = ["arena", "--tasks", "pos", "--variants", "dense", "--out", str(tmp_path)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "pos (token_accuracy" in res.output and "step-budgeted" in res.output and (tmp_path / "report.html").exists()
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0
    with sqlite3.connect(tmp_path / "results.sqlite") as con:
        assert con.execute("SELECT COUNT(*), MIN(status) FROM runs").fetchone() == (1, "done")
    (tmp_path / "report.html").unlink()
    rebuilt = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert rebuilt.exit_code == 0 and (tmp_path / "report.html").exists()
    bad = CliRunner().invoke(app, ["arena", "--variants", "fast", "--out", str(tmp_path)])
    assert bad.exit_code == 2 and "unknown variant 'fast'" in bad.output
    nodata = CliRunner().invoke(app, ["arena", "--data", str(tmp_path / "none.jsonl"), "--out", str(tmp_path)])
    assert nodata.exit_code == 1 and "no such file" in " ".join(nodata.output.split())
    missing = CliRunner().invoke(app, ["report", str(tmp_path / "none")])
    assert missing.exit_code == 1 and "no results.sqlite" in " ".join(missing.output.split())


def _text(grid: LiveGrid) -> str:
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(grid.render())
    return console.export_text()


def test_live_grid_follows_the_runner_events():
    specs = [SimpleNamespace(run_id=f"{t}-{v}-{s}", task=t, variant=v, seed=s, config=SimpleNamespace(seconds=None))
             for t in ("pos", "recall") for v in ("dense", "local") for s in (0, 1)]
    now = [100.0]
    grid = LiveGrid(specs, clock=lambda: now[0])
    assert grid.tasks == ["pos", "recall"] and grid.variants == ["dense", "local"]
    assert grid.cell("pos", "dense") == "[dim]queued[/]" and "0/8 runs, 0 s" in _text(grid)
    pos_dense = specs[:2]
    grid.on_event("start", pos_dense[0])
    grid.on_event("eval", pos_dense[0], step=5, value=0.5)
    now[0] += 10
    grid.on_event("step", pos_dense[0], step=10, total=30, loss=1.25)
    assert grid.cell("pos", "dense") == "[yellow]running[/]"
    assert "pos / dense / seed 0: step 10/30 loss 1.2500, validation 0.500, ETA 20 s" in _text(grid)
    grid.on_event("end", pos_dense[0], row={"status": "done", "value": 0.75})
    assert grid.current == "" and grid.cell("pos", "dense") == "0.750 [dim](1/2)[/]"  # seed 1 still to run
    grid.on_event("end", pos_dense[1], row={"status": "done", "value": 0.25})
    assert grid.cell("pos", "dense") == "0.500"  # the mean over the seeds, as the leaderboard
    for spec in specs[2:4]:
        grid.on_event("skip", spec)
    assert grid.cell("pos", "local") == "stored"
    grid.on_event("end", specs[4], row={"status": "failed", "value": None})
    assert grid.cell("recall", "dense") == "[red]failed[/]"
    now[0] += 5
    assert grid.elapsed() == 15 and "5/8 runs, 15 s, about 15 s left" in " ".join(_text(grid).split())  # 3 ended in 15 s, 3 to go


def test_live_grid_leaves_blank_the_cells_a_task_does_not_run_and_counts_down_a_time_budget():
    timed = SimpleNamespace(config=SimpleNamespace(seconds=20.0))
    specs = [SimpleNamespace(run_id="a", task="text", variant="dense_naive", seed=0, **vars(timed)),
             SimpleNamespace(run_id="b", task="recall", variant="dense", seed=0, config=SimpleNamespace(seconds=None))]
    now = [0.0]
    grid = LiveGrid(specs, clock=lambda: now[0])
    assert grid.cell("recall", "dense_naive") == "" and grid.cell("text", "dense") == ""
    grid.on_event("start", specs[0])
    now[0] += 5
    grid.on_event("step", specs[0], step=10, total=1_000_000, loss=1.0)
    assert "ETA 15 s" in _text(grid)


def test_live_grid_shows_a_time_budget_not_its_step_cap():
    """Issue 40: a time-budgeted run read "step 21/1000000" (the step cap of a time budget)."""
    from attnlab.training.config import TIME_BUDGET_STEPS

    specs = [SimpleNamespace(run_id="t", task="text", variant="dense", seed=0, config=SimpleNamespace(seconds=30.0)),
             SimpleNamespace(run_id="s", task="text", variant="local", seed=0, config=SimpleNamespace(seconds=30.0))]
    now = [0.0]
    grid = LiveGrid(specs, clock=lambda: now[0])
    grid.on_event("start", specs[0])
    now[0] += 12
    grid.on_event("step", specs[0], step=21, total=TIME_BUDGET_STEPS, loss=1.0)
    assert "text / dense / seed 0: step 21, 12 s of 30 s, loss 1.0000, ETA 18 s" in _text(grid)
    assert str(TIME_BUDGET_STEPS) not in _text(grid)
    grid.on_event("start", specs[1])  # --steps beside --seconds: both limits shown
    now[0] += 5
    grid.on_event("step", specs[1], step=40, total=400, loss=2.0)
    assert "text / local / seed 0: step 40/400, 5 s of 30 s, loss 2.0000, ETA 25 s" in _text(grid)


def test_live_grid_shows_a_sweep_s_best_point_and_the_point_running():
    """A swept cell's points differ on purpose: the board shows the best so far, not their mean."""
    specs = [SimpleNamespace(run_id=f"r{i}", task="lookup", variant="dense", seed=0, config=SimpleNamespace(seconds=None),
                             sweep={"lr": lr}) for i, lr in enumerate((0.01, 0.003))]
    grid = LiveGrid(specs, clock=lambda: 0.0)
    grid.on_event("end", specs[0], row={"status": "done", "value": 0.9})
    grid.on_event("start", specs[1])
    grid.on_event("step", specs[1], step=1, total=10, loss=1.0)
    assert "lookup / dense / seed 0 / lr=0.003: step 1/10" in _text(grid)
    grid.on_event("end", specs[1], row={"status": "done", "value": 0.5})
    assert grid.cell("lookup", "dense") == "0.900"  # no validation history: the first point, as the leaderboard chooses


def test_live_grid_follows_the_leaderboard_rule_with_the_runs_stored_before():
    """Issue 50: the live grid's "best" counted only the runs trained in this call and one seed
    (best 0.546 beside the leaderboard's 0.675 over two seeds); a sweep's point is the one chosen
    on validation, not the best test score."""
    from attnlab.arena.report import leaderboard

    specs = [SimpleNamespace(run_id=f"r{seed}{i}", task="lookup", variant="dense", seed=seed, config=SimpleNamespace(seconds=None),
                             sweep={"lr": lr}, level={}) for seed in (0, 1) for i, lr in enumerate((0.01, 0.003))]
    hist = lambda val: [{"step": 10, "val": val, "loss": 1.0, "seconds": 1.0}]  # noqa: E731
    rows = [{"run_id": "r00", "status": "done", "value": 0.9, "history": hist(0.6)},
            {"run_id": "r01", "status": "done", "value": 0.7, "history": hist(0.8)},
            {"run_id": "r10", "status": "done", "value": 0.8, "history": hist(0.5)}]
    full = [LiveGrid._full(next(s for s in specs if s.run_id == r["run_id"]), r) for r in rows]
    grid = LiveGrid(specs, clock=lambda: 0.0, stored=full)
    assert grid.cell("lookup", "dense") == "0.700 [dim](3/4)[/]"  # lr=0.003 chosen on validation; its one seed so far
    last = {"run_id": "r11", "status": "done", "value": 0.6, "history": hist(0.9)}
    grid.on_event("end", specs[3], row=last)
    board = leaderboard([*full, LiveGrid._full(specs[3], last)])
    assert grid.cell("lookup", "dense") == f"{board['tasks']['lookup'][0]['value']:.3f}" == "0.650"


def test_a_damaged_store_is_one_line_not_a_traceback(tmp_path):
    (tmp_path / "results.sqlite").write_text("not a database")
    for args in (["arena", "--out", str(tmp_path), "--tasks", "listops", "--variants", "dense"], ["report", str(tmp_path)]):
        res = runner.invoke(app, args)
        said = " ".join(res.output.split())
        assert res.exit_code == 1, res.output
        assert "is not an attnlab results store" in said and "Traceback" not in said and not isinstance(res.exception, ValueError)


def test_the_leaderboard_shows_a_failure_s_whole_reason_at_the_console_s_width(capsys, monkeypatch):
    """Issue 40: a failure's reason was cut at 60 characters even on a 200-column terminal."""
    from attnlab.arena.report import leaderboard
    from attnlab.cli.arena import _print_leaderboard
    from attnlab.cli.common import out

    config = {"task": "pos", "attention": "dense", "seed": 0, "seconds": None, "steps": 40, "lr": 0.001}
    done = {"task": "pos", "variant": "dense", "seed": 0, "status": "done", "metric": "accuracy", "value": 0.9, "steps": 40,
            "steps_per_second": 10.0, "peak_bytes": 1, "params": 1, "config": config, "error": None, "test_size": 500}
    reason = ("ValueError: linformer needs max_len at least the longest sequence of the task (4096), got max_len=1024; "
              "give --attention-option max_len=4096 [or more]")
    failed = {**done, "variant": "linformer", "status": "failed", "value": None, "error": reason,
              "config": {**config, "attention": "linformer"}}
    monkeypatch.setattr(out, "width", 200)
    _print_leaderboard(leaderboard([done, failed]))
    lines = capsys.readouterr().out.splitlines()
    assert any(line.strip() == f"failed linformer: {reason}" for line in lines), lines  # whole, on one line of 200 columns
    assert any(line.split()[:2] == ["linformer", "failed"] for line in lines)  # the row in the table
