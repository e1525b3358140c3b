"""The CLI's one error boundary: every command, given a bad argument, prints one line and exits with
click's code: 2 for a usage error (a bad value, an unknown option), 1 for a failure at run time (a
missing or damaged file, a file in the way).

The table below has one bad invocation per command; ``test_every_command_has_a_bad_argument_case``
fails when a command is added to the app without one, so every command is covered the day it exists.
"""

import pytest
import typer

from attnlab.cli import app, common, errors
from attnlab.devices import DeviceError
from attnlab.training import CheckpointError
from attnlab.validate import DataError
from tests.cli.helpers import runner


def _commands(cmd=None, path=()):
    """Every leaf command of the typer app, as its path of names."""
    cmd = typer.main.get_command(app) if cmd is None else cmd
    if hasattr(cmd, "commands"):
        for name, sub in cmd.commands.items():
            yield from _commands(sub, (*path, name))
    else:
        yield " ".join(path)


@pytest.fixture
def files(tmp_path):
    """A plain file, a damaged arena store, a damaged checkpoint folder and a missing path."""
    (tmp_path / "file").write_text("not json")
    (tmp_path / "damaged").mkdir()
    (tmp_path / "damaged" / "results.sqlite").write_text("not a database " * 100)
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "config.json").write_text("{")
    return {"file": str(tmp_path / "file"), "damaged": str(tmp_path / "damaged"), "ck": str(tmp_path / "ck"),
            "missing": str(tmp_path / "missing"), "under_file": str(tmp_path / "file" / "out")}


# command -> (arguments with {placeholders} from `files`, words the error line must hold, exit code: 2 usage, 1 run time)
BAD = {
    "explain": (["explain", "x y", "--embed-dim", "0"], "embed_dim must be a positive int", 2),
    "attention": (["attention", "hello", "--model", "{missing}"], "neither a folder nor a known name", 1),
    "view": (["view", "hello", "-o", "{under_file}.html", "--checkpoint", "{ck}"], "unreadable or truncated", 1),
    "complexity": (["complexity", "--layers", "cnn", "--sizes", "8", "-o", "{under_file}/c.json"], "Not a directory", 1),
    "arena": (["arena", "--out", "{damaged}"], "is not an attnlab results store", 1),
    "report": (["report", "{damaged}"], "is not an attnlab results store", 1),
    "train": (["train", "text", "--steps", "1", "--out", "{file}"], "is a file; it must be a folder", 1),
    "eval": (["eval", "{ck}"], "unreadable or truncated", 1),
    "predict": (["predict", "{missing}", "{file}"], "no checkpoint at", 1),
    "generate": (["generate", "{ck}", "hi"], "unreadable or truncated", 1),
    "bench attention": (["bench", "attention", "--sizes", "a,b"], "--sizes must be comma-separated integers", 2),
    "bench positional": (["bench", "positional", "--encodings", "nosuch"], "unknown --encodings", 2),
    "bench scaling": (["bench", "scaling", "--from", "{file}"], "not a records file", 1),
    "bench approximation": (["bench", "approximation", "--variants", "nosuch"], "nosuch", 2),
    "bench distance": (["bench", "distance", "--from", "{missing}"], "No such file or directory", 1),
    "bench recall": (["bench", "recall", "--variants", "dense,nosuch"], "nosuch", 2),
    "bench graph": (["bench", "graph", "--nodes", "4", "--edges", "2", "--repeats", "1", "-o", "{under_file}/g.json"],
                    "Not a directory", 1),
    "bench audio": (["bench", "audio", "--embed-dim", "6", "--num-heads", "2"], "head width must be even", 2),
    "bench pretrained": (["bench", "pretrained", "--model", "{file}"], "is a file; give the model's folder", 1),
    "bench decode": (["bench", "decode", "--checkpoint", "{ck}"], "unreadable or truncated", 1),
    "bench packing": (["bench", "packing", "--min-length", "10", "--max-length", "5"], "exceeds --max-length", 2),
    "bench masks": (["bench", "masks", "--patterns", "nosuch"], "unknown --patterns", 2),
    "bench ring": (["bench", "ring", "--from", "{file}"], "not a records file", 1),
    "bench peak": (["bench", "peak", "--nosuch"], "No such option: --nosuch", 2),
    "bench precision": (["bench", "precision", "--variants", "nosuch"], "unknown --variants", 2),
    "compare vit-cnn": (["compare", "vit-cnn", "--fractions", "x"], "--fractions must be numbers", 2),
    "plot positional": (["plot", "positional", "rope", "--dim", "3", "-o", "{under_file}.png"], "head width must be even", 2),
    "list": (["list", "nosuch"], "'nosuch' is not one of 'tasks', 'variants'", 2),
    "backends": (["backends", "--dtype", "fp8"], "'fp8' is not one of 'fp32', 'bf16', 'fp16'", 2),
    "bench device": (["bench", "device", "--lengths", "0"], "--lengths must be positive integers", 2),
}


def test_every_command_has_a_bad_argument_case():
    assert sorted(_commands()) == sorted(BAD)


@pytest.mark.parametrize("command", sorted(BAD))
def test_a_bad_argument_gives_one_line_and_its_exit_code(command, files):
    args, words, code = BAD[command]
    res = runner.invoke(app, [a.format(**files) for a in args])
    assert res.exit_code == code, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert "Traceback" not in res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], res.stderr


def test_debug_shows_the_traceback(files):
    assert runner.invoke(app, ["eval", files["ck"]]).exit_code == 1
    for args, env in ((["--debug", "eval", files["ck"]], None), (["eval", files["ck"]], {"ATTNLAB_DEBUG": "1"})):
        res = runner.invoke(app, args, env=env)
        assert res.exit_code == 1 and type(res.exception).__name__ == "CheckpointError", res.output
    res = runner.invoke(app, ["--debug", "bench", "distance", "--from", files["missing"]])  # a user error caught by the boundary
    assert isinstance(res.exception, FileNotFoundError)
    assert runner.invoke(app, ["eval", files["ck"]]).exit_code == 1  # --debug holds for its own invocation only


def test_a_bug_is_not_hidden_and_a_message_is_printed_as_written(capsys, monkeypatch):
    monkeypatch.delenv("ATTNLAB_DEBUG", raising=False)
    errors.set_debug(False)

    def broken():
        raise RuntimeError("a bug, not the user's mistake")

    with pytest.raises(RuntimeError, match="a bug"):
        common.boundary(broken)()

    def a_bug():  # a TypeError that no argument check raised: a call with a wrong argument, inside attnlab
        return len(3)

    with pytest.raises(TypeError, match="has no len"):
        common.boundary(a_bug)()

    def bad_type():  # a deliberate argument check (the attention core's, here) is a user error
        import torch

        from attnlab import attend

        attend(torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2), "v")

    with pytest.raises(typer.Exit):
        common.boundary(bad_type)()
    assert "error: v must be a torch.Tensor" in capsys.readouterr().err

    def bad_value():
        raise ValueError("a [bold]bracketed[/bold] value")

    with pytest.raises(typer.Exit) as info:
        common.boundary(bad_value)()
    assert info.value.exit_code == 2
    assert capsys.readouterr().err.strip() == "error: a [bold]bracketed[/bold] value"


@pytest.mark.parametrize("error, code", [(ValueError("bad value"), 2), (FileNotFoundError("no file"), 1), (DataError("bad line"), 1),
                                         (CheckpointError("damaged"), 1), (MemoryError(), 1), (DeviceError("no cuda"), 2)])
def test_a_usage_error_exits_2_and_a_failure_at_run_time_1(error, code, capsys, monkeypatch):
    monkeypatch.delenv("ATTNLAB_DEBUG", raising=False)
    errors.set_debug(False)

    def command():
        raise error

    with pytest.raises(typer.Exit) as info:
        common.boundary(command)()
    assert info.value.exit_code == code == errors.exit_code(error) and capsys.readouterr().err.startswith("error: ")


# a bad name -> a valid choice its one-line error must list
CHOICES = [
    (["train", "pos", "--model", "nosuch"], "window_mlp"),
    (["train", "pos", "--attention", "nosuch"], "longformer"),
    (["train", "pos", "--positional", "nosuch"], "rope"),
    (["train", "nosuch"], "listops"),
    (["train", "pos", "--attention", "local", "--attention-option", "nosuch=1"], "window"),
    (["arena", "--tasks", "nosuch"], "listops"),
    (["arena", "--variants", "nosuch"], "performer"),
    (["arena", "--preset", "nosuch"], "standard"),
    (["explain", "a b", "--score", "nosuch"], "scaled_dot"),
    (["explain", "a b", "--normalize", "nosuch"], "softmax"),
    (["eval", "x", "--split", "nosuch"], "val"),
    (["bench", "masks", "--patterns", "nosuch"], "window"),
    (["bench", "positional", "--encodings", "nosuch"], "alibi"),
    (["bench", "scaling", "--variants", "nosuch"], "nystrom"),
    (["plot", "positional", "nosuch"], "sinusoidal"),
    (["list", "nosuch"], "encodings"),
]


@pytest.mark.parametrize("args, choice", CHOICES)
def test_a_bad_name_lists_the_valid_choices(args, choice, tmp_path):
    res = runner.invoke(app, [*args, *(["--out", str(tmp_path / "o")] if args[0] in ("train", "arena") else [])])
    assert res.exit_code == 2, res.output
    assert res.stderr.count("\n") == 1 and choice in res.stderr, res.stderr
    assert not (tmp_path / "o").exists()
