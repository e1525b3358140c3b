"""Writes a run on text without spaces with the code from before the tokenizer was chosen by the
data (commit 22d0d7f: byte-level BPE for all text), for tests/tasks/test_jsonl_tokenizer.py: the
file (``nospace.jsonl``, named by a relative path: run from this folder), the run's best weights
and config.json (what ``attnlab eval`` reads), and what that code computed (expected.json).

    git archive 22d0d7f src | tar -x -C /tmp/old
    cd tests/data/jsonl-bpe-v1 && PYTHONPATH=/tmp/old/src python make.py
"""
import hashlib
import json
import random
import string
from pathlib import Path

from attnlab import tasks
from attnlab.training import TrainConfig, train

r = random.Random(3)
rows = []
for _ in range(60):
    v = r.choice("abcd")
    s = "".join(r.choice(string.ascii_lowercase) for _ in range(120))
    at = r.randrange(120)
    rows.append({"text": s[:at] + "KEY=" + v + s[at:], "label": v})
Path("nospace.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
cfg = TrainConfig.for_task("jsonl", task_options={"path": "nospace.jsonl", "vocab_size": 300}, steps=4, eval_every=4, embed_dim=16,
                           num_layers=1, num_heads=2, warmup=1, batch_size=8)
res = train(cfg, "run")
for f in Path("run/checkpoint").iterdir():
    if f.name not in ("best.safetensors", "config.json"):
        f.unlink()
task = tasks.create("jsonl", **cfg.task_options)
Path("expected.json").write_text(json.dumps({
    "value": res.value,
    "tokenizer_sha256": hashlib.sha256(task.artifacts["tokenizer"].encode()).hexdigest(),
    "test_tokens_sha256": hashlib.sha256(task.split("test").tokens.numpy().tobytes()).hexdigest(),
}, indent=1) + "\n")
print(res.value)
