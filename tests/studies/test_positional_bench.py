"""The length-extrapolation benchmark: its task, its bookkeeping and its command."""

import json

import pytest
import torch
from typer.testing import CliRunner

from attnlab.cli import app
from attnlab.studies.positional import DelayedCopy, Result, Settings, run, summarize

runner = CliRunner()


def test_delayed_copy_targets_are_the_tokens_delay_back():
    task = DelayedCopy(vocab=7, delay=3)
    x, y = task.batch(4, 10, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (4, 10) and int(x.max()) < 7
    assert (y[:, :3] == -100).all()
    for i in range(3, 10):
        assert torch.equal(y[:, i], x[:, i - 3])
    with pytest.raises(ValueError, match="exceed the delay 3"):
        task.batch(1, 3, torch.Generator())
    with pytest.raises(ValueError, match="delay >= 1"):
        DelayedCopy(vocab=7, delay=0)


def test_summarize_takes_mean_min_max_and_marks_lengths_that_failed():
    runs = [
        Result("rope", {}, 0, 0.1, {64: 1.0, 128: 0.5}),
        Result("rope", {}, 1, 0.3, {64: 0.8, 128: 0.7}),
        Result("learned", {}, 0, 0.2, {64: 0.9, 128: None}, {128: "no position 64"}),
    ]
    rope, learned = summarize(runs)
    assert rope["accuracy"] == {64: pytest.approx(0.9), 128: pytest.approx(0.6)}
    assert rope["accuracy_min"] == {64: 0.8, 128: 0.5} and rope["accuracy_max"] == {64: 1.0, 128: 0.7}
    assert rope["train_loss"] == pytest.approx(0.2) and rope["seeds"] == [0, 1]
    assert learned["accuracy"][128] is None and learned["errors"] == {128: "no position 64"}


@pytest.mark.slow
def test_a_short_run_learns_with_rope_and_learned_cannot_test_longer():
    s = Settings(steps=150, seeds=(0,), test_lengths=(32, 48), train_length=32, test_sequences=64)
    res = {r.encoding: r for r in run(["none", "rope", "learned"], s)}
    # in 150 steps, rope already beats chance (1/16) by far; without positions it cannot
    assert res["rope"].accuracy[32] > 0.5
    assert res["none"].accuracy[32] < 0.35
    assert res["learned"].accuracy[48] is None and "max_len=32" in res["learned"].errors[48]
    with pytest.raises(ValueError, match="unknown positional encoding 'sine'"):
        run(["sine"], s)


def test_bench_positional_command_writes_records_and_chart(tmp_path):
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    res = runner.invoke(
        app,
        ["bench", "positional", "--encodings", "sinusoidal,learned", "--steps", "5", "--seeds", "0,1",
         "--train-length", "16", "--test-lengths", "16,24", "-o", str(out), "--plot", str(png), "--json"],
    )
    assert res.exit_code == 0, res.output
    printed = json.loads(res.stdout)
    assert printed == json.loads(out.read_text())
    assert printed["settings"]["steps"] == 5 and printed["settings"]["seeds"] == [0, 1]
    assert [(r["encoding"], r["seed"]) for r in printed["runs"]] == [("sinusoidal", 0), ("sinusoidal", 1), ("learned", 0), ("learned", 1)]
    learned = printed["summary"][1]
    assert learned["accuracy"]["24"] is None and learned["accuracy"]["16"] is not None
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = runner.invoke(app, ["bench", "positional", "--encodings", "learned", "--steps", "2", "--seeds", "0",
                                "--train-length", "16", "--test-lengths", "16,24"])
    assert table.exit_code == 0 and "error" in table.stdout and "learned @ 24" in table.stdout


@pytest.mark.parametrize(
    "args, words",
    [
        (["--encodings", "sine"], "unknown --encodings"),
        (["--test-lengths", "64,x"], "--test-lengths must be comma-separated integers"),
        (["--seeds", ""], "--seeds must be integers"),
        (["--test-lengths", "4"], "must exceed the copy delay 5"),
    ],
)
def test_bench_positional_bad_options(args, words):
    res = runner.invoke(app, ["bench", "positional", *args])
    assert res.exit_code == 2 and words in " ".join(res.output.split())
