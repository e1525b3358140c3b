"""Wrote these checkpoints with the pre-refactor code (commit e465f0a; it imports attnlab.training.make_batch
and attnlab.tasks.create_task, names of that version), and the logits they give on fixed inputs.
Usage: python make.py OUT_DIR"""
import sys

import torch
from safetensors.torch import save_file

from attnlab.tasks import create_task
from attnlab.training import TrainConfig, load_checkpoint, make_batch, train

out = sys.argv[1]
runs = {
    "pos-transformer": TrainConfig.for_task("pos", task_options={"size": 64}, steps=4, eval_every=4, dim=16, heads=2, layers=1, warmup=1,
                                            batch_size=8),
    "listops-cls-local": TrainConfig.for_task("listops", task_options={"size": 64, "max_length": 24}, attention="local",
                                              model_options={"attention_options": {"window": 2}}, steps=4, eval_every=4, dim=16, heads=2,
                                              layers=1, warmup=1, batch_size=8),
    "karate-graph": TrainConfig.for_task("karate", steps=4, eval_every=4, dim=8, heads=2, layers=1, warmup=1),
}
for name, cfg in runs.items():
    train(cfg, f"{out}/{name}")
    ck = load_checkpoint(f"{out}/{name}")
    task = create_task(cfg.task, **cfg.task_options)
    data = task.split("test")
    inputs, _ = make_batch(task, data, torch.arange(min(len(data), 16)))
    with torch.no_grad():
        logits = ck.model.eval()(**inputs)
    save_file({"logits": logits.contiguous()}, f"{out}/{name}/expected-logits.safetensors")
    print(name, tuple(logits.shape))
