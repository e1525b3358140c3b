"""eval --json names the size after its split, predict warns of labels the model never saw, and a
time-budgeted run shows its seconds instead of its step cap (issue 40, findings 9a, 9b, 9e)."""

import json
import types

from rich.progress import Progress

from attnlab.cli import app
from tests.cli.conftest import labelled_lines
from tests.cli.helpers import runner


def test_eval_json_names_the_size_after_the_split(runs):
    val = json.loads(runner.invoke(app, ["eval", str(runs["pos"]), "--split", "val", "--json"]).stdout)
    assert val["split"] == "val" and val["val_size"] > 0 and "test_size" not in val and val["val_unit"] == "examples"
    test = json.loads(runner.invoke(app, ["eval", str(runs["pos"]), "--json"]).stdout)
    assert test["test_size"] > 0 and test["test_unit"] == "examples"  # the test split keeps the key train --json and the arena use


def test_predict_warns_of_labels_the_model_never_saw(runs, tmp_path):
    rows = labelled_lines(4)
    rows[1]["label"], rows[3]["label"] = "bird", "fish"
    data = tmp_path / "unseen.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = runner.invoke(app, ["predict", str(runs["jsonl"]), str(data)])
    assert res.exit_code == 0, res.output
    warned = [line for line in res.stderr.splitlines() if line.startswith("warning:")]
    assert len(warned) == 1 and "never saw in training" in warned[0] and warned[0].endswith(": bird, fish"), res.stderr
    quiet = runner.invoke(app, ["predict", str(runs["jsonl"]), str(runs["data"])])
    assert quiet.exit_code == 0 and "never saw" not in quiet.stderr


def test_a_time_budgeted_run_shows_its_seconds_not_its_step_cap(monkeypatch, capsys):
    from attnlab.cli import training_bar as train_cli
    from attnlab.training.config import TIME_BUDGET_STEPS

    now = [100.0]
    monkeypatch.setattr(train_cli, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    with Progress(disable=False) as bar:  # a terminal's bar
        meter = train_cli.TrainingBar(bar, "pos transformer", 30.0)
        meter.on_step(1, TIME_BUDGET_STEPS, 2.0)
        now[0] += 12
        meter.on_step(21, TIME_BUDGET_STEPS, 1.0)
        task = bar.tasks[0]
        assert task.total == 30.0 and task.completed == 12.0 and "step 21, 12 s of 30 s, loss=1.0000" in task.description
    now[0] = 100.0
    with Progress(disable=True) as bar:  # a log file: one plain line per validation
        meter = train_cli.TrainingBar(bar, "pos transformer", 30.0)
        meter.on_step(1, TIME_BUDGET_STEPS, 2.0)
        now[0] += 12
        meter.on_step(21, TIME_BUDGET_STEPS, 1.0)
        meter.on_eval(21, 0.5)
    line = capsys.readouterr().err
    assert "pos transformer: step 21, 12 s of 30 s, loss 1.0000 val 0.5000" in line and str(TIME_BUDGET_STEPS) not in line
