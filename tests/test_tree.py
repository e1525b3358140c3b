"""The tree holds what a project holds (issue 60): no arena results store committed anywhere, and
every script of benchmarks/ listed in benchmarks/README.md with what it measures.

tests/data holds no results store: the tests that read an old-format store write one themselves
(tests/arena/test_store.py), so no folder is exempt from :func:`stores`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parents[1]

STORE_SUFFIXES = (".sqlite", ".sqlite3", ".db", ".db-journal", ".db-wal")
"""Database files: an arena store is ``results.sqlite``; none belongs in the tree."""
ARENA_FILES = {"results.sqlite", "notes.json", "grid.json", "cost.json", "report.html"}
"""The files an arena run leaves in its ``--out`` folder: two of them side by side are a run's output."""


def stores(paths: list[str]) -> list[str]:
    """The paths of ``paths`` (relative, ``/``-separated) that are a results store, or an arena's
    output beside one (two files of :data:`ARENA_FILES` in one folder)."""
    found = [p for p in paths if p.endswith(STORE_SUFFIXES)]
    folders: dict[PurePosixPath, list[str]] = {}
    for p in paths:
        path = PurePosixPath(p)
        if path.name in ARENA_FILES:
            folders.setdefault(path.parent, []).append(p)
    found += [p for names in folders.values() if len(names) > 1 for p in names]
    return sorted(set(found))


def _tree() -> list[str]:
    """The files git holds or would add: tracked, and untracked but not ignored (``x/`` left by a run
    shows here before it is committed; ``arena/`` of ``make demo`` is ignored)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    res = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    return [p for p in res.stdout.splitlines() if (ROOT / p).exists()]  # a file deleted but not yet staged is gone


def test_no_results_store_is_in_the_tree():
    tree = _tree()
    assert len(tree) > 100
    assert not stores(tree), f"a results store (or an arena's output) in the tree; remove it: {stores(tree)}"


@pytest.mark.parametrize(("paths", "expected"), [
    (["x/results.sqlite", "x/notes.json", "src/attnlab/arena/store.py"], ["x/notes.json", "x/results.sqlite"]),
    (["runs/a/cache.db", "tests/data/old/results.sqlite"], ["runs/a/cache.db", "tests/data/old/results.sqlite"]),
    (["out/grid.json", "out/report.html"], ["out/grid.json", "out/report.html"]),
    (["docs/notes.json", "benchmarks/results/arena-repro-2026-11-26-cpu2.json", "tests/data/layers-v1/dense.json"], []),
])
def test_the_store_finder(paths, expected):
    assert stores(paths) == expected


def _listed() -> list[str]:
    """The scripts benchmarks/README.md lists: lines ``- `name.py`: ...``."""
    return re.findall(r"^- `([\w-]+\.py)`: \S", (ROOT / "benchmarks" / "README.md").read_text(), flags=re.M)


def test_every_benchmark_script_is_listed_in_the_benchmarks_readme():
    listed = _listed()
    scripts = sorted(p.name for p in (ROOT / "benchmarks").glob("*.py"))
    assert len(listed) == len(set(listed)), "a script listed twice"
    missing = sorted(set(scripts) - set(listed))
    assert not missing, f"not in benchmarks/README.md: {missing}"
    gone = sorted(set(listed) - set(scripts))
    assert not gone, f"listed in benchmarks/README.md but gone: {gone}"


def test_every_listed_script_names_where_it_is_quoted():
    """Each line links the guide (or the README) that quotes what the script measures, and that page exists."""
    text = (ROOT / "benchmarks" / "README.md").read_text()
    for item in re.findall(r"^- `[\w-]+\.py`: .*(?:\n  .*)*", text, flags=re.M):  # an item and its indented lines
        links = re.findall(r"\]\((\.\./[^)]+\.md)\)", item)
        assert links, f"no guide named: {item}"
        assert all((ROOT / "benchmarks" / link).resolve().is_file() for link in links), item
