"""Data-parallel training: torchrun with 2 processes (gloo) follows the 1-process loss trajectory."""

import json
import os
import subprocess
import sys

import pytest

ARGS = ["train", "digits", "--model", "cnn", "--steps", "6", "--batch-size", "32", "--eval-every", "3", "--lr", "0.003"]


def _run(cmd, cwd):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_two_gloo_processes_give_the_single_process_loss_trajectory(tmp_path):
    _run([sys.executable, "-m", "attnlab", *ARGS, "--out", str(tmp_path / "one")], tmp_path)
    _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "attnlab", *ARGS,
          "--out", str(tmp_path / "two")], tmp_path)
    one = json.loads((tmp_path / "one" / "checkpoint" / "config.json").read_text())
    two = json.loads((tmp_path / "two" / "checkpoint" / "config.json").read_text())
    assert one["world_size"] == 1 and two["world_size"] == 2
    assert len(one["losses"]) == len(two["losses"]) == 6
    assert one["losses"][0] != one["losses"][-1]  # it trains
    assert two["losses"] == pytest.approx(one["losses"], abs=1e-5)
    assert [h["val"] for h in two["history"]] == pytest.approx([h["val"] for h in one["history"]], abs=1e-6)
