"""Small trained runs the command-line tests share (built once per test session)."""

import json

import pytest

from attnlab.training import TrainConfig, train

SMALL = dict(steps=4, eval_every=2, embed_dim=16, num_layers=1, num_heads=2, warmup=1, batch_size=8)


def labelled_lines(n: int) -> list[dict]:
    """A classification file: the label is whether the text mentions a cat."""
    words = ["red", "blue", "green", "small", "big", "old", "new", "fast", "slow", "warm"]
    rows = []
    for i in range(n):
        text = " ".join(words[(i * k) % len(words)] for k in (1, 3, 7))
        rows.append({"text": f"the {text} cat" if i % 2 else f"the {text} dog", "label": "cat" if i % 2 else "dog"})
    return rows


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    """``{"pos": a finished pos run, "docs": a byte-level language model, "jsonl": a run on a 20-line
    labelled file, "data": that file}``, each folder an ``attnlab train --out``."""
    root = tmp_path_factory.mktemp("runs")
    data = root / "small.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in labelled_lines(20)))
    train(TrainConfig.for_task("pos", task_options={"size": 64}, **SMALL), root / "pos")
    train(TrainConfig.for_task("docs", task_options={"size": 16, "length": 32}, **SMALL), root / "docs")
    train(TrainConfig.for_task("jsonl", task_options={"path": str(data)}, **SMALL), root / "jsonl")
    return {"pos": root / "pos", "docs": root / "docs", "jsonl": root / "jsonl", "data": data}
