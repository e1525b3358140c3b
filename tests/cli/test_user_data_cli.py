"""A new user with their own data on the command line (the user-data issue's smaller findings), one
test each: the arena's Ctrl-C, one spelling for the file, the options explained, progress from
the start, no empty folder, a complete synopsis."""

import json
import re
from pathlib import Path

import pytest

import attnlab.arena.runner
from attnlab.cli import app
from tests.cli.helpers import interrupt_training, runner


@pytest.fixture
def tiny_arena(monkeypatch):
    """The default preset, shrunk: pos on 200 sentences, 30 steps, a checkpoint every 10."""
    from attnlab.arena import PRESETS, Preset, TaskSetting

    monkeypatch.setitem(PRESETS, "quick", Preset({"pos": TaskSetting({"size": 200}, {"steps": 30, "eval_every": 10, "embed_dim": 16,
                                                                                      "num_layers": 1, "num_heads": 2})}))


@pytest.mark.parametrize("at", [5, 15])
def test_ctrl_c_in_the_arena_says_where_it_stopped_and_leaves_no_empty_folder(tmp_path, monkeypatch, tiny_arena, at):
    args = ["arena", "--tasks", "pos", "--variants", "dense", "--out", str(tmp_path / "a")]
    interrupt_training(monkeypatch, attnlab.arena.runner, at)
    res = runner.invoke(app, args)
    assert res.exit_code == 130
    line = res.stderr.splitlines()[-1]
    assert line.startswith(f"interrupted: 0 of 1 runs stored in {tmp_path / 'a' / 'results.sqlite'}; pos / dense / seed 0 stopped at "
                           f"step {at} (")
    assert line.endswith("; continue with: the same attnlab arena command")
    runs = tmp_path / "a" / "runs"
    if at < 10:  # before the first checkpoint: nothing saved, and no empty run folder left
        assert "nothing saved yet, so the rerun starts it over" in line and not any(runs.iterdir())
        return
    folder = next(runs.iterdir())
    assert f"its checkpoint of step 10 in {folder / 'checkpoint'}, which the rerun resumes" in line
    monkeypatch.setattr(attnlab.arena.runner, "train", attnlab.training.train)
    again = runner.invoke(app, [*args, "--json"])  # the same command continues, and ends
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout.splitlines()[-1])["tasks"]["pos"][0]["value"] is not None


def test_the_users_file_is_given_as_data_to_train_as_to_the_arena(tmp_path):
    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps({"text": f"word {i % 3} here", "label": i % 3}) + "\n" for i in range(30)))
    tiny = ["--steps", "2", "--embed-dim", "16", "--num-layers", "1", "--num-heads", "2", "--no-baseline", "--json"]
    res = runner.invoke(app, ["train", "jsonl", "--data", str(data), *tiny, "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    from attnlab.training import load_checkpoint

    assert load_checkpoint(tmp_path / "r").config.task_options == {"path": str(data)}  # the same run as --task-option path=
    res = runner.invoke(app, ["train", "jsonl", str(data), "--out", str(tmp_path / "s")])
    assert res.exit_code == 2 and f"give your data as --data {data}" in " ".join(res.stderr.split())
    res = runner.invoke(app, ["train", "pos", "--data", str(data)])
    assert res.exit_code == 2 and "reads no file of yours" in res.stderr
    res = runner.invoke(app, ["train", "jsonl", "--data", str(data), "--task-option", f"path={data}"])
    assert res.exit_code == 2 and "give it once" in res.stderr


def test_a_failed_train_leaves_no_empty_output_folder(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine", "label": 1}\n{oops\n')
    res = runner.invoke(app, ["train", "jsonl", "--data", str(bad), "--out", str(tmp_path / "deep" / "run")])
    assert res.exit_code == 1 and "line 2: not valid JSON" in res.stderr  # a damaged data file: run time
    assert not (tmp_path / "deep").exists()


def test_a_log_shows_the_run_from_its_start(tmp_path, monkeypatch):
    """A log (stderr not a terminal) says so while a run builds its task for long (here: longer than 0 s), then at its first step."""
    from attnlab.cli import training_bar

    monkeypatch.setattr(training_bar, "BUILDING_NOTICE_SECONDS", 0.0)
    res = runner.invoke(app, ["train", "pos", "--size", "64", "--steps", "4", "--eval-every", "4", "--embed-dim", "16", "--num-layers",
                              "1", "--num-heads", "2", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    lines = res.stderr.splitlines()
    assert lines[0] == "pos transformer: building the task and the model"
    assert lines[1].startswith("pos transformer: step 1/4 loss ") and lines[1].endswith(": training (a line at each validation)")


def test_every_task_option_is_explained_by_list_tasks():
    from attnlab import tasks
    from attnlab.cli.listing import option_rows

    for name in tasks.names():
        rows = option_rows("tasks", name)
        assert rows and all(r["help"] for r in rows.values()), (name, [o for o, r in rows.items() if not r["help"]])
    res = runner.invoke(app, ["list", "tasks", "lookup", "--json"])
    lookup = json.loads(res.stdout)
    assert lookup["keys"]["default"] == 16 and "each sequence" in lookup["keys"]["help"]
    assert lookup["num_keys"]["default"] == 32 and "vocabulary" in lookup["num_keys"]["help"]
    guide = Path(__file__).parents[2] / "docs" / "guides" / "arena.md"
    example = re.search(r"`attnlab train lookup (--task-option [^`]+)`", guide.read_text()).group(1)
    options = dict(o.split("=") for o in example.replace("--task-option ", "").split())
    assert tasks.create("lookup", size=64, **{k: int(v) for k, v in options.items()}).max_len == int(options["length"])  # it builds


def test_the_command_line_guide_lists_every_option_of_every_command():
    from typer.main import get_command

    guide = (Path(__file__).parents[2] / "docs" / "guides" / "command-line.md").read_text()
    synopses = [line.strip() for line in guide.splitlines() if line.startswith(("    attnlab ", "    torchrun "))]

    def commands(group, path):
        for name, sub in getattr(group, "commands", {}).items():
            yield from commands(sub, [*path, name]) if hasattr(sub, "commands") else [([*path, name], sub)]

    missing = {}
    for path, cmd in commands(get_command(app), []):
        mine = [s for s in synopses if re.search(rf"attnlab {' '.join(path)}(?![\w-])", s)]
        assert mine, f"no synopsis of attnlab {' '.join(path)}"
        for p in cmd.params:
            forms = [o for o in (*p.opts, *getattr(p, "secondary_opts", [])) if o.startswith("-")]
            shown = any(re.search(re.escape(f) + r"(?![\w-])", s) for f in forms for s in mine)
            if forms and not p.hidden and p.name != "help" and not shown:
                missing.setdefault(" ".join(path), []).append(forms[0])
    assert not missing, missing


def test_ctrl_c_with_runs_in_parallel_names_no_single_run(tmp_path, tiny_arena):
    """With --workers or Ray the runner reports every queued run as started: the line names none of them."""
    from attnlab.arena import plan
    from attnlab.cli.arena import _interrupted

    specs = plan("quick", tasks=["pos"], variants=["dense", "linear"])
    line = _interrupted(str(tmp_path), specs, {"serial": False, "interrupted": True})
    assert line.startswith(f"interrupted: 0 of 2 runs stored in {tmp_path / 'results.sqlite'}; the runs in progress resume from their "
                           "checkpoints") and "pos / dense" not in line
