"""What a board shows: the last grid's runs (grid.json), the others counted; a damaged grid.json is one clear error."""

import json

import pytest

from attnlab.arena.cost import measures
from attnlab.arena.scope import GRID_FILE, grid_cost, grid_ids, scoped


def _row(run_id, task="pos"):
    return {"run_id": run_id, "task": task, "config": {"task_options": {}}, "data_sha256": None, "finished_at": 1.0}


def test_the_board_shows_the_last_grid_and_counts_the_rest(tmp_path):
    rows = [_row("a"), _row("b"), _row("c", "recall")]
    assert grid_ids(tmp_path) is None and grid_cost(tmp_path) is False
    assert scoped(rows, tmp_path) == (rows, None)  # a folder from before grid.json: every run
    (tmp_path / GRID_FILE).write_text(json.dumps({"run_ids": ["a"], "cost": None}))
    shown, note = scoped(rows, tmp_path)
    assert shown == rows[:1] and note == ("2 stored runs not on this board: 2 of other settings (pos 1, recall 1), which the arena "
                                          "command that planned them shows again")
    assert grid_cost(tmp_path) is None


@pytest.mark.parametrize("text", ["{", '{"ids": []}', '{"run_ids": 3}'])
def test_a_damaged_grid_file_is_one_clear_error(tmp_path, text):
    (tmp_path / GRID_FILE).write_text(text)
    with pytest.raises(ValueError, match="grid.json is unreadable .*run the arena again to rewrite it"):
        grid_ids(tmp_path)


def test_measurements_without_a_key_measure_nothing_a_grid_asks_for():
    cost = {"task": "lookup", "task_options": {}, "train": {}}
    assert not measures({}, cost) and not measures({"key": ""}, cost)
