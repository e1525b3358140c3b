"""Which stored runs an arena's board shows: those of the last grid run in the folder (its run
ids, kept in ``grid.json`` by :func:`attnlab.arena.run_grid`), never merged with runs of other
settings that the same store holds, and never a superseded version of the user's file beside the
current one. The runs left out are counted in one line of the board's notes.

A folder written before ``grid.json`` existed shows every stored run, less the superseded
versions of a file.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

__all__ = ["GRID_FILE", "grid_cost", "grid_ids", "scoped"]

GRID_FILE = "grid.json"


def _grid(out: str | Path) -> dict | None:
    path = Path(out) / GRID_FILE
    if not path.exists():
        return None
    try:
        grid = json.loads(path.read_text())
        return {"run_ids": set(grid["run_ids"]), "cost": grid.get("cost", False)}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path} is unreadable ({e}); run the arena again to rewrite it") from None


def grid_ids(out: str | Path) -> set[str] | None:
    """The run ids of the last grid run in ``out`` (None: a folder from before ``grid.json``)."""
    grid = _grid(out)
    return None if grid is None else grid["run_ids"]


def grid_cost(out: str | Path) -> dict | None | bool:
    """The cost measurement the last grid in ``out`` asked for (:attr:`attnlab.arena.Plan.cost`; None:
    none), or False where no grid says (a folder from before ``grid.json``: whatever was measured)."""
    grid = _grid(out)
    return False if grid is None else grid["cost"]


def _superseded(rows: list[dict]) -> dict[str, str]:
    """Per run id, the file of a run that read an earlier version of the user's file than the one on
    disk now (or, where the file is gone, than the newest version a run read)."""
    from ..tasks import data_digest, data_files

    groups: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("data_sha256"):
            try:
                files = data_files(r["task"], r["config"].get("task_options") or {})
            except ValueError:
                continue
            if files:  # one file however its path was spelt (mine.jsonl, ./mine.jsonl, its absolute path)
                groups.setdefault(json.dumps([r["task"], sorted(str(Path(f).resolve()) for f in files.values())]),
                                  []).append(r)
    out = {}
    for key, rs in groups.items():
        task, files = json.loads(key)
        try:
            current = data_digest(task, rs[-1]["config"].get("task_options") or {})
        except ValueError:  # the file is gone: the newest version a run read is the current one
            current = None
        current = current or max(rs, key=lambda r: r["finished_at"] or 0)["data_sha256"]
        names = ", ".join(Path(f).name for f in files)
        out.update({r["run_id"]: names for r in rs if r["data_sha256"] != current})
    return out


def scoped(rows: list[dict], out: str | Path) -> tuple[list[dict], str | None]:
    """``(shown, note)``: the stored ``rows`` the board of ``out`` shows (the last grid's, less any
    run of a superseded version of the user's file) and one line counting the others (None: none)."""
    ids = grid_ids(out)
    old = _superseded(rows)
    shown = [r for r in rows if (ids is None or r["run_id"] in ids) and r["run_id"] not in old]
    parts = []
    other = Counter(r["task"] for r in rows if ids is not None and r["run_id"] not in ids and r["run_id"] not in old)
    if other:
        parts.append(f"{sum(other.values())} of other settings ({', '.join(f'{t} {n}' for t, n in other.items())}), "
                     "which the arena command that planned them shows again")
    for name, n in Counter(old.values()).items():
        parts.append(f"{n} on an earlier version of {name} (superseded by the file on disk now; never "
                     "averaged with it)")
    if not parts:
        return shown, None
    total = sum(other.values()) + len(old)
    return shown, f"{total} stored run{'s' if total != 1 else ''} not on this board: {'; '.join(parts)}"
