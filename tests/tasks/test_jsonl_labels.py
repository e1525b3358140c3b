"""A user file's labels (issue 58, finding 4): one label is refused before any work, a nearly
one-class file warns and its majority label's score stands beside the model's in the summary."""

import json

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from typer.testing import CliRunner

from attnlab import tasks
from attnlab.cli import app

ARGS = ["--steps", "5", "--eval-every", "5", "--embed-dim", "16", "--num-layers", "1", "--num-heads", "2", "--batch-size", "8"]


def labelled(path, labels):
    path.write_text("".join(json.dumps({"text": f"some words, number {i} of them", "label": lab}) + "\n" for i, lab in enumerate(labels)))
    return path


def test_a_file_with_one_label_is_refused_when_the_task_is_built(tmp_path):
    one = labelled(tmp_path / "onelabel.jsonl", ["x"] * 50)
    with pytest.raises(ValueError, match=r"onelabel.jsonl: every record has the label 'x': a model scores 1\.0 by always answering it"):
        tasks.create("jsonl", path=str(one))
    tagging = tmp_path / "tags.jsonl"
    tagging.write_text("".join(json.dumps({"tokens": ["a", "b", f"w{i}"], "labels": ["O", "O", "O"]}) + "\n" for i in range(20)))
    with pytest.raises(ValueError, match="every token has the label 'O'"):
        tasks.create("jsonl", path=str(tagging))


def test_train_refuses_it_in_one_line_with_exit_1_and_writes_nothing(tmp_path):
    one = labelled(tmp_path / "onelabel.jsonl", ["x"] * 50)
    r = CliRunner().invoke(app, ["train", "jsonl", "--data", str(one), *ARGS, "--out", str(tmp_path / "run")])
    assert r.exit_code == 1, r.output  # the data file cannot serve: run time
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert lines[-1].startswith("error: ") and "every record has the label 'x'" in lines[-1]
    assert "test accuracy" not in r.output and not (tmp_path / "run").exists()


def test_a_nearly_one_class_file_warns_and_shows_the_majority_score(tmp_path):
    from attnlab.tasks.jsonl import MajorityLabelWarning

    labels = ["y" if i % 20 == 0 else "x" for i in range(200)]  # 95% x
    near = labelled(tmp_path / "near.jsonl", labels)
    with pytest.warns(MajorityLabelWarning, match=r"near.jsonl: 95\.0% of the records have the label 'x'"):
        task = tasks.create("jsonl", path=str(near))
    test = task.split("test").labels
    majority = float((test == task.label_names.index("x")).float().mean())
    assert task.notes[-1] == f"majority class alone ('x', 95.0% of the file's records): test accuracy = {majority:.4f}"
    with pytest.warns(MajorityLabelWarning):
        r = CliRunner().invoke(app, ["train", "jsonl", "--data", str(near), *ARGS, "--no-baseline", "--out", str(tmp_path / "run")])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    score = next(i for i, line in enumerate(lines) if "test accuracy = " in line)
    assert lines[score + 2] == task.notes[-1]  # under the score and the tokenizer's line
    with pytest.warns(MajorityLabelWarning):
        r = CliRunner().invoke(app, ["train", "jsonl", "--data", str(near), *ARGS, "--no-baseline", "--out", str(tmp_path / "j"), "--json"])
    assert json.loads(r.stdout.splitlines()[-1])["notes"][-1] == task.notes[-1]


def test_below_the_threshold_nothing_is_said(tmp_path, recwarn):
    from attnlab.tasks.jsonl import MAJORITY_WARN, MajorityLabelWarning

    labels = ["y" if i % 10 < 2 else "x" for i in range(200)]  # 80% x
    assert 0.8 < MAJORITY_WARN
    task = tasks.create("jsonl", path=str(labelled(tmp_path / "ok.jsonl", labels)))
    assert not [w for w in recwarn if issubclass(w.category, MajorityLabelWarning)]
    assert not any(n.startswith("majority") for n in task.notes)


def test_a_run_saved_on_a_one_label_file_still_evaluates(tmp_path):
    """A run written before the refusal keeps its score: the task rebuilt from what it saved is not refused."""
    one = labelled(tmp_path / "onelabel.jsonl", ["x"] * 30)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(["some words"], trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<cls>"], show_progress=False,
                                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    saved = {"kind": "classification", "tokenizer": tok.to_str(), "labels": ["x"]}
    task = tasks.create("jsonl", saved=saved, path=str(one))
    assert task.num_labels == 1 and task.notes[-1].startswith("majority class alone ('x', 100.0% of the file's records)")
