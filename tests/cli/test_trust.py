"""A command line a demanding user can trust (issue 28): one test per finding of the issue, each
failing on the code before it."""

import json
import os
import subprocess
import sys

import pytest

from attnlab.arena.report import leaderboard
from attnlab.cli import app
from attnlab.cli.arena import _print_leaderboard
from attnlab.cli.generate import printable
from attnlab.training import load_checkpoint
from attnlab.training.caveats import MIN_STEPS, MIN_TEST
from tests.cli.conftest import labelled_lines
from tests.cli.helpers import runner

TINY = ["--size", "64", "--embed-dim", "16", "--num-layers", "1", "--num-heads", "2", "--eval-every", "2"]


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_1_a_finished_run_is_never_overwritten_without_force(tmp_path):
    out = str(tmp_path / "pos")
    assert runner.invoke(app, ["train", "pos", *TINY, "--steps", "4", "--out", out]).exit_code == 0
    weights = (tmp_path / "pos" / "checkpoint" / "best.safetensors").read_bytes()
    res = runner.invoke(app, ["train", "pos", *TINY, "--steps", "2", "--out", out])
    assert res.exit_code == 1 and res.stderr.count("\n") == 1  # a run in the way: a failure at run time
    assert "already holds a finished run (4 of 4 steps)" in res.stderr and "--resume" in res.stderr and "--force" in res.stderr
    assert (tmp_path / "pos" / "checkpoint" / "best.safetensors").read_bytes() == weights  # untouched
    res = runner.invoke(app, ["train", "pos", *TINY, "--steps", "2", "--out", out, "--force", "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["steps"] == 2


def test_1_predict_output_is_never_overwritten_without_force(runs, tmp_path):
    target = tmp_path / "pred.jsonl"
    target.write_text("keep me\n")
    res = runner.invoke(app, ["predict", str(runs["jsonl"]), str(runs["data"]), "-o", str(target)])
    assert res.exit_code == 1 and "--force" in res.stderr and target.read_text() == "keep me\n"  # a file in the way
    assert runner.invoke(app, ["predict", str(runs["jsonl"]), str(runs["data"]), "-o", str(target), "--force"]).exit_code == 0
    assert len(target.read_text().splitlines()) == 20


def test_2_resume_extends_a_finished_run_and_names_each_differing_option(tmp_path):
    out = str(tmp_path / "pos")
    assert runner.invoke(app, ["train", "pos", *TINY, "--steps", "4", "--lr", "0.002", "--out", out]).exit_code == 0
    res = runner.invoke(app, ["train", "pos", "--out", out, "--resume", "--steps", "6", "--json"])  # the run's own options kept
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["steps"] == 6 and load_checkpoint(out).meta["step"] == 6
    res = runner.invoke(app, ["train", "pos", "--out", out, "--resume", "--lr", "0.01", "--embed-dim", "32"])
    assert res.exit_code == 1 and res.stderr.count("\n") == 1  # the run in --out decides: run time
    assert "--embed-dim: 16 there, 32 now" in res.stderr and "--lr: 0.002 there, 0.01 now" in res.stderr
    res = runner.invoke(app, ["train", "pos", "--out", out, "--resume", "--steps", "5", "--json"])
    assert any("nothing was trained" in w for w in json.loads(res.stdout)["warnings"])
    res = runner.invoke(app, ["train", "pos", "--out", out, "--resume", "--attention", "local", "--attention-option", "kdim=8"])
    assert res.exit_code == 2 and "--attention-option kdim: set by the model" in res.stderr
    res = runner.invoke(app, ["train", "recall", "--out", out, "--resume"])
    assert res.exit_code == 1 and "holds a run of task 'pos'" in res.stderr


def test_4_the_viewer_reads_a_byte_level_model_as_bytes(runs, tmp_path):
    res = runner.invoke(app, ["view", "The with statement", "--checkpoint", str(runs["docs"]), "-o", str(tmp_path / "v.html"), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["tokens"] == list("The␣with␣statement")


@pytest.mark.parametrize("args, words", [
    (["train", "pos", "--attention", "local", "--attention-option", "windw=16"],
     "unknown --attention-option 'windw' for the attention 'local'; it takes bias, block, head_mode, num_kv_heads, window"),
    (["train", "pos", "--model-option", "foo=1"],
     "unknown --model-option 'foo' for the model 'transformer'; it takes activation, dropout, ff_dim"),
    (["train", "pos", "--model", "window_mlp", "--model-option", "foo=1"], "it takes dropout, ff_dim, window"),
    (["train", "pos", "--task-option", "foo=1"], "unknown --task-option 'foo' for the task 'pos'; it takes seed, size"),
    (["train", "pos", "--steps", "-1"], "Invalid value for '--steps'"),
    (["generate", "x", "hi", "--top-p", "0"], "--top-p must be in (0, 1]"),
    (["attention", " ".join(["word"] * 600)], "more than the model's 512 positions: shorten it, or add --truncate"),
    (["explain", " "], 'the text is empty: give some words'),
    (["view", " "], 'the text is empty: give some words'),
    (["attention", ""], 'the text is empty: give some words'),
    (["generate", "x", ""], 'the text is empty: give some words'),
])
def test_5_errors_name_the_fix_in_one_line(args, words, tmp_path):
    res = runner.invoke(app, [*args, "--out" if args[0] == "train" else "--seed", str(tmp_path / "o") if args[0] == "train" else "0"]
                        if args[0] in ("train", "generate", "explain") else args)
    assert res.exit_code == 2, res.output
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("error: ") and words in res.stderr, res.stderr
    assert not (tmp_path / "o").exists()  # a refused run leaves no folder behind


def test_5_help_ranges_are_what_is_accepted():
    text = _flat(runner.invoke(app, ["generate", "--help"], env={"COLUMNS": "80"}).stdout)
    assert "0 < p <= 1" in text and "0.0<=x<=1.0" not in text


def test_6_scores_carry_their_split_size_and_caveats(runs, tmp_path):
    res = runner.invoke(app, ["train", "jsonl", "--task-option", f"path={runs['data']}", "--steps", "4", "--eval-every", "2",
                              "--embed-dim", "16", "--num-layers", "1", "--num-heads", "2", "--out", str(tmp_path / "j")])
    assert res.exit_code == 0, res.output
    assert "on 2 examples" in res.stdout and "on the same 2 examples" in res.stdout
    assert "warning: the test split has only 2 examples" in _flat(res.stderr)
    res = runner.invoke(app, ["train", "pos", *TINY, "--seconds", "0.1", "--out", str(tmp_path / "t"), "--json"])
    warnings = json.loads(res.stdout)["warnings"]
    assert any(f"fewer than {MIN_STEPS}" in w for w in warnings)


def _row(variant, value, steps, sps, test_size, seed=0, seconds=30.0):
    config = {"task": "pos", "attention": variant, "seed": seed, "seconds": seconds, "steps": 10**6, "lr": 0.001}
    return {"task": "pos", "variant": variant, "seed": seed, "status": "done", "metric": "accuracy", "value": value, "steps": steps,
            "steps_per_second": sps, "peak_bytes": 1, "params": 1, "config": config, "error": None, "test_size": test_size}


def test_6_the_leaderboard_marks_cells_that_mean_little(capsys):
    rows = [_row("dense", 0.17, 12, 0.4, 500), _row("dense", 0.9, 400, 13.0, 500, seed=1),  # seed 0 ran on a busy machine
            _row("local", 0.77, 300, 10.0, 500), _row("linear", 0.5, 300, 10.0, MIN_TEST - 1)]
    board = leaderboard(rows)
    cells = {e["variant"]: e["caveats"] for e in board["tasks"]["pos"]}
    assert cells["local"] == []
    assert any("only 12 optimizer steps" in c for c in cells["dense"]) and any("the machine was busy" in c for c in cells["dense"])
    assert any(f"only {MIN_TEST - 1} examples" in c for c in cells["linear"])
    _print_leaderboard(board)
    text = _flat(capsys.readouterr().out)
    assert "0.535 ± 0.516 !" in text and "! dense: the time budget allowed only 12" in text and "0.770 !" not in text


def test_7_predict_keeps_the_label_beside_its_prediction_and_scores_it(runs):
    res = runner.invoke(app, ["predict", str(runs["jsonl"]), str(runs["data"])])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    assert [r["label"] for r in rows] == [r["label"] for r in labelled_lines(20)]  # the input's own labels, untouched
    right = sum(r["label"] == r["prediction"] for r in rows)
    assert f"accuracy {right / 20:.4f} ({right} of 20 lines right" in res.stderr


def test_8_generate_escapes_control_bytes_on_a_terminal(runs):
    assert printable("a\x00b\x1b[31mc\nd\te\u200b") == "a\\x00b\\x1b[31mc\nd\te\\u200b"
    master, slave = os.openpty()
    proc = subprocess.run([sys.executable, "-m", "attnlab", "generate", str(runs["docs"]), "\x01x\x1b", "--max-new-tokens", "2",
                           "--temperature", "0"], stdout=slave, stderr=subprocess.PIPE, timeout=120)
    os.close(slave)
    shown = os.read(master, 4096)
    os.close(master)
    assert proc.returncode == 0 and shown.startswith(b"\\x01x\\x1b") and b"\x1b" not in shown
    raw = subprocess.run([sys.executable, "-m", "attnlab", "generate", str(runs["docs"]), "\x01x", "--max-new-tokens", "2", "--raw"],
                         capture_output=True, timeout=120)
    assert raw.stdout.startswith(b"\x01x")


def test_a_closed_pipe_ends_quietly(runs, tmp_path):
    """`attnlab predict ... | head -1`: the reader leaves early (the output is far over a pipe's
    buffer, so the writer meets the closed pipe); no 'Broken pipe' error line."""
    big = tmp_path / "big.jsonl"
    big.write_text("".join(json.dumps(r) + "\n" for r in labelled_lines(4000)))
    cmd = f"'{sys.executable}' -m attnlab predict '{runs['jsonl']}' '{big}' | head -1"
    res = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert json.loads(res.stdout) and "Broken pipe" not in res.stderr and "error" not in res.stderr


def test_8_generate_refuses_sinks_without_a_window_and_warns_past_its_context(runs):
    res = runner.invoke(app, ["generate", str(runs["docs"]), "The", "--sinks", "2"])
    assert res.exit_code == 2 and "--sinks needs --window" in res.stderr
    res = runner.invoke(app, ["generate", str(runs["docs"]), "x" * 40, "--max-new-tokens", "2", "--json"])
    assert res.exit_code == 0
    warning = "run past the 32-byte context the model was trained on"
    assert warning in _flat(res.stderr) and any(warning in w for w in json.loads(res.stdout)["warnings"])


def test_9_long_work_logs_plain_lines_when_not_a_terminal(tmp_path):
    res = runner.invoke(app, ["train", "pos", *TINY, "--steps", "4", "--out", str(tmp_path / "p")])
    assert "pos transformer: step 2/4 loss" in res.stderr and "pos transformer: step 4/4 loss" in res.stderr
    res = runner.invoke(app, ["bench", "attention", "--sizes", "16", "--configs", "scaled_dot+relu", "--modes", "fwd", "--repeats", "1"])
    assert "[1/2] scaled_dot+relu " in res.stderr and "[2/2] scaled_dot+relu " in res.stderr


def test_10_help_is_readable_at_80_columns():
    res = runner.invoke(app, ["train", "--help"], env={"COLUMNS": "80"}, terminal_width=80)
    lines = res.stdout.splitlines()
    assert "…" not in res.stdout and "<bool>" not in res.stdout and max(map(len, lines)) <= 80
    assert len(lines) < 100
    for option in ("--attention-option", "--sequence-parallel", "--batch-size", "--lr"):
        line = next(i for i, x in enumerate(lines) if x.strip().startswith(option))
        described = lines[line].split(None, 2)[2:] or lines[line + 1].split()  # on the option's line, or the next
        assert described, option
    listed = json.loads(runner.invoke(app, ["list", "tasks", "--json"]).stdout)
    assert {"pos", "jsonl", "docs"} <= set(listed) and listed["jsonl"]["options"][:2] == ["path", "seed"]


def test_11_checkpoint_files_share_the_users_mode(runs):
    umask = os.umask(0)
    os.umask(umask)
    modes = {f.name: f.stat().st_mode & 0o777 for f in (runs["pos"] / "checkpoint").iterdir()}
    assert set(modes) == {"model.safetensors", "best.safetensors", "config.json", "state.pt"}
    assert set(modes.values()) == {0o666 & ~umask}, modes
