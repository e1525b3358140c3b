"""attnlab plot positional."""

import pytest

from attnlab.cli import app
from tests.cli.helpers import run_ok, runner


@pytest.mark.parametrize("name", ["sinusoidal", "learned", "rnn", "floater", "relative", "alibi", "rope"])
def test_plot_positional_writes_a_png(name, tmp_path):
    path = tmp_path / f"{name}.png"
    run_ok("plot", "positional", name, "--length", "40", "--dim", "16", "--num-heads", "3", "-o", str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "args, words",
    [
        (["plot", "positional", "sine"], "'sine' is not one of 'alibi'"),
        (["plot", "positional", "none"], "nothing to draw"),
        (["plot", "positional", "rope", "--dim", "7"], "even"),
    ],
)
def test_plot_positional_errors(args, words):
    res = runner.invoke(app, args)
    assert res.exit_code == 2 and words in " ".join(res.output.split())
