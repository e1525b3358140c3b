"""Run the attnlab command as a user would (typer's CliRunner)."""

from typer.testing import CliRunner

from attnlab.cli import app

runner = CliRunner()


def run_ok(*args):
    res = runner.invoke(app, list(args))
    assert res.exit_code == 0, res.output
    return res.output
