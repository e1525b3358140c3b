"""attnlab bench ring: memory per process falls with the process count, and under a memory cap a
length one process cannot hold runs on four."""

import json

import pytest

from attnlab.cli import app
from tests.cli.helpers import runner


@pytest.mark.slow
def test_bench_ring_under_a_cap_runs_on_four_processes_what_one_cannot_hold(tmp_path):
    rec_file, png = tmp_path / "ring.json", tmp_path / "ring.png"
    res = runner.invoke(app, ["bench", "ring", "--lengths", "1024,4096", "--processes", "1,4", "--memory-cap", "32", "--repeats", "1",
                              "-o", str(rec_file), "--plot", str(png)])
    assert res.exit_code == 0, res.output
    recs = {(r["processes"], r["length"]): r for r in json.loads(rec_file.read_text())["records"]}
    assert {k: r["status"] for k, r in recs.items()} == {(1, 1024): "ok", (4, 1024): "ok", (1, 4096): "out of memory", (4, 4096): "ok"}
    assert recs[(4, 1024)]["peak_bytes"] < 0.5 * recs[(1, 1024)]["peak_bytes"]  # about 1/P of the activations per process
    assert recs[(4, 4096)]["peak_bytes"] < 32 * 2**20 and recs[(4, 4096)]["sent_bytes"] > 0
    assert recs[(1, 1024)]["comm_share"] == 0.0 and 0 < recs[(4, 1024)]["comm_share"] < 1
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    again = runner.invoke(app, ["bench", "ring", "--from", str(rec_file)])
    assert again.exit_code == 0 and "out of memory" in again.output and "capped at 32 MiB" in again.output


def test_bench_ring_refuses_bad_input(tmp_path):
    res = runner.invoke(app, ["bench", "ring", "--embed-dim", "30", "--num-heads", "4"])
    assert res.exit_code != 0 and "--embed-dim 30 must be divisible by --num-heads 4" in res.output
    res = runner.invoke(app, ["bench", "ring", "--lengths", "0"])
    assert res.exit_code != 0 and "--lengths" in res.output
    bad = tmp_path / "bad.json"
    bad.write_text('{"records": [{"length": 4}]}')
    res = runner.invoke(app, ["bench", "ring", "--from", str(bad)])
    assert res.exit_code != 0 and "not a records file written by 'attnlab bench ring -o'" in " ".join(res.output.split())
