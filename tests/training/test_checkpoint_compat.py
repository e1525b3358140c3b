"""Checkpoints written before the house-plan refactor (format version 1: a flat model dict,
attention options among the backbone options) load and predict identically after it.

tests/data/checkpoints-v1/ was written by attnlab at commit e465f0a with make.py beside it: a
tagger (transformer, rope), a CLS classifier with local attention and a graph node labeller,
each with the logits its best weights gave on the first test examples.

The logits are compared to float32 rounding, not bit for bit: they were written on one CPU, and
another CPU's kernels (other vector widths, other summation orders) round differently (measured:
up to 3.9e-7 apart on an AMX Xeon), while a wrong weight or a changed model moves them by far more.
"""

import dataclasses
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attnlab import objectives, tasks
from attnlab.models import AttentionSpec, ModelConfig, build_model
from attnlab.training import CheckpointError, TrainConfig, load_checkpoint

DATA = Path(__file__).resolve().parent.parent / "data" / "checkpoints-v1"
RUNS = ["pos-transformer", "listops-cls-local", "karate-graph"]


@pytest.mark.parametrize("name", RUNS)
def test_a_version_1_checkpoint_loads_and_predicts_identically(name):
    ck = load_checkpoint(DATA / name)
    assert ck.meta["version"] == 1
    task = tasks.create(ck.config.task, **ck.config.task_options)
    data = task.split("test")
    inputs, _ = objectives.collate(task, data, torch.arange(min(len(data), 16)))
    with torch.no_grad():
        logits = ck.model.eval()(**inputs).output
    want = load_file(str(DATA / name / "expected-logits.safetensors"))["logits"]
    assert logits.shape == want.shape
    torch.testing.assert_close(logits, want, rtol=1e-5, atol=1e-5)  # the same model, weights and inputs
    assert torch.equal(logits.argmax(-1), want.argmax(-1))


def test_the_version_1_model_dict_becomes_typed_specs():
    ck = load_checkpoint(DATA / "listops-cls-local")
    assert ck.model_config.attention == AttentionSpec("local", {"window": 2})
    assert ck.model_config.positional.name == "sinusoidal" and ck.model_config.num_heads == 2
    assert ck.config.attention_options == {"window": 2} and ck.config.model_options == {}
    # the sizes were stored as dim, heads, layers (train) and dim (model): read under their names now
    assert (ck.config.embed_dim, ck.config.num_heads, ck.config.num_layers) == (16, 2, 1) and ck.model_config.embed_dim == 16
    again = ModelConfig.from_dict(ck.model_config.to_dict())
    assert again == ck.model_config
    rebuilt = build_model(again)
    assert set(rebuilt.state_dict()) == set(ck.model.state_dict())


def test_a_stored_train_dict_with_the_earlier_size_names_is_read():
    stored = {"task": "pos", "dim": 24, "heads": 3, "layers": 5}  # what checkpoints held before the sizes were renamed
    cfg = TrainConfig.from_dict(stored)
    assert (cfg.embed_dim, cfg.num_heads, cfg.num_layers) == (24, 3, 5)
    assert TrainConfig.from_dict(dataclasses.asdict(cfg)) == cfg  # and what they hold now


def test_a_checkpoint_of_an_unknown_version_is_refused(tmp_path):
    import json
    import shutil

    shutil.copytree(DATA / "pos-transformer", tmp_path / "run")
    cfg = tmp_path / "run" / "checkpoint" / "config.json"
    meta = json.loads(cfg.read_text())
    meta["version"] = 99
    cfg.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="version 99"):
        load_checkpoint(tmp_path / "run")
