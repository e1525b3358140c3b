"""The command line of mixed precision, utilisation and self-pretraining: ``train --precision
--pretrain-steps``, ``bench peak``, and the seeds' spread and share of peak in the leaderboard."""

import json

from attnlab.arena.report import leaderboard
from attnlab.cli import app
from attnlab.cli.arena import _print_leaderboard
from tests.cli.helpers import runner

TINY = ["--size", "64", "--embed-dim", "16", "--num-layers", "1", "--num-heads", "2", "--eval-every", "2", "--steps", "4"]


def test_train_reports_its_precision_utilisation_and_pretraining(tmp_path):
    res = runner.invoke(app, ["train", "pos", *TINY, "--precision", "bf16", "--pretrain-steps", "3", "--out", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    text = " ".join(res.stdout.split())
    assert "self-pretraining: 3 steps" in text and "masked-token loss" in text
    assert "bf16, " in text and "GFLOP/s (" in text and "% of this machine's peak)" in text
    res = runner.invoke(app, ["train", "pos", *TINY, "--precision", "fp32", "--out", str(tmp_path / "b"), "--json"])
    summary = json.loads(res.stdout)
    assert summary["precision"] == "fp32" and summary["pretrain"] is None and summary["flop_rate"] > 0


def test_a_bad_precision_is_one_line_naming_the_choices(tmp_path):
    res = runner.invoke(app, ["train", "pos", *TINY, "--precision", "fp16", "--out", str(tmp_path / "a")])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1
    assert "'fp16' is not one of 'fp32', 'bf16', 'auto'" in res.stderr and not (tmp_path / "a").exists()


def test_resuming_in_another_precision_names_the_flag(tmp_path):
    out = str(tmp_path / "a")
    assert runner.invoke(app, ["train", "pos", *TINY, "--precision", "fp32", "--out", out]).exit_code == 0
    res = runner.invoke(app, ["train", "pos", "--precision", "bf16", "--out", out, "--resume"])
    assert res.exit_code == 1 and "--precision: fp32 there, bf16 now" in res.stderr  # the run in --out decides: run time


def test_bench_peak_measures_both_precisions():
    res = runner.invoke(app, ["bench", "peak", "--json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    assert got["fp32"] > 1e8 and got["bf16"] > 1e8 and isinstance(got["native_bf16"], bool)


def test_the_leaderboard_shows_the_seeds_spread_and_the_share_of_peak(capsys):
    def row(seed, value, fraction):
        config = {"task": "pos", "attention": "dense", "seed": seed, "steps": 10}
        return {"task": "pos", "variant": "dense", "seed": seed, "status": "done", "metric": "accuracy", "value": value, "steps": 10,
                "steps_per_second": 5.0, "peak_bytes": 1, "params": 1, "config": config, "error": None, "test_size": 500,
                "precision": "bf16", "flop_rate": 1e9, "peak_fraction": fraction}

    board = leaderboard([row(0, 0.5, 0.1), row(1, 0.7, 0.3), row(2, 0.6, 0.2)])
    cell = board["tasks"]["pos"][0]
    assert abs(cell["value"] - 0.6) < 1e-12 and abs(cell["spread"] - 0.1) < 1e-12  # the sample standard deviation
    assert abs(cell["peak_fraction"] - 0.2) < 1e-12 and cell["precision"] == "bf16"
    _print_leaderboard(board)
    text = " ".join(capsys.readouterr().out.split())
    assert "0.600 ± 0.100" in text and "20% bf16" in text


def test_a_diverged_seed_makes_the_spread_nan_not_a_crash():
    def row(seed, value):
        return {"task": "pos", "variant": "dense", "seed": seed, "status": "done", "metric": "accuracy", "value": value, "steps": 10,
                "steps_per_second": 5.0, "peak_bytes": 1, "params": 1, "config": {"seed": seed, "steps": 10}, "error": None,
                "test_size": 500}

    cell = leaderboard([row(0, 0.5), row(1, float("nan"))])["tasks"]["pos"][0]
    assert cell["spread"] != cell["spread"]  # NaN
    assert leaderboard([row(0, 0.5)])["tasks"]["pos"][0]["spread"] is None  # one seed: no spread
