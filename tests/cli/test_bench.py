"""attnlab bench attention: records, charts."""

import json

import pytest

from attnlab.cli import app
from tests.cli.helpers import run_ok, runner


@pytest.mark.slow
def test_bench_attention_json_records():
    res = runner.invoke(app, ["bench", "attention", "--sizes", "16,24", "--configs", "scaled_dot+softmax,scaled_dot+relu",
                              "--modes", "fwd_bwd", "--repeats", "1", "--json"])
    assert res.exit_code == 0, res.output
    records = json.loads(res.stdout)  # stdout holds the JSON and nothing else (the progress lines are on stderr)
    assert {r["impl"] for r in records} == {"attend", "sdpa", "naive", "attend_chunked"}
    assert len(records) == (4 + 2) * 2
    for r in records:
        assert set(r) >= {"impl", "path", "n", "mode", "seconds", "peak_bytes"}
        assert r["mode"] == "fwd_bwd" and r["n"] in (16, 24) and r["seconds"] > 0
    backend = {(r["path"], r["impl"]): r["backend"] for r in records}
    assert backend[("scaled_dot+softmax", "attend")] == "sdpa"
    assert backend[("scaled_dot+relu", "attend")] == "chunked"


@pytest.mark.slow
def test_bench_attention_draws_a_chart(tmp_path):
    png = tmp_path / "charts" / "bench.png"
    out = tmp_path / "records.json"
    run_ok("bench", "attention", "--sizes", "16,32", "--configs", "scaled_dot+relu", "--modes", "fwd", "--repeats", "1",
           "-o", str(out), "--plot", str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert len(json.loads(out.read_text())) == 4  # the records file was written too
