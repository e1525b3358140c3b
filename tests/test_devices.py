"""``--device`` and ``device=``: resolved here, refused in one line where this machine lacks the
device, and ``cpu`` the same run, bit for bit, as before the option existed."""

import dataclasses
import json

import pytest
import torch
from typer.testing import CliRunner

from attnlab import devices
from attnlab.cli import app
from attnlab.training import TrainConfig, config_differences, load_checkpoint, train

TINY = dict(task_options={"size": 96}, steps=4, eval_every=2, embed_dim=16, num_layers=1, num_heads=2, warmup=1, batch_size=16)


def test_auto_is_the_cpu_here_and_every_spelling_resolves_or_is_refused():
    assert not torch.cuda.is_available()  # this suite runs on machines without a GPU
    assert devices.resolve("auto") == devices.resolve(None) == devices.resolve("cpu") == torch.device("cpu")
    no_gpu = r"device 'cuda': this machine has no CUDA device \(torch .* (built without CUDA|but no GPU is visible)\)"
    with pytest.raises(devices.DeviceError, match=no_gpu):
        devices.resolve("cuda")
    with pytest.raises(devices.DeviceError, match="no CUDA device"):
        devices.resolve("cuda:1")
    with pytest.raises(devices.DeviceError, match="no MPS device"):
        devices.resolve("mps")
    with pytest.raises(devices.DeviceError, match=r"unknown device 'tpu'; expected auto\|cpu\|cuda\[:i\]\|mps"):
        devices.resolve("tpu")
    with pytest.raises(devices.DeviceError, match="attnlab runs on"):
        devices.resolve("meta")
    assert devices.peak_memory("cpu") is None and "cuda_rng" not in devices.rng_state("cpu")
    assert devices.in_words("cpu") == devices.in_words(torch.device("cpu")) == "cpu"


@pytest.mark.parametrize("argv", [
    ["train", "pos", "--steps", "2", "--device", "cuda"],
    ["eval", "RUN", "--device", "cuda"],
    ["predict", "RUN", "in.jsonl", "--device", "cuda:0"],
    ["generate", "RUN", "hello", "--device", "cuda"],
    ["arena", "--tasks", "pos", "--variants", "dense", "--device", "cuda"],
    ["backends", "--device", "cuda"],
])
def test_a_device_this_machine_lacks_is_one_line_and_nothing_written(argv, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = [a if a != "RUN" else str(tmp_path / "run") for a in argv]
    r = CliRunner().invoke(app, [*argv, *(["--out", str(tmp_path / "out")] if argv[0] in ("train", "arena") else [])])
    assert r.exit_code == 2, r.output
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1 and "this machine has no CUDA device" in lines[0], r.output
    assert not (tmp_path / "out").exists()


def test_device_cpu_is_the_run_of_before_bit_for_bit(tmp_path):
    a = train(TrainConfig.for_task("pos", **TINY), tmp_path / "auto")
    b = train(TrainConfig.for_task("pos", device="cpu", **TINY), tmp_path / "cpu")
    assert a.value == b.value and a.device == b.device == "cpu"
    for name in ("model.safetensors", "best.safetensors"):
        assert (tmp_path / "auto" / "checkpoint" / name).read_bytes() == (tmp_path / "cpu" / "checkpoint" / name).read_bytes()
    meta = json.loads((tmp_path / "cpu" / "checkpoint" / "config.json").read_text())
    assert meta["device"] == "cpu" and meta["train"]["device"] == "cpu"


def test_a_run_resumes_on_another_device_setting_and_old_configs_load(tmp_path):
    cfg = TrainConfig.for_task("pos", device="cpu", **TINY)
    train(cfg, tmp_path)
    resumed = train(dataclasses.replace(cfg, device="auto", steps=6), tmp_path, resume=True)  # where it runs may change
    assert resumed.steps == 6
    assert config_differences(cfg, dataclasses.replace(cfg, device="cuda")) == []
    old = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "device"}  # a config.json written before the field
    assert TrainConfig.from_dict(old).device == "auto"
    with pytest.raises(ValueError, match="device must be a string"):
        TrainConfig.for_task("pos", device=0)
    ck = load_checkpoint(tmp_path, device="cpu", with_state=True)
    assert next(ck.model.parameters()).device.type == "cpu" and ck.state["rng"].dtype == torch.uint8


def test_the_arena_keeps_its_cpu_run_ids_and_a_gpu_run_is_another_run():
    from attnlab.arena import plan
    from attnlab.arena.board import setting_of

    before = plan("quick", tasks=["pos"], variants=["dense"])
    cpu = plan("quick", tasks=["pos"], variants=["dense"], device="cpu")
    cuda = plan("quick", tasks=["pos"], variants=["dense"], device="cuda")
    assert [s.run_id for s in before] == [s.run_id for s in cpu] and cpu[0].config.device == "cpu"
    assert not {s.run_id for s in cpu} & {s.run_id for s in cuda}
    row = {"config": dataclasses.asdict(cpu[0].config), "seed": 0}
    old = {"config": {k: v for k, v in row["config"].items() if k != "device"}, "seed": 0}  # stored before the field
    assert setting_of(row) == setting_of(old) != setting_of({"config": dataclasses.asdict(cuda[0].config), "seed": 0})


def test_backends_lists_every_variant_with_its_reason():
    from attnlab import efficient

    r = CliRunner().invoke(app, ["backends", "--json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert got["device"] == "cpu" and [v["variant"] for v in got["variants"]] == efficient.names()
    by = {v["variant"]: v for v in got["variants"]}
    assert by["dense"]["backend"] == "torch sdpa"
    assert by["local"]["backend"] == "attnlab" and "cuda only" in by["local"]["why"]  # FlexAttention serves on CUDA
    assert by["gated_deltanet"]["backend"] == "attnlab" and "fla." in by["gated_deltanet"]["why"]
