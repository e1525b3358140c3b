"""A user's own data, trusted: one tokenizer in every process, saved with the run and reused by
eval and --resume; no text lost to [UNK]; a changed file refused by eval and --resume and given
new arena runs (the user-data issue's numbered findings 1-3)."""

import dataclasses
import json
import os
import random
import string
import subprocess
import sys

import pytest

from attnlab import tasks
from attnlab.training import TrainConfig, evaluate, train


def words_file(path, n=120, seed=0):
    """Short texts of common words (many tied counts: the case where WordPiece's vocabulary varied by process)."""
    r = random.Random(seed)
    words = ["the", "law", "will", "never", "be", "perfect", "but", "its", "application", "should", "just", "foo", "bar", "baz"]
    rows = []
    for _ in range(n):
        text = " ".join(r.choice(words) + ("" if r.random() < 0.7 else str(r.randrange(50))) for _ in range(12))
        rows.append({"text": text, "label": int("law" in text.split()[:4])})
    path.write_text("".join(json.dumps(x) + "\n" for x in rows))
    return path


def unspaced_file(path, n=60, length=300, seed=1, values="ABCD"):
    """Random letters without a space, one record ``KEY=v`` hidden in each (label v, one of ``values``): the text WordPiece lost."""
    r = random.Random(seed)
    rows = []
    for _ in range(n):
        v = r.choice(values)
        s = "".join(r.choice(string.ascii_lowercase) for _ in range(length))
        at = r.randrange(length)
        rows.append({"text": s[:at] + "KEY=" + v + s[at:], "label": v})
    path.write_text("".join(json.dumps(x) + "\n" for x in rows))
    return path


TINY = dict(steps=12, eval_every=4, embed_dim=16, num_layers=1, num_heads=2, warmup=2, batch_size=16)

_BUILD = """
import hashlib, sys
from attnlab import tasks
t = tasks.create("jsonl", path=sys.argv[1])
print(hashlib.sha256(t.artifacts["tokenizer"].encode() + t.split("test").tokens.numpy().tobytes()).hexdigest())
"""


def test_the_same_file_gives_the_same_tokenizer_and_tokens_in_every_process(tmp_path):
    """Before, WordPiece's subword ids came in hash-map order: two processes gave two vocabularies (three: three)."""
    import hashlib

    data = words_file(tmp_path / "w.jsonl")
    seen = {subprocess.run([sys.executable, "-c", _BUILD, str(data)], check=True, capture_output=True, text=True,
                           env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout.strip() for seed in (1,)}
    here = tasks.create("jsonl", path=str(data))  # and this process's own (another hash seed: pytest's, or a random one)
    seen.add(hashlib.sha256(here.artifacts["tokenizer"].encode() + here.split("test").tokens.numpy().tobytes()).hexdigest())
    assert len(seen) == 1, seen


def test_eval_and_resume_encode_with_the_runs_saved_tokenizer_and_refuse_a_run_without_one(tmp_path):
    data = words_file(tmp_path / "w.jsonl")
    cfg = TrainConfig.for_task("jsonl", task_options={"path": str(data)}, **TINY)
    res = train(cfg, tmp_path / "run")
    assert evaluate(tmp_path / "run").value == res.value  # the score train printed
    meta_file = tmp_path / "run" / "checkpoint" / "config.json"
    meta = json.loads(meta_file.read_text())
    other = tasks.create("jsonl", path=str(data), vocab_size=300).artifacts["tokenizer"]  # another tokenizer of the same file
    assert other != meta["task_artifacts"]["tokenizer"]
    meta["task_artifacts"]["tokenizer"] = other
    meta_file.write_text(json.dumps(meta))
    from attnlab.tasks.jsonl import encode_inputs
    from attnlab.training import load_checkpoint
    from attnlab.training.inference import saved_task

    task = saved_task(load_checkpoint(tmp_path / "run"))
    assert task.artifacts["tokenizer"] == other  # encoded with what the run saved, not a tokenizer trained anew
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    ids = encode_inputs("classification", task.artifacts, rows)
    test = task.split("test").tokens
    assert any(test[i, : len(r)].tolist() == r for r in ids for i in range(len(test)))
    with pytest.raises(ValueError, match="differ from those the run in"):  # a task built anew is not the run's
        train(cfg, tmp_path / "run", resume=True, task=tasks.create("jsonl", path=str(data)))
    del meta["task_artifacts"]["tokenizer"]
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="saved without its tokenizer"):
        evaluate(tmp_path / "run")
    with pytest.raises(ValueError, match="saved without its tokenizer"):
        train(cfg, tmp_path / "run", resume=True)


def test_user_data_runs_repeat_and_resume_bitwise(tmp_path):
    data = words_file(tmp_path / "w.jsonl")
    cfg = TrainConfig.for_task("jsonl", task_options={"path": str(data)}, **TINY)
    train(cfg, tmp_path / "a")
    train(cfg, tmp_path / "b")

    def stop(step, total, loss):
        if step == 6:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(cfg, tmp_path / "cut", on_step=stop)
    assert json.loads((tmp_path / "cut" / "checkpoint" / "config.json").read_text())["step"] == 4
    train(cfg, tmp_path / "cut", resume=True)
    for name in ("model.safetensors", "best.safetensors"):
        want = (tmp_path / "a" / "checkpoint" / name).read_bytes()
        assert (tmp_path / "b" / "checkpoint" / name).read_bytes() == want, name
        assert (tmp_path / "cut" / "checkpoint" / name).read_bytes() == want, name


def test_text_without_spaces_keeps_every_character(tmp_path):
    from tokenizers import Tokenizer

    from attnlab.tasks.jsonl import unknown_share

    task = tasks.create("jsonl", path=str(unspaced_file(tmp_path / "u.jsonl")))
    tok = Tokenizer.from_str(task.artifacts["tokenizer"])
    assert tok.token_to_id("[UNK]") is None
    for name, split in task.splits.items():
        rows = [[t for t in row.tolist() if t != 0] for row in split.tokens]
        assert unknown_share(task.artifacts["tokenizer"], rows) == 0.0, name
        assert min(len(r) for r in rows) > 30  # hundreds of letters are tokens, not one unknown word
    rows = [json.loads(line)["text"] for line in (tmp_path / "u.jsonl").read_text().splitlines()]
    assert all(tok.decode(tok.encode(t).ids) == t for t in rows)  # every character comes back
    chinese = tmp_path / "zh.jsonl"
    lines = ["自注意力机制可以处理任意向量集合", "每个输入向量都会考虑整个序列", "位置编码补充了位置信息"] * 4  # the lecture's language
    chinese.write_text("".join(json.dumps({"text": t, "label": i % 2}) + "\n" for i, t in enumerate(lines)))
    zh = tasks.create("jsonl", path=str(chinese))
    tok = Tokenizer.from_str(zh.artifacts["tokenizer"])
    assert tok.decode(tok.encode("注意力是一种方法").ids) == "注意力是一种方法"  # unseen characters too: bytes


def test_words_unknown_to_a_tagging_vocabulary_are_counted_in_a_warning(tmp_path):
    from attnlab.tasks.jsonl import UnknownTokensWarning

    rows = [{"tokens": ["a", "b", f"w{i}"], "labels": ["X", "Y", "Z"]} for i in range(40)]  # every row its own third word
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.warns(UnknownTokensWarning, match=r"0\.0% of train, 33\.3% of val, 33\.3% of test"):
        tasks.create("jsonl", path=str(path))


def test_a_changed_file_is_refused_by_eval_and_resume_and_gets_new_arena_runs(tmp_path):
    from attnlab.arena import plan
    from attnlab.arena.report import leaderboard
    from attnlab.tasks import DataChangedError

    data = words_file(tmp_path / "mine.jsonl")
    cfg = TrainConfig.for_task("jsonl", task_options={"path": str(data)}, **{**TINY, "steps": 4})
    train(cfg, tmp_path / "run")
    before = plan("quick", tasks=["jsonl"], variants=["dense"], data=str(data))
    assert [s.run_id for s in plan("quick", tasks=["jsonl"], variants=["dense"], data=str(data))] == [s.run_id for s in before]
    digest = tasks.data_digest("jsonl", {"path": str(data)})
    assert before[0].data_sha256 == digest and tasks.create("jsonl", path=str(data)).artifacts["data_sha256"] == digest
    words_file(data, seed=5)  # the same path, other contents
    with pytest.raises(DataChangedError, match=rf"mine.jsonl has changed since the run read it \(sha256 {digest[:12]} then"):
        evaluate(tmp_path / "run")
    with pytest.raises(DataChangedError, match="has changed since"):
        train(cfg, tmp_path / "run", resume=True)
    after = plan("quick", tasks=["jsonl"], variants=["dense"], data=str(data))
    assert after[0].run_id != before[0].run_id and after[0].data_sha256 != digest
    rows = [{"run_id": s.run_id, "task": "jsonl", "variant": "dense", "seed": 0, "config": dataclasses.asdict(s.config), "status": "done",
             "metric": "accuracy", "value": v, "steps": 4, "steps_per_second": 1.0, "peak_bytes": 1, "params": 1, "test_size": 100,
             "data_sha256": s.data_sha256, "sweep": {}, "history": [], "error": None}
            for s, v in ((before[0], 0.9), (after[0], 0.3))]
    board = leaderboard(rows)
    assert set(board["tasks"]) == {f"jsonl (mine.jsonl, sha256 {digest[:12]})", f"jsonl (mine.jsonl, sha256 {after[0].data_sha256[:12]})"}


def test_a_task_given_in_python_is_checked_too_and_resuming_on_another_file_names_the_option(tmp_path):
    from attnlab.tasks import DataChangedError, Task, check_saved
    from attnlab.training import ConfigMismatchError

    data = words_file(tmp_path / "mine.jsonl")
    cfg = TrainConfig.for_task("jsonl", task_options={"path": str(data)}, **{**TINY, "steps": 4})
    train(cfg, tmp_path / "run")
    other = words_file(tmp_path / "other.jsonl", seed=7)
    with pytest.raises(ConfigMismatchError, match="path"):  # another file is another option, not a changed one
        train(TrainConfig.for_task("jsonl", task_options={"path": str(other)}, **{**TINY, "steps": 4}), tmp_path / "run", resume=True)
    fresh = tasks.create("jsonl", path=str(data), vocab_size=300)  # built in Python with other tokenizers
    with pytest.raises(ValueError, match="labels|tokenizer"):
        evaluate(tmp_path / "run", task=fresh)
    words_file(data, seed=5)
    with pytest.raises(DataChangedError):
        evaluate(tmp_path / "run", task=tasks.create("jsonl", path=str(data)))
    custom = Task("custom", "classification", 4, 2, "accuracy", {}, {}, artifacts={"x": 1})  # a task of the user's own, unregistered
    check_saved(custom, {"x": 2})  # nothing it could check: no refusal, no crash


def test_a_folders_hash_covers_the_files_the_task_reads_and_an_unreadable_file_is_named(tmp_path):
    (tmp_path / "yes").mkdir()
    (tmp_path / "yes" / "a.wav").write_bytes(b"RIFF1")
    before = tasks.data_digest("wav_folder", {"path": str(tmp_path)})
    (tmp_path / ".DS_Store").write_bytes(b"x")
    (tmp_path / "yes" / "notes.txt").write_text("not audio")
    assert tasks.data_digest("wav_folder", {"path": str(tmp_path)}) == before
    (tmp_path / "yes" / "a.wav").write_bytes(b"RIFF2")
    assert tasks.data_digest("wav_folder", {"path": str(tmp_path)}) != before
    with pytest.raises(ValueError, match=r"cannot read .*missing\.jsonl"):
        tasks.data_digest("jsonl", {"path": str(tmp_path / "missing.jsonl")})
