"""The attnlab app: version, one-line errors, the entry points, and the helpers every command shares."""

import json

import pytest
import typer

import attnlab
from attnlab.cli import app, common
from tests.cli.helpers import run_ok, runner


def test_version():
    assert run_ok("--version").strip() == f"attnlab {attnlab.__version__}"


@pytest.mark.parametrize(
    "args, words",
    [
        (["explain", "x y", "--num-heads", "3"], "num_heads must be a positive divisor of embed_dim=4"),
        (["explain", "x y", "--score", "euclid"], "'euclid' is not one of 'additive'"),
        (["explain", "x y", "--normalize", "max"], "'max' is not one of 'relu', 'sigmoid', 'softmax'"),
        (["explain", "   "], "the text is empty"),
        (["bench", "attention", "--sizes", "a,b"], "--sizes must be comma-separated integers"),
        (["bench", "attention", "--configs", "dot+max"], "unknown --configs"),
    ],
)
def test_bad_arguments_give_one_line_errors(args, words):
    res = runner.invoke(app, args)
    assert res.exit_code == 2
    assert words in res.output and "Traceback" not in res.output


def test_entry_points_are_the_cli_main():
    import attnlab.__main__ as module_main
    import attnlab.cli.__main__ as cli_main

    assert module_main.main is attnlab.cli.main and cli_main.main is attnlab.cli.main


def test_every_group_lists_its_commands():
    assert all(c in run_ok("--help") for c in ("explain", "complexity", "arena", "report", "train", "eval", "predict", "bench"))
    bench = run_ok("bench", "--help")
    assert all(c in bench for c in ("attention", "positional", "scaling", "approximation", "distance", "graph", "audio"))
    assert "vit-cnn" in run_ok("compare", "--help") and "positional" in run_ok("plot", "--help")


def _err(capsys) -> str:
    return " ".join(capsys.readouterr().err.split())  # a long error wraps


def _exit_code(call):
    with pytest.raises(typer.Exit) as info:
        call()
    return info.value.exit_code


def test_list_options_parse_or_fail_with_exit_code_2(capsys):
    assert common.split_list(" a, b,,c ,") == ["a", "b", "c"]
    assert common.int_list("--sizes", "16, 32,") == [16, 32]
    assert _exit_code(lambda: common.int_list("--sizes", "16,x")) == 2
    assert "--sizes must be comma-separated integers, got '16,x'" in _err(capsys)
    assert _exit_code(lambda: common.int_list("--seeds", "0,-1")) == 2
    assert "--seeds must be integers >= 0" in _err(capsys)
    assert _exit_code(lambda: common.int_list("--sizes", "0", minimum=1, what="positive integers")) == 2
    assert "--sizes must be positive integers" in _err(capsys)
    assert common.name_list("--layers", "rnn, cnn", ("cnn", "rnn")) == ["rnn", "cnn"]
    assert _exit_code(lambda: common.name_list("--layers", "rnn,gru", ("cnn", "rnn"))) == 2
    assert "unknown --layers ['gru']; expected some of cnn, rnn" in _err(capsys)
    assert _exit_code(lambda: common.name_list("--layers", " , ", ("cnn",))) == 2
    assert common.name_list("--modes", "", ("fwd",), required=False) == []


class _Record:
    def __init__(self, n):
        self.n = n

    def to_dict(self):
        return {"n": self.n}


def test_tracker_keeps_records_and_rewrites_the_output_after_each(tmp_path):
    path = tmp_path / "sub" / "records.json"
    seen = []
    with common.track("measuring", 3, str(path), common.records_json) as tracker:
        tick = tracker.on_record(lambda rec: f"n={rec.n}")
        for n in (1, 2):
            tick(_Record(n))
            seen.append(json.loads(path.read_text()))
        extra: list = []
        tracker.on_record(into=extra)(_Record(3))
        tracker.on_step(lambda step, loss: f"step {step} loss {loss}")(1, 0.5)
        assert tracker.bar.tasks[0].completed == 4 and tracker.bar.tasks[0].description == "step 1 loss 0.5"
    assert seen == [{"records": [{"n": 1}]}, {"records": [{"n": 1}, {"n": 2}]}]
    assert [r.n for r in tracker.records] == [1, 2] and [r.n for r in extra] == [3]
    assert not list(path.parent.glob("*.tmp"))


def test_from_file_errors_name_the_command(tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    assert _exit_code(lambda: common.load_report(str(bad), "bench scaling", lambda d: d["records"])) == 1  # a file: run time
    assert "not a records file written by 'attnlab bench scaling -o'" in _err(capsys)
