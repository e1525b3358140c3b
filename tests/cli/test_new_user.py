"""A new user's first hour with the command line (issue 40): one test per finding fixed here,
each failing on the code before it."""


import pytest

from attnlab.cli import app
from attnlab.models.encoder import Encoder
from attnlab.training import TrainConfig
from tests.cli.helpers import runner

TINY = ["--size", "64", "--embed-dim", "16", "--num-layers", "1", "--num-heads", "2", "--eval-every", "2"]


def _one_error(res, *words):
    """``res`` ended with one line on stderr, an error holding every one of ``words``."""
    assert res.exit_code == 2, res.output
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("error: "), res.stderr
    for w in words:
        assert w in res.stderr, res.stderr


def test_2_heads_that_do_not_divide_the_width_are_refused_before_any_model(tmp_path):
    res = runner.invoke(app, ["train", "pos", "--steps", "5", "--num-heads", "3", "--out", str(tmp_path / "o")])
    _one_error(res, "embed_dim 64 must be divisible by num_heads 3", "num_heads 1, 2, 4, 8, 16 divide 64")
    assert "rope" not in res.stderr and not (tmp_path / "o").exists()  # refused at the config: no folder, no model built
    with pytest.raises(ValueError, match="embed_dim 64 must be divisible by num_heads 3"):
        TrainConfig(task="pos", embed_dim=64, num_heads=3)
    TrainConfig(task="pos", model="mlp", embed_dim=64, num_heads=3)  # a model without heads: nothing to divide
    with pytest.raises(ValueError, match="embed_dim must be divisible by num_heads, got embed_dim=64 and num_heads=3"):
        Encoder(64, 3, 1, positional="rope")  # the library's own encoder: the same order


def test_3_generate_on_a_tagger_says_it_is_not_a_language_model_and_nothing_before(runs):
    res = runner.invoke(app, ["generate", str(runs["pos"]), "hello"])  # 205 bytes: past the tagger's context too
    _one_error(res, "holds a tagging model; generate needs a language model")
    assert "warning" not in res.output


def test_6_view_refuses_to_replace_a_file_without_force(runs, tmp_path):
    target = tmp_path / "law.html"
    target.write_text("keep me\n")
    args = ["view", "The with statement", "--checkpoint", str(runs["docs"]), "-o", str(target)]
    _one_error(runner.invoke(app, args), f"-o {target} exists; add --force to replace it")
    assert target.read_text() == "keep me\n"
    assert runner.invoke(app, [*args, "--force"]).exit_code == 0
    assert target.read_text().startswith("<!doctype html>")


def test_6_train_refuses_resume_with_force_and_a_file_as_its_folder(tmp_path):
    res = runner.invoke(app, ["train", "pos", "--out", str(tmp_path / "run"), "--resume", "--force"])
    _one_error(res, "--resume continues the run in --out and --force replaces it: give one of them, not both")
    afile = tmp_path / "afile"
    afile.write_text("x")
    _one_error(runner.invoke(app, ["train", "pos", "--steps", "5", "--out", str(afile)]), f"--out {afile} is a file; it must be a folder")
    res = runner.invoke(app, ["train", "pos", "--steps", "5", "--out", str(afile / "run")])
    _one_error(res, f"--out {afile / 'run'} must be a folder, but {afile} is a file")
    assert "Errno" not in res.stderr and afile.read_text() == "x"
