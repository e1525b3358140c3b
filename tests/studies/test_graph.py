"""The graph benchmark measures both layers on the same graph with the same weights."""

import json

import pytest
from typer.testing import CliRunner

from attnlab.cli import app
from attnlab.studies.graph import run

pytest.importorskip("torch_geometric")


def test_run_records_both_layers_and_their_outputs_agree():
    recs, diff = run(300, 2000, in_dim=16, num_heads=2, head_dim=8, min_repeats=1)
    assert [r.layer for r in recs] == ["attnlab", "pyg_transformer_conv"]
    assert diff < 1e-5
    assert all(r.seconds > 0 and r.peak_bytes > 0 and r.edges == 2000 for r in recs)


def test_cli_writes_json_with_the_speedup(tmp_path):
    path = tmp_path / "g.json"
    res = CliRunner().invoke(app, ["bench", "graph", "--nodes", "200", "--edges", "900", "--in-dim", "8", "--num-heads", "2",
                                   "--head-dim", "4", "--repeats", "1", "--no-memory", "-o", str(path)])
    assert res.exit_code == 0, res.output
    data = json.loads(path.read_text())
    assert data["speedup_over_pyg"] == pytest.approx(data["records"][1]["seconds"] / data["records"][0]["seconds"])
    assert "largest output difference" in res.output


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="nodes must be a positive int"):
        run(0, 10, pyg=False)
