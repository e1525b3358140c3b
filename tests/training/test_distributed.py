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


@pytest.mark.slow
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


SP_ARGS = ["train", "listops", "--size", "200", "--steps", "4", "--batch-size", "4", "--eval-every", "2", "--positional", "rope",
           "--causal"]


@pytest.mark.slow
def test_sequence_parallel_training_follows_the_single_process_trajectory(tmp_path):
    """ListOps (16-128 tokens, padded, causal with rope: zig-zag shards): 2 processes each holding
    half of every sequence (ring attention), and 4 processes as 2 data-parallel groups of 2,
    give one process's losses."""
    _run([sys.executable, "-m", "attnlab", *SP_ARGS, "--out", str(tmp_path / "one")], tmp_path)
    for procs in (2, 4):
        _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(procs), "-m", "attnlab", *SP_ARGS,
              "--sequence-parallel", "2", "--out", str(tmp_path / f"sp{procs}")], tmp_path)
    one = json.loads((tmp_path / "one" / "checkpoint" / "config.json").read_text())
    assert one["losses"][0] != one["losses"][-1]
    for procs in (2, 4):
        run = json.loads((tmp_path / f"sp{procs}" / "checkpoint" / "config.json").read_text())
        assert run["world_size"] == procs and run["sequence_parallel"] == 2
        assert run["ring"]["sent_bytes"] > 0 and run["ring"]["steps"] > 0  # the ring ran
        assert run["losses"] == pytest.approx(one["losses"], abs=1e-5)
        assert [h["val"] for h in run["history"]] == pytest.approx([h["val"] for h in one["history"]], abs=1e-6)


def test_sequence_parallel_needs_its_processes(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "attnlab", *SP_ARGS, "--sequence-parallel", "2", "--out", str(tmp_path / "x")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode != 0
    said = " ".join((proc.stderr + proc.stdout).split())
    assert "needs a multiple of 2 processes, got 1" in said and "Traceback" not in said
