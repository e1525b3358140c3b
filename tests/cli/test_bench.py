"""attnlab bench attention: records, charts; --device on every measuring command."""

import json

import pytest
import torch

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


# every measuring command that takes --device, with the least it needs besides (each refuses a missing device first)
DEVICE_COMMANDS = [
    ["bench", "attention", "--sizes", "16"], ["bench", "positional", "--steps", "1"], ["bench", "scaling", "--sizes", "64"],
    ["bench", "peak"], ["bench", "precision", "--sizes", "64"], ["bench", "masks", "--sizes", "256"],
    ["bench", "approximation", "--n", "64"], ["bench", "distance", "--steps", "1"], ["bench", "recall", "--steps", "1"],
    ["bench", "graph", "--nodes", "8", "--edges", "16"], ["bench", "audio", "--seconds", "0.5"], ["bench", "pretrained"],
    ["bench", "decode", "--contexts", "8"], ["bench", "packing", "--counts", "1"], ["bench", "ring", "--lengths", "64"],
    ["complexity", "--sizes", "64"], ["compare", "vit-cnn", "--steps", "1"],
]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
@pytest.mark.parametrize("command", DEVICE_COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_a_missing_cuda_device_is_one_line_before_any_work(command):
    res = runner.invoke(app, [*command, "--device", "cuda"])
    assert res.exit_code == 2, res.output
    assert res.stderr.count("\n") == 1 and "no CUDA device" in res.stderr and "--device cpu" in res.stderr


def test_bench_ring_refuses_a_gpu_and_takes_auto_for_the_cpu(monkeypatch):
    """On a machine with a GPU, ``bench ring --device cuda`` says why it cannot run there (its
    processes talk over gloo on the CPU), before any process; ``auto`` runs on the CPU."""
    import attnlab.devices
    from attnlab.studies import ring

    monkeypatch.setattr(attnlab.devices, "resolve", lambda device="auto": torch.device("cpu" if device == "cpu" else "cuda"))
    ran = []
    monkeypatch.setattr(ring, "run", lambda *a, **kw: ran.append(kw))
    res = runner.invoke(app, ["bench", "ring", "--lengths", "64", "--processes", "1", "--device", "cuda"])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and not ran
    assert "--device cuda: bench ring spawns its processes on the CPU" in res.stderr and "use --device cpu" in res.stderr
    for device in ("auto", "cpu"):
        res = runner.invoke(app, ["bench", "ring", "--lengths", "64", "--processes", "1", "--device", device, "--json"])
        assert res.exit_code == 0, res.output
    assert len(ran) == 2


def test_bench_scaling_refuses_peers_off_the_cpu(monkeypatch):
    import attnlab.devices
    from attnlab.studies import scaling

    monkeypatch.setattr(attnlab.devices, "resolve", lambda device="auto": torch.device("cuda"))
    monkeypatch.setattr(scaling, "run", lambda *a, **kw: pytest.fail("measured although --peers cannot run there"))
    res = runner.invoke(app, ["bench", "scaling", "--sizes", "64", "--peers", "--device", "cuda"])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1
    assert "--peers: lucidrains' implementations are compared on the CPU only" in res.stderr


def test_bench_approximation_on_the_cpu_by_name_gives_the_defaults_records():
    args = ["bench", "approximation", "--n", "64", "--variants", "local,performer", "--seeds", "1", "--json"]
    default, named = (runner.invoke(app, args + extra) for extra in ([], ["--device", "cpu"]))
    assert default.exit_code == 0 and named.exit_code == 0, default.output + named.output
    records = json.loads(default.stdout)
    assert len(records) == 4 and records == json.loads(named.stdout)  # no timings here: every field is deterministic
