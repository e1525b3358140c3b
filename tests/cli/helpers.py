"""Run the attnlab command as a user would (typer's CliRunner)."""

from typer.testing import CliRunner

from attnlab.cli import app

runner = CliRunner()


def run_ok(*args):
    res = runner.invoke(app, list(args))
    assert res.exit_code == 0, res.output
    return res.output


def interrupt_training(monkeypatch, module, at: int) -> None:
    """``module.train`` (attnlab's training loop, as ``module`` calls it) is interrupted, as by Ctrl-C,
    right after optimizer step ``at``."""
    real = module.train

    def train(cfg, out, **kw):
        shown = kw["on_step"]

        def on_step(step, total, loss):
            shown(step, total, loss)
            if step == at:
                raise KeyboardInterrupt

        return real(cfg, out, **{**kw, "on_step": on_step})

    monkeypatch.setattr(module, "train", train)
