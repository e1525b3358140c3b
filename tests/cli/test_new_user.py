"""A new user's first hour with the command line (issue 40): one test per finding fixed here,
each failing on the code before it."""

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import attnlab.training
from attnlab.cli import app
from attnlab.models.encoder import Encoder
from attnlab.training import TrainConfig, load_checkpoint
from tests.cli.helpers import interrupt_training, runner

TINY = ["--size", "64", "--embed-dim", "16", "--num-layers", "1", "--num-heads", "2", "--eval-every", "2"]


def _one_error(res, *words, code=2):
    """``res`` ended with one line on stderr, an error holding every one of ``words``, and exit ``code``
    (2: a usage error; 1: a failure at run time)."""
    assert res.exit_code == code, res.output
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("error: "), res.stderr
    for w in words:
        assert w in res.stderr, res.stderr


def test_2_heads_that_do_not_divide_the_width_are_refused_before_any_model(tmp_path):
    res = runner.invoke(app, ["train", "pos", "--steps", "5", "--num-heads", "3", "--out", str(tmp_path / "o")])
    _one_error(res, "embed_dim 64 must be divisible by num_heads 3", "num_heads 1, 2, 4, 8, 16 divide 64")
    assert "rope" not in res.stderr and not (tmp_path / "o").exists()  # refused at the config: no folder, no model built
    with pytest.raises(ValueError, match="embed_dim 64 must be divisible by num_heads 3"):
        TrainConfig(task="pos", embed_dim=64, num_heads=3)
    TrainConfig(task="pos", model="mlp", embed_dim=64, num_heads=3)  # a model without heads: nothing to divide
    with pytest.raises(ValueError, match="embed_dim must be divisible by num_heads, got embed_dim=64 and num_heads=3"):
        Encoder(64, 3, 1, positional="rope")  # the library's own encoder: the same order


def test_3_generate_on_a_tagger_says_it_is_not_a_language_model_and_nothing_before(runs):
    res = runner.invoke(app, ["generate", str(runs["pos"]), "hello"])  # 205 bytes: past the tagger's context too
    _one_error(res, "holds a tagging model; generate needs a language model", code=1)  # a checkpoint of another kind
    assert "warning" not in res.output


def _interrupt_at(monkeypatch, at: int) -> None:
    """``attnlab train`` is interrupted (as by Ctrl-C) right after optimizer step ``at``."""
    interrupt_training(monkeypatch, attnlab.training, at)


def test_5_ctrl_c_says_where_the_run_stopped_and_how_to_resume_it(tmp_path, monkeypatch):
    out = tmp_path / "my run"
    _interrupt_at(monkeypatch, 5)
    res = runner.invoke(app, ["train", "pos", *TINY, "--steps", "8", "--out", str(out)])
    assert res.exit_code == 130
    line = res.stderr.splitlines()[-1]
    resume = f"attnlab train pos --out {shlex.quote(str(out))} --resume"
    assert line == f"interrupted at step 5 of 8; saved: the checkpoint of step 4 in {out / 'checkpoint'}; resume with: {resume}"
    assert load_checkpoint(out).meta["step"] == 4
    monkeypatch.undo()
    res = runner.invoke(app, shlex.split(resume)[1:] + ["--json"])  # the command it names continues the run to its end
    assert res.exit_code == 0, res.output
    assert load_checkpoint(out).meta["step"] == 8 and load_checkpoint(out).meta["resumes"] == [4]


def test_5_ctrl_c_before_the_first_checkpoint_says_nothing_was_saved(tmp_path, monkeypatch):
    _interrupt_at(monkeypatch, 1)
    res = runner.invoke(app, ["train", "pos", *TINY, "--steps", "8", "--out", str(tmp_path / "o")])
    assert res.exit_code == 130
    assert res.stderr.splitlines()[-1] == ("interrupted at step 1 of 8, before its first checkpoint: nothing was saved; run the same "
                                           "command again to start over")


def test_5_a_real_sigint_ends_with_the_resume_line(tmp_path):
    out, log = tmp_path / "run", tmp_path / "stderr.txt"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(log, "w") as stderr:
        # as from a terminal: SIGINT at its default in the child (a suite started in the background, `bash .ci/run &`,
        # inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler), and no early stop, so that
        # the run is still training when the signal comes
        proc = subprocess.Popen([sys.executable, "-m", "attnlab", "train", "pos", *TINY, "--steps", "100000", "--patience", "100000",
                                 "--out", str(out)],
                                stdout=subprocess.DEVNULL, stderr=stderr, env=env,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            deadline = time.monotonic() + 300
            while not (out / "checkpoint" / "config.json").exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            proc.send_signal(signal.SIGINT)
            rc = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    last = log.read_text().splitlines()[-1]
    assert rc == 130, log.read_text()
    # a signal during a checkpoint's atomic swap finds the last one still in checkpoint.old, and says so
    named = re.search(r" in (\S+); resume with: ", last)
    assert last.startswith("interrupted at step ") and named and last.endswith(f"attnlab train pos --out {out} --resume"), last
    assert named.group(1) in (str(out / "checkpoint"), str(out / "checkpoint.old")), last
    assert (Path(named.group(1)) / "config.json").exists(), last


def test_6_view_refuses_to_replace_a_file_without_force(runs, tmp_path):
    target = tmp_path / "law.html"
    target.write_text("keep me\n")
    args = ["view", "The with statement", "--checkpoint", str(runs["docs"]), "-o", str(target)]
    _one_error(runner.invoke(app, args), f"-o {target} exists; add --force to replace it", code=1)  # a file in the way
    assert target.read_text() == "keep me\n"
    assert runner.invoke(app, [*args, "--force"]).exit_code == 0
    assert target.read_text().startswith("<!doctype html>")


def test_6_train_refuses_resume_with_force_and_a_file_as_its_folder(tmp_path):
    res = runner.invoke(app, ["train", "pos", "--out", str(tmp_path / "run"), "--resume", "--force"])
    _one_error(res, "--resume continues the run in --out and --force replaces it: give one of them, not both")
    afile = tmp_path / "afile"
    afile.write_text("x")
    _one_error(runner.invoke(app, ["train", "pos", "--steps", "5", "--out", str(afile)]), f"--out {afile} is a file; it must be a folder",
               code=1)  # a file in the way
    res = runner.invoke(app, ["train", "pos", "--steps", "5", "--out", str(afile / "run")])
    _one_error(res, f"--out {afile / 'run'} must be a folder, but {afile} is a file", code=1)
    assert "Errno" not in res.stderr and afile.read_text() == "x"


def test_10_threads_sets_torchs_thread_count_for_the_command():
    before = torch.get_num_threads()
    try:
        res = runner.invoke(app, ["--threads", str(before + 1), "explain", "I saw a saw", "--json"])
        assert res.exit_code == 0, res.output
        assert torch.get_num_threads() == before + 1
        _one_error(runner.invoke(app, ["--threads", "0", "explain", "I saw a saw"]), "'--threads'", "greater than or equal to 1")
        assert torch.get_num_threads() == before + 1  # refused before it set anything
    finally:
        torch.set_num_threads(before)
