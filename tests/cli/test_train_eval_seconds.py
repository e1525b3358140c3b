"""train's result line gives the run's seconds of training (a resume, its own too), eval --json
labels its seconds as the evaluation's, and eval refuses --index without --plot (issue 58,
findings 2a-2c)."""

import json

import pytest

from attnlab.cli import app
from attnlab.training import TrainConfig, load_checkpoint, train
from tests.cli.helpers import runner

TINY = ["--size", "64", "--eval-every", "2", "--embed-dim", "16", "--num-layers", "1", "--num-heads", "2", "--batch-size", "8"]


@pytest.fixture(scope="module")
def pos_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("pos") / "run"
    train(TrainConfig.for_task("pos", task_options={"size": 64}, steps=2, eval_every=2, embed_dim=16, num_layers=1, num_heads=2,
                               warmup=1, batch_size=8), out)
    return out


def test_train_prints_the_runs_seconds_of_training_and_a_resume_its_own(tmp_path):
    out = tmp_path / "run"
    res = runner.invoke(app, ["train", "pos", *TINY, "--steps", "2", "--out", str(out)])
    assert res.exit_code == 0, res.output
    first = load_checkpoint(out).meta["train_seconds"]
    line = " ".join(res.stdout.split())
    assert f"after 2 steps, {first:.1f} s of training; " in line and "this call" not in line, line
    res = runner.invoke(app, ["train", "pos", "--steps", "4", "--resume", "--out", str(out)])
    assert res.exit_code == 0, res.output
    total = load_checkpoint(out).meta["train_seconds"]
    line = " ".join(res.stdout.split())
    assert f"after 4 steps, {total:.1f} s of training in all, {total - first:.1f} s in this call; " in line, line


def test_eval_json_names_its_seconds_the_evaluations(pos_run):
    res = runner.invoke(app, ["eval", str(pos_run), "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert "seconds" not in summary and summary["eval_seconds"] > 0 and summary["steps"] == 2


@pytest.mark.parametrize("index", ["3", "0"])
def test_eval_refuses_index_without_plot(pos_run, index):
    res = runner.invoke(app, ["eval", str(pos_run), "--index", index])
    assert res.exit_code == 2, res.output
    assert res.stderr.count("\n") == 1 and "--index" in res.stderr and "--plot" in res.stderr, res.stderr
    assert res.stdout == ""  # refused before any scoring
