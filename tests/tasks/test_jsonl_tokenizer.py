"""User text's tokenizer chosen by the data (issue 58, finding 5): character-level where the text is
not words (no spaces, a small alphabet), byte-level BPE otherwise, overridable, printed and saved
with the run; a run saved before the choice keeps its own BPE tokenizer."""

import hashlib
import json
import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer
from typer.testing import CliRunner

from attnlab import tasks
from attnlab.cli import app
from attnlab.training import TrainConfig, evaluate, load_checkpoint, train
from tests.tasks.test_user_data_trust import unspaced_file

OLD_RUN = Path(__file__).resolve().parents[1] / "data" / "jsonl-bpe-v1"
TINY = dict(steps=4, eval_every=4, embed_dim=16, num_layers=1, num_heads=2, warmup=1, batch_size=8)


def lower_file(path, n=80, length=200, seed=2):
    """The finding's file: random lowercase letters, one record ``KEY=v`` inside, ``v`` a lowercase letter (the label)."""
    unspaced_file(path, n, length, seed, values="abcd")
    return path, [json.loads(line) for line in path.read_text().splitlines()]


def code_file(path, n=80):
    """Ordinary text: pieces of this library's own source, labelled by the module they come from."""
    src = Path(tasks.__file__).parent
    rows = []
    for name in ("jsonl.py", "base.py"):
        text = (src / name).read_text()
        rows += [{"text": text[k : k + 300], "label": name} for k in range(0, 300 * (n // 2), 300)]
    path.write_text("".join(json.dumps(x) + "\n" for x in rows))
    return path


def after_key(task, rows):
    """The token after ``=`` in each record, with the task's tokenizer."""
    tok = Tokenizer.from_str(task.artifacts["tokenizer"])
    out = []
    for r in rows:
        toks = tok.encode(r["text"]).tokens
        out.append(toks[toks.index("=") + 1])
    return out


def test_text_without_spaces_gets_one_token_per_character_and_the_value_its_own_token(tmp_path):
    from attnlab.tasks.jsonl import tokenizer_kind

    path, rows = lower_file(tmp_path / "lower.jsonl")
    task = tasks.create("jsonl", path=str(path))
    assert task.artifacts["tokenizer_kind"] == "char" and tokenizer_kind(task.artifacts["tokenizer"]) == "char"
    assert after_key(task, rows) == [r["label"] for r in rows]  # the answer is one token, never merged with its neighbours
    assert task.max_len == 205 and task.vocab[:2] == ["<pad>", "<cls>"]
    tok = Tokenizer.from_str(task.artifacts["tokenizer"])
    assert tok.decode(tok.encode("KEY=q 注意").ids) == "KEY=q 注意"  # a character it never saw: its bytes, nothing unknown
    bpe = tasks.create("jsonl", path=str(path), tokenizer="bpe")  # what every file got before
    assert bpe.artifacts["tokenizer_kind"] == "bpe" and any(len(t) > 1 for t in after_key(bpe, rows))
    again = tasks.create("jsonl", path=str(path))  # deterministic
    assert again.artifacts["tokenizer"] == task.artifacts["tokenizer"]
    assert (again.split("test").tokens == task.split("test").tokens).all()


def test_words_keep_byte_level_bpe_exactly_as_before(tmp_path):
    path = code_file(tmp_path / "code.jsonl")
    auto = tasks.create("jsonl", path=str(path))
    assert auto.artifacts["tokenizer_kind"] == "bpe" and auto.notes[0].startswith("tokenizer: byte-level BPE (auto: ")
    assert auto.artifacts["tokenizer"] == tasks.create("jsonl", path=str(path), tokenizer="bpe").artifacts["tokenizer"]
    forced = tasks.create("jsonl", path=str(path), tokenizer="char")
    assert forced.artifacts["tokenizer_kind"] == "char" and forced.notes == ["tokenizer: character-level (tokenizer=char given)"]


@pytest.mark.parametrize(
    "texts, kind, why",
    [
        (["the cat sat on the mat"] * 3, "bpe", "whitespace, 5% or more: words"),
        (["acgtacgttgca" * 20] * 3, "char", "under 5%, in 4 distinct characters, at most 128: not words"),
        (["".join(chr(0x4E00 + i) for i in range(k, k + 100)) for k in (0, 100)], "bpe", "in 200 distinct characters, over 128"),
        (["a b" + "x" * 100], "char", "1.0% of the training text is whitespace"),
    ],
)
def test_the_rule_and_its_reason(texts, kind, why):
    from attnlab.tasks.jsonl import choose_tokenizer

    got, reason = choose_tokenizer(texts)
    assert got == kind and why in reason and reason.startswith("auto: ")


def test_long_rows_of_characters_train_on_the_long_document_recipe(tmp_path):
    """A 205-character row is 205 character tokens: long (benchmarks/user_data_repro.py --only-tokenizer)."""
    from attnlab.tasks.jsonl import LONG_DEFAULTS, SHORT_DEFAULTS

    path, _ = lower_file(tmp_path / "lower.jsonl")
    cfg = TrainConfig.for_task("jsonl", task_options={"path": str(path)})
    assert {k: getattr(cfg, k) for k in LONG_DEFAULTS} == LONG_DEFAULTS
    cfg = TrainConfig.for_task("jsonl", task_options={"path": str(path), "tokenizer": "bpe"})  # a few long "words": short, as before
    assert {k: getattr(cfg, k) for k in SHORT_DEFAULTS} == SHORT_DEFAULTS and cfg.batch_size == 32
    short, _ = lower_file(tmp_path / "short.jsonl", length=100)
    assert TrainConfig.for_task("jsonl", task_options={"path": str(short)}).batch_size == 32


def test_the_option_is_checked(tmp_path):
    path, _ = lower_file(tmp_path / "lower.jsonl")
    with pytest.raises(ValueError, match="tokenizer must be one of 'auto', 'char', 'bpe', got 'wordpiece'"):
        tasks.create("jsonl", path=str(path), tokenizer="wordpiece")
    tagging = tmp_path / "t.jsonl"
    tagging.write_text("".join(json.dumps({"tokens": ["a", "b"], "labels": ["X", "Y"]}) + "\n" for _ in range(10)))
    assert tasks.create("jsonl", path=str(tagging)).artifacts["tokenizer_kind"] == "word"
    with pytest.raises(ValueError, match="tagging data brings its own tokens"):
        tasks.create("jsonl", path=str(tagging), tokenizer="char")


def test_seq2seq_chooses_for_source_and_target_apart(tmp_path):
    path = tmp_path / "s.jsonl"
    r = random.Random(0)
    rows = [{"source": "".join(r.choice("acgt") for _ in range(60)), "target": f"gene number {i} of the set"} for i in range(30)]
    path.write_text("".join(json.dumps(x) + "\n" for x in rows))
    task = tasks.create("jsonl", path=str(path))
    assert (task.artifacts["tokenizer_kind"], task.artifacts["target_tokenizer_kind"]) == ("char", "bpe")
    assert task.notes[0].startswith("input tokenizer: character-level") and task.notes[1].startswith("target tokenizer: byte-level BPE")


def test_the_choice_is_printed_saved_with_the_run_and_reused(tmp_path):
    from attnlab.tasks.jsonl import tokenizer_kind

    path, _ = lower_file(tmp_path / "lower.jsonl")
    args = ["train", "jsonl", "--data", str(path), "--no-baseline", "--steps", "4", "--eval-every", "4", "--embed-dim", "16",
            "--num-layers", "1", "--num-heads", "2", "--batch-size", "8"]
    r = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "run"), "--json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout.splitlines()[-1])
    assert summary["notes"] == ["tokenizer: character-level (auto: 0.0% of the training text is whitespace, under 5%, in 30 distinct "
                                "characters, at most 128: not words)"]
    art = json.loads((tmp_path / "run" / "checkpoint" / "config.json").read_text())["task_artifacts"]
    assert art["tokenizer_kind"] == "char" and art["tokenizer_reason"] == summary["notes"][0][len("tokenizer: character-level ("):-1]
    assert tokenizer_kind(art["tokenizer"]) == "char"
    assert evaluate(tmp_path / "run").value == summary["value"]  # scored again with the run's own character tokenizer
    r = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "text")])
    lines = r.stdout.splitlines()
    score = next(i for i, line in enumerate(lines) if "test accuracy = " in line)
    assert lines[score + 1] == summary["notes"][0]  # under the score
    res = train(TrainConfig.for_task("jsonl", task_options={"path": str(path), "tokenizer": "bpe"}, **TINY), tmp_path / "bpe")
    assert res.notes == ["tokenizer: byte-level BPE (tokenizer=bpe given)"]


def test_a_run_saved_before_the_choice_keeps_its_bpe_tokenizer_and_its_score(monkeypatch):
    """tests/data/jsonl-bpe-v1 was written by the code before this choice (make.py beside it): BPE on
    a file that auto now tokenizes by character."""
    monkeypatch.chdir(OLD_RUN)  # the run names its file by a relative path
    want = json.loads((OLD_RUN / "expected.json").read_text())
    meta = json.loads((OLD_RUN / "run" / "checkpoint" / "config.json").read_text())
    assert "tokenizer_kind" not in meta["task_artifacts"] and "tokenizer" not in meta["train"]["task_options"]
    assert tasks.create("jsonl", path="nospace.jsonl").artifacts["tokenizer_kind"] == "char"  # a new run would
    res = evaluate(OLD_RUN / "run")
    assert res.value == want["value"]
    from attnlab.training.inference import saved_task

    task = saved_task(load_checkpoint(OLD_RUN / "run"))
    assert hashlib.sha256(task.artifacts["tokenizer"].encode()).hexdigest() == want["tokenizer_sha256"]
    assert hashlib.sha256(task.split("test").tokens.numpy().tobytes()).hexdigest() == want["test_tokens_sha256"]
    assert task.artifacts["tokenizer_kind"] == "bpe" and task.notes == ["tokenizer: byte-level BPE (saved with the run)"]


def test_an_arena_run_tokenized_by_character_never_takes_the_id_of_a_bpe_run_stored_before(tmp_path):
    """Rows of no-space text short enough to keep the short defaults: the same config as before the
    rule, so the character-level run needs an id of its own; a file of words keeps its id."""
    from attnlab.arena import plan
    from attnlab.arena.planning import _run_id

    for make, char in ((lambda p: lower_file(p, length=60), True), (code_file, False)):
        path = tmp_path / f"{char}.jsonl"
        make(path)
        (spec,) = plan("quick", tasks=[], variants=["dense"], seeds=[0], data=str(path))
        assert (spec.run_id != _run_id(spec.config, spec.data_sha256)) == char


def test_a_seq2seq_target_tokenized_by_character_is_in_the_run_id_too(tmp_path):
    from attnlab.tasks.jsonl import run_id_fields

    r = random.Random(0)
    path = tmp_path / "dna.jsonl"
    rows = [{"source": f"the gene number {i} of the cell", "target": "".join(r.choice("acgt") for _ in range(40))} for i in range(60)]
    path.write_text("".join(json.dumps(x) + "\n" for x in rows))
    assert run_id_fields(str(path)) == {"target_tokenizer": "char"}
    assert run_id_fields(str(path), tokenizer="bpe") == {} and run_id_fields(None) == {}
