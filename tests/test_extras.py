"""The lean install: the core imports and runs without the optional families, and each family,
when its package is missing, names the extra that installs it."""

import subprocess
import sys

import numpy as np
import pytest
import torch

from attnlab import positional, tasks
from attnlab.audio import features
from attnlab.extras import EXTRAS, MissingExtraError, require

OPTIONAL = ["librosa", "soundfile", "networkx", "rdkit", "sklearn", "torchdiffeq"]


def test_require_imports_or_names_the_extra():
    assert require("math", "graphs", "x").sqrt(4.0) == 2.0
    with pytest.raises(MissingExtraError,
                       match=r"the graph tasks needs attnlab_nothing, which is not installed: pip install 'attnlab\[graphs\]'"):
        require("attnlab_nothing", "graphs", "the graph tasks")
    with pytest.raises(ValueError, match="unknown extra 'video'; expected one of audio, graphs, molecules, digits, ode"):
        require("math", "video", "x")


@pytest.mark.parametrize("blocked,extra,call", [
    ("networkx", "graphs", lambda: tasks.create("karate")),
    ("rdkit", "molecules", lambda: tasks.create("molecules", limit=10)),
    ("sklearn", "digits", lambda: tasks.create("digits")),
    ("librosa", "audio", lambda: features(np.zeros(1600, dtype=np.float32))),
    ("torchdiffeq", "ode", lambda: positional.create("floater", dim=8)(torch.zeros(1, 4, 8))),
])
def test_each_family_names_its_extra_when_its_package_is_missing(monkeypatch, blocked, extra, call):
    for name in [m for m in sys.modules if m == blocked or m.startswith(blocked + ".")]:
        monkeypatch.setitem(sys.modules, name, None)  # None in sys.modules: the import fails as if not installed
    monkeypatch.setitem(sys.modules, blocked, None)
    with pytest.raises(MissingExtraError, match=rf"pip install 'attnlab\[{extra}\]'"):
        call()


@pytest.mark.slow
def test_the_core_and_the_command_line_run_without_any_optional_package():
    """In a fresh interpreter where the optional packages cannot be imported: attention, a text
    task and a model run; `attnlab train molecules` ends in one line naming the extra."""
    block = f"import sys; [sys.modules.__setitem__(m, None) for m in {OPTIONAL!r}];"
    core = block + (" import torch, attnlab; from attnlab import tasks;"
                    " q = torch.randn(1, 2, 5, 8); out = attnlab.attend(q, q, q, mask=attnlab.masks.causal()).output;"
                    " t = tasks.create('text'); print(tuple(out.shape), t.name)")
    res = subprocess.run([sys.executable, "-c", core], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["(1,", "2,", "5,", "8)", "text"]
    cli = block + " from attnlab.cli import main; sys.argv = ['attnlab', 'train', 'molecules', '--steps', '1']; main()"
    res = subprocess.run([sys.executable, "-c", cli], capture_output=True, text=True, timeout=300)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr  # a missing package: run time
    assert ("the molecules task (RDKit's bundled NCI molecules) needs rdkit, which is not installed: pip install 'attnlab[molecules]'"
            in " ".join(res.stderr.split()))


def test_the_extras_are_the_ones_pyproject_declares():
    import tomllib
    from pathlib import Path

    declared = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    opt = declared["optional-dependencies"]
    for extra, dists in EXTRAS.items():
        assert [d.split(">")[0] for d in opt[extra]] == list(dists)
    assert opt["all"] == [f"attnlab[{','.join(EXTRAS)}]"]
    assert not {d.split(">")[0] for ds in EXTRAS.values() for d in ds} & {d.split(">")[0] for d in declared["dependencies"]}
