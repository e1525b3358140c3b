"""A new kind of output is one new file: an objective and its head, registered from outside the
library, train, checkpoint and evaluate with no change to the loop, the checkpoint or the models."""

import torch
from torch import nn

from attnlab import objectives
from attnlab.models import HEADS, SetClassifier, register_head
from attnlab.objectives import OBJECTIVES
from attnlab.tasks import Split, Task
from attnlab.training import TrainConfig, evaluate, load_checkpoint, train


def _parity_task(n=256, length=6, seed=0):
    """Sets of tokens 2/3; the label is whether token 3 occurs an odd number of times."""
    g = torch.Generator().manual_seed(seed)
    splits = {}
    for name, size in (("train", n), ("val", 64), ("test", 64)):
        toks = torch.randint(2, 4, (size, length), generator=g)
        splits[name] = Split(toks, ((toks == 3).sum(1) % 2).long())
    return Task(name="parity", kind="parity", vocab_size=4, num_labels=2, metric="accuracy", splits=splits, options={})


def test_a_kind_registered_from_outside_trains_checkpoints_and_evaluates(tmp_path):
    calls = []

    @objectives.register("parity")
    class Parity(objectives.Objective):
        def loss(self, model, inputs, labels):
            calls.append("loss")
            return nn.functional.cross_entropy(model(**inputs).output, labels)

    register_head("tokens", "parity")(lambda backbone, cfg: SetClassifier(backbone, cfg.num_labels))
    try:
        task = _parity_task()
        cfg = TrainConfig(task="parity", embed_dim=16, num_layers=1, num_heads=2, steps=20, eval_every=10, warmup=2, batch_size=32)
        res = train(cfg, tmp_path, task=task)
        assert calls.count("loss") == 20 and res.steps == 20 and 0.0 <= res.value <= 1.0
        ck = load_checkpoint(tmp_path)
        assert ck.model_config.kind == "parity" and isinstance(ck.model, SetClassifier)
        assert evaluate(tmp_path, task=task).value == res.value  # the checkpoint rebuilds the same model
    finally:
        OBJECTIVES.remove("parity")
        HEADS.remove("tokens:parity")
    assert "parity" not in objectives.names()
