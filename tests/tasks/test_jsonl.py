"""User data: jsonl files of the three kinds, tokenizers trained on them, clear errors, predict."""

import json

import pytest
from typer.testing import CliRunner

from attnlab import tasks
from attnlab.cli import app
from attnlab.training import TrainConfig, predict, train


def write(path, rows):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def tagging_rows(n=60):
    words = ["I", "saw", "a", "saw", "you", "cut", "the", "wood"]
    tags = {"I": "PRON", "you": "PRON", "a": "DET", "the": "DET", "saw": "VERB", "cut": "VERB", "wood": "NOUN"}
    rows = []
    for i in range(n):
        toks = words[i % 3 :]
        labs = ["NOUN" if t == "saw" and j > 0 and toks[j - 1] in ("a", "the") else tags[t] for j, t in enumerate(toks)]
        rows.append({"tokens": toks, "labels": labs})
    return rows


def test_three_kinds_are_read_tokenized_and_split(tmp_path):
    tag = tasks.create("jsonl", path=str(write(tmp_path / "t.jsonl", tagging_rows())))
    assert tag.kind == "tagging" and "VERB" in tag.label_names and "NOUN" in tag.label_names
    assert sum(len(s) for s in tag.splits.values()) == 60 and len(tag.split("test")) == 6
    saw = tag.vocab.index("saw")
    assert tag.vocab[:2] == ["<pad>", "<cls>"] and saw > 2
    cls = tasks.create("jsonl", path=str(write(tmp_path / "c.jsonl",
                                               [{"text": f"good movie number {i}", "label": i % 2} for i in range(30)])))
    assert cls.kind == "classification" and cls.label_names == ["0", "1"] and cls.split("train").labels.dim() == 1
    s2s = tasks.create("jsonl", path=str(write(tmp_path / "s.jsonl",
                                               [{"source": f"one two {i}", "target": f"{i} deux un"} for i in range(30)])))
    assert s2s.kind == "seq2seq" and s2s.label_names[:3] == ["<pad>", "<bos>", "<eos>"]
    assert all(row[row != 0][-1] == 2 for row in s2s.split("train").labels)  # every target ends with EOS


@pytest.mark.parametrize(
    "rows, message",
    [
        (['{"tokens": ["a"], "labels": ["X"]}', "{oops"], "line 2: not valid JSON"),
        (['{"tokens": ["a"], "labels": ["X"]}', '{"tokens": ["a", "b"], "labels": ["X"]}'],
         "line 2: field 'labels' has 1 entries for 2 tokens"),
        (['{"tokens": ["a"], "labels": ["X"]}', '{"tokens": ["a"]}'], "line 2: missing field 'labels'"),
        (['{"text": "hi", "label": "x"}', '{"text": "", "label": "x"}'], "line 2: field 'text' must be a non-empty string"),
        (['{"words": []}'], "line 1: expected the fields tokens+labels"),
        (["[1, 2]"], "line 1: expected a JSON object"),
    ],
)
def test_malformed_files_name_the_line_and_the_field(tmp_path, rows, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("+", r"\+")):
        tasks.create("jsonl", path=str(write(tmp_path / "bad.jsonl", rows)))


def test_train_then_predict_from_the_checkpoint_alone(tmp_path):
    data = write(tmp_path / "t.jsonl", tagging_rows(200))
    cfg = TrainConfig.for_task("jsonl", task_options={"path": str(data)}, steps=150, eval_every=50, embed_dim=32, num_layers=1, num_heads=2,
                               positional="rope", lr=3e-3, warmup=10)
    res = train(cfg, tmp_path / "run")
    assert res.value > 0.95
    data.unlink()  # prediction needs only the checkpoint
    inp = write(tmp_path / "in.jsonl", [{"tokens": ["I", "saw", "a", "saw", "you", "cut"]}, {"tokens": ["I", "cut", "a", "unseenword"]}])
    r = CliRunner().invoke(app, ["predict", str(tmp_path / "run"), str(inp)])
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert rows[0]["prediction"] == ["PRON", "VERB", "DET", "NOUN", "PRON", "VERB"]  # the two saws tagged apart
    assert len(rows[1]["prediction"]) == 4 and rows[1]["tokens"] == ["I", "cut", "a", "unseenword"]
    bad = write(tmp_path / "bad.jsonl", [{"text": "no tokens field"}])
    r = CliRunner().invoke(app, ["predict", str(tmp_path / "run"), str(bad)])
    assert r.exit_code == 1 and "missing field 'tokens'" in " ".join(r.output.split())  # a damaged data file: run time


def test_predict_refuses_a_builtin_task_checkpoint(tmp_path):
    train(TrainConfig.for_task("pos", task_options={"size": 64}, steps=2, eval_every=2, embed_dim=16, num_layers=1, num_heads=2), tmp_path)
    with pytest.raises(ValueError, match="not on user data"):
        predict(tmp_path, [{"tokens": ["a"]}])
    with pytest.raises(ValueError, match="needs its file"):
        tasks.create("jsonl")


def test_train_on_user_data_reports_the_no_attention_baseline(tmp_path):
    data = write(tmp_path / "t.jsonl", tagging_rows(120))
    args = ["train", "jsonl", "--task-option", f"path={data}", "--steps", "6", "--eval-every", "3", "--embed-dim", "16",
            "--num-layers", "1", "--num-heads", "2", "--out", str(tmp_path / "run"), "--json"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout.splitlines()[-1])
    assert summary["baseline"]["model"] == "window_mlp" and 0.0 <= summary["baseline"]["value"] <= 1.0
    from attnlab.training import load_checkpoint

    base = load_checkpoint(tmp_path / "run" / "baseline")
    assert base.config.model == "window_mlp" and base.config.steps == 6 and base.config.task_options == {"path": str(data)}
    assert base.meta["task_artifacts"] == load_checkpoint(tmp_path / "run").meta["task_artifacts"]  # the same tokens, labels and file
    r = CliRunner().invoke(app, [*args[:-1], "--no-baseline", "--out", str(tmp_path / "run2"), "--json"])
    assert "baseline" not in json.loads(r.stdout.splitlines()[-1])


def test_the_baseline_config_drops_attention_and_its_summary_token():
    text = TrainConfig.for_task("text", attention="local", attention_options={"window": 8}, positional="rope", steps=7, seconds=5.0)
    base = text.baseline()
    assert (base.model, base.attention, base.attention_options, base.positional, base.pooling) == ("mlp", "dense", {}, "none", "mean")
    assert (base.steps, base.seconds, base.lr, base.seed) == (7, 5.0, text.lr, text.seed)
    assert TrainConfig.for_task("digits").baseline().model == "cnn"
    with pytest.raises(ValueError, match="no no-attention baseline"):
        TrainConfig.for_task("translate").baseline()
    assert TrainConfig.for_task("jsonl").positional == "rope"  # measured: benchmarks/user_data.py


def test_the_defaults_follow_the_datas_length(tmp_path):
    """Measured (benchmarks/long_documents.py): long documents train at batch 8, warm-up 20, lr 0.002."""
    from attnlab.tasks import jsonl

    short, long = tmp_path / "short.jsonl", tmp_path / "long.jsonl"
    short.write_text("".join(json.dumps({"text": "a few words here", "label": i % 2}) + "\n" for i in range(10)))
    long.write_text("".join(json.dumps({"text": " ".join(["word"] * (jsonl.LONG_WORDS + 1)), "label": i % 2}) + "\n" for i in range(10)))
    cfg = TrainConfig.for_task("jsonl", task_options={"path": str(short)})
    assert (cfg.positional, cfg.batch_size, cfg.warmup, cfg.lr) == ("rope", 32, 100, 1e-3)
    cfg = TrainConfig.for_task("jsonl", task_options={"path": str(long)})
    assert (cfg.positional, cfg.batch_size, cfg.warmup, cfg.lr) == ("rope", 8, 20, 0.002)
    base = cfg.baseline()  # the baseline trains on the same recipe
    assert (base.model, base.batch_size, base.warmup, base.lr) == ("window_mlp", 8, 20, 0.002)
    assert TrainConfig.for_task("jsonl", task_options={"path": str(long)}, batch_size=16).batch_size == 16  # a given option still wins
    assert TrainConfig.for_task("jsonl", task_options={"path": str(tmp_path / "missing.jsonl")}).batch_size == 32
