"""``attnlab train``'s settings (:mod:`attnlab.cli.train_options`): the task options as the arena spells them."""

from attnlab.cli import app
from tests.cli.helpers import runner


def _configs(monkeypatch) -> list:
    """The configs ``attnlab train`` would train (nothing is trained)."""
    from attnlab.cli import train as train_cli

    seen: list = []
    monkeypatch.setattr(train_cli, "_run", lambda task, cfg, *args, **kwargs: seen.append(cfg))
    return seen


def test_train_takes_the_arenas_task_prefix_for_the_task_it_trains(monkeypatch, tmp_path):
    """Issue 58: the arena takes TASK.KEY=VALUE and train took KEY=VALUE only, without saying to drop the prefix."""
    seen = _configs(monkeypatch)
    res = runner.invoke(app, ["train", "lookup", "--task-option", "lookup.keys=4", "--task-option", "gap=64", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert seen[0].task == "lookup" and seen[0].task_options == {"keys": 4, "gap": 64}


def test_train_refuses_a_prefix_that_names_another_task_in_one_line(monkeypatch, tmp_path):
    seen = _configs(monkeypatch)
    res = runner.invoke(app, ["train", "lookup", "--task-option", "text.length=2048", "--out", str(tmp_path)])
    assert res.exit_code == 2 and not seen
    assert res.stderr.strip().splitlines() == [
        "error: --task-option text.length=2048: 'text' is not the task trained ('lookup'); give length=2048 (or lookup.length=2048)"]
