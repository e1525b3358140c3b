"""The train / eval pipeline: checkpoints round-trip, refuse damage, and resume bitwise after SIGKILL."""

import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from typer.testing import CliRunner

from attnlab.cli import app
from attnlab.training import CheckpointError, ConfigMismatchError, TrainConfig, evaluate, load_checkpoint, train
from attnlab.training.schedule import learning_rate

TINY = dict(task_options={"size": 128}, steps=8, eval_every=4, embed_dim=16, num_layers=1, num_heads=2, warmup=2, batch_size=16)


def test_checkpoint_round_trips_exactly(tmp_path):
    res = train(TrainConfig.for_task("pos", **TINY), tmp_path)
    assert res.steps == 8 and [h["step"] for h in res.history] == [4, 8]
    again = evaluate(tmp_path)
    assert again.value == res.value  # the reloaded best weights score exactly what the run scored
    a, b = load_checkpoint(tmp_path, weights="last"), load_checkpoint(tmp_path / "checkpoint", weights="last")
    x = torch.randint(2, 20, (3, 7))
    assert torch.equal(a.model(x).output, b.model(x).output)
    assert a.config == TrainConfig.for_task("pos", **TINY)


def test_damaged_or_foreign_checkpoints_are_refused(tmp_path):
    train(TrainConfig.for_task("pos", **TINY), tmp_path)
    ck = tmp_path / "checkpoint"
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        load_checkpoint(tmp_path / "missing")
    data = (ck / "best.safetensors").read_bytes()
    (ck / "best.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_checkpoint(tmp_path)
    (ck / "config.json").write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(CheckpointError, match="not written by attnlab"):
        load_checkpoint(tmp_path)
    (ck / "config.json").write_text('{"format": "attnlab-chec')
    with pytest.raises(CheckpointError, match="unreadable or truncated"):
        load_checkpoint(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(CheckpointError, match="not an attnlab checkpoint folder"):
        load_checkpoint(other)


def test_resume_refuses_a_different_config(tmp_path):
    train(TrainConfig.for_task("pos", **TINY), tmp_path)
    with pytest.raises(ConfigMismatchError, match="lr: 0.002 there, 0.5 now") as info:
        train(TrainConfig.for_task("pos", **{**TINY, "lr": 0.5}), tmp_path, resume=True)
    assert info.value.differences == [("lr", 0.002, 0.5)]


def test_mlp_refuses_attention_options():
    from attnlab import tasks
    from attnlab.training import model_config

    with pytest.raises(ValueError, match="uses no attention"):
        model_config(TrainConfig.for_task("pos", model="mlp", attention="local"), tasks.create("pos", size=64))
    assert TrainConfig.for_task("pos", model="mlp").positional == "none"  # the task's default encoding is not forced on it


ARGS = ["pos", "--size", "256", "--steps", "120", "--eval-every", "5", "--embed-dim", "16", "--num-layers", "1", "--num-heads", "2",
        "--seed", "3"]


def _cli(out, *extra):
    return [sys.executable, "-m", "attnlab.cli", "train", *ARGS, "--out", str(out), *extra]


@pytest.mark.slow
def test_sigkill_then_resume_gives_the_weights_of_an_uninterrupted_run(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    full, cut = tmp_path / "full", tmp_path / "cut"
    subprocess.run(_cli(full), check=True, env=env, capture_output=True)
    proc = subprocess.Popen(_cli(cut), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    step = 0
    while time.time() < deadline and proc.poll() is None:
        try:
            step = json.loads((cut / "checkpoint" / "config.json").read_text())["step"]
        except (OSError, ValueError, KeyError):
            step = 0
        if step >= 20:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.01)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    assert 20 <= json.loads((cut / "checkpoint" / "config.json").read_text())["step"] < 120
    subprocess.run(_cli(cut, "--resume"), check=True, env=env, capture_output=True)
    for name in ("model.safetensors", "best.safetensors"):
        assert (full / "checkpoint" / name).read_bytes() == (cut / "checkpoint" / name).read_bytes(), name
    assert not any(p.name.startswith("checkpoint.") for p in cut.iterdir())  # no temporary or old folder left


def test_cli_train_and_eval_json(tmp_path):
    r = CliRunner().invoke(app, ["train", *ARGS[:1], "--size", "128", "--steps", "4", "--eval-every", "2", "--embed-dim", "16",
                                 "--num-layers", "1", "--num-heads", "2", "--out", str(tmp_path), "--json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(summary) == {"task", "model", "attention", "metric", "value", "test_size", "test_unit", "steps", "seconds", "checkpoint",
                            "warnings", "precision", "flop_rate", "peak_fraction", "pretrain", "train_seconds", "call_train_seconds",
                            "device"}
    assert summary["device"] == "cpu"  # auto, on a machine without a GPU
    assert 0 < summary["train_seconds"] == summary["call_train_seconds"] <= summary["seconds"]
    assert summary["precision"] in ("fp32", "bf16") and summary["flop_rate"] > 0 and 0 < summary["peak_fraction"] < 1
    assert summary["pretrain"] is None
    assert summary["test_size"] == 64 and summary["test_unit"] == "examples" and summary["steps"] == 4
    assert summary["task"] == "pos" and summary["metric"] == "token_accuracy" and summary["attention"] == "dense"
    r = CliRunner().invoke(app, ["eval", str(tmp_path), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.strip().splitlines()[-1])["value"] == summary["value"]
    r = CliRunner().invoke(app, ["eval", str(tmp_path / "nope")])
    assert r.exit_code == 1 and "no checkpoint at" in " ".join(r.output.split())  # a missing checkpoint: run time
    r = CliRunner().invoke(app, ["train", "nope"])
    assert r.exit_code == 2 and "'nope' is not one of 'digits'" in " ".join(r.output.split())
    r = CliRunner().invoke(app, ["train", "pos", "--model", "mlp", "--attention", "local", "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "uses no attention" in " ".join(r.output.split())


def test_translate_trains_decodes_and_draws_its_cross_attention(tmp_path):
    cfg = TrainConfig.for_task("translate", task_options={"size": 128}, steps=4, eval_every=2, embed_dim=16, num_layers=1, num_heads=2)
    res = train(cfg, tmp_path)
    assert res.metric == "exact_match" and 0.0 <= res.value <= 1.0
    assert evaluate(tmp_path).value == res.value
    png = tmp_path / "x.png"
    r = CliRunner().invoke(app, ["eval", str(tmp_path), "--plot", str(png), "--index", "3"])
    assert r.exit_code == 0, r.output
    assert png.stat().st_size > 0
    pos = tmp_path / "pos"
    train(TrainConfig.for_task("pos", **TINY), pos)
    r = CliRunner().invoke(app, ["eval", str(pos), "--plot", str(png)])
    assert r.exit_code == 1 and "only for seq2seq" in " ".join(r.output.split())  # a checkpoint of another kind: run time


def test_bad_training_inputs_are_refused():
    with pytest.raises(TypeError, match="unknown training option"):
        TrainConfig.for_task("pos", nonsense=1)
    with pytest.raises(ValueError, match="has no split 'dev'"):
        from attnlab import tasks

        tasks.create("pos", size=64).split("dev")


def test_a_time_budget_counts_training_seconds_over_resumes_and_anneals_on_time(tmp_path, monkeypatch):
    import itertools
    import types

    from attnlab.training import loop

    clock = itertools.count(0.0, 0.25)  # every reading of the clock is 0.25 s later: each step takes 0.25 s
    monkeypatch.setattr(loop, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    cfg = TrainConfig.for_task("pos", **{**TINY, "steps": 1000, "eval_every": 2}, seconds=1.5)
    res = train(cfg, tmp_path)
    assert res.stopped_by == "budget" and res.steps == 6
    assert [h["seconds"] for h in res.history] == [0.5, 1.0, 1.5]
    again = train(cfg, tmp_path, resume=True)  # the budget is spent already: no step
    assert again.steps == 6 and again.steps_run == 0 and again.stopped_by == "budget" and again.value == res.value
    # the cosine decay follows the budget (or the steps, whichever is further)
    assert learning_rate(cfg, 10, 1000, 0.75) == pytest.approx(cfg.lr * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert learning_rate(cfg, 10, 1000, 1.5) == pytest.approx(0.0, abs=1e-12)
    assert learning_rate(cfg, 1000, 1000, 0.0) == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="must be > 0"):
        TrainConfig.for_task("pos", seconds=0)


def test_train_seconds_is_a_time_budget_without_step_limit_or_early_stop(monkeypatch, tmp_path):
    import attnlab.training as training
    from attnlab.training.config import TIME_BUDGET_STEPS

    seen = []

    def fake_train(cfg, out, **kw):
        seen.append(cfg)
        raise ValueError("stop here")

    monkeypatch.setattr(training, "train", fake_train)
    runner = CliRunner()
    runner.invoke(app, ["train", "pos", "--seconds", "5", "--out", str(tmp_path / "a")])
    runner.invoke(app, ["train", "pos", "--seconds", "5", "--steps", "40", "--patience", "2", "--out", str(tmp_path / "b")])
    r = runner.invoke(app, ["train", "translate", "--baseline", "--out", str(tmp_path / "c")])
    assert (seen[0].seconds, seen[0].steps, seen[0].patience) == (5.0, TIME_BUDGET_STEPS, None)
    assert (seen[1].seconds, seen[1].steps, seen[1].patience) == (5.0, 40, 2)
    assert r.exit_code == 2 and "no no-attention baseline" in " ".join(r.output.split()) and len(seen) == 2  # refused before training


def test_the_time_budget_rule_lives_in_the_config():
    """seconds alone: no step limit, no early stop; a caller's steps, epochs or patience are kept."""
    from attnlab.training.config import TIME_BUDGET_STEPS

    cfg = TrainConfig.for_task("pos", seconds=5)
    assert (cfg.steps, cfg.epochs, cfg.patience) == (TIME_BUDGET_STEPS, None, None)
    cfg = TrainConfig.for_task("pos", seconds=5, epochs=2, patience=3)
    assert (cfg.steps, cfg.epochs, cfg.patience) == (None, 2, 3)
    assert TrainConfig.for_task("pos").patience is not None  # without a budget, the task's early stop stays


def test_a_positional_table_shared_by_every_layer_checkpoints_and_loads(tmp_path):
    cfg = TrainConfig.for_task("pos", **{**TINY, "num_layers": 2}, positional="relative")
    res = train(cfg, tmp_path)
    ck = load_checkpoint(tmp_path)
    assert evaluate(tmp_path).value == res.value
    shared = [p for n, p in ck.model.named_parameters(remove_duplicate=False) if n.endswith("positional.weight")]
    assert len(shared) >= 2 and all(p is shared[0] for p in shared)  # still one parameter after loading
