"""``attnlab arena --executor ray``: a grid on a real two-node Ray cluster (two ``ray start`` on this
machine) gives the serial grid's runs and scores, and a run whose worker is SIGKILLed is retried by
Ray and resumes from its checkpoint; ``--address`` needs ``--executor ray``, and a missing ray names
the ``cluster`` extra.

The cluster: ``ray start --head --block`` and ``ray start --address ... --block`` in child processes,
with a temp dir of their own and Ray's token authentication off (``RAY_AUTH_MODE=disabled``: the
mode this process reads when it imports ray, whatever the order of the tests). Each is ended by its
own pid (SIGTERM: ``--block`` then stops the processes it started), never with ``ray stop``, which
would stop every Ray instance of this user on the machine.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from attnlab.arena import Preset, TaskSetting, plan, run_grid
from attnlab.cli import app
from attnlab.extras import MissingExtraError
from attnlab.training import load_checkpoint
from tests.cli.helpers import runner

TINY = Preset({"pos": TaskSetting({"size": 200}, {"steps": 40, "eval_every": 20, "embed_dim": 32, "num_layers": 1})},
              ("dense", "linear"))
LONG = Preset({"pos": TaskSetting({"size": 200}, {"steps": 120, "eval_every": 10, "embed_dim": 32, "num_layers": 1,
                                                  "patience": 10**6})}, ("dense",))
"""One run long enough (a few seconds) to be killed between its first checkpoint and its end."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(log: Path, proc: subprocess.Popen, text: str = "Ray runtime started", timeout: float = 90) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if text in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    raise RuntimeError(f"ray start did not come up: {log.read_text(errors='replace')[-2000:]}")


@pytest.fixture(scope="module")
def cluster():
    """The address of a two-node Ray cluster of one CPU per node, started here and stopped at the end."""
    pytest.importorskip("ray")
    temp = Path(tempfile.mkdtemp(prefix="attnlab-ray-"))  # short: Ray's socket paths must stay under 107 bytes
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": "1"}
    cli = Path(sys.executable).with_name("ray")
    port = _free_port()
    procs: list[subprocess.Popen] = []
    try:
        for i, args in enumerate([["--head", "--port", str(port), "--temp-dir", str(temp / "t"), "--include-dashboard", "false"],
                                  ["--address", f"127.0.0.1:{port}"]]):
            log = temp / f"node{i}.log"
            with log.open("w") as f:
                procs.append(subprocess.Popen([str(cli), "start", *args, "--num-cpus", "1", "--disable-usage-stats", "--block"],
                                              env=env, stdout=f, stderr=subprocess.STDOUT))
        for i, proc in enumerate(procs):  # started together: the second node waits for the head's GCS by itself
            _wait_for(temp / f"node{i}.log", proc)
        yield f"127.0.0.1:{port}"
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.slow
def test_a_grid_on_a_two_node_cluster_gives_the_serial_runs_and_scores(tmp_path, cluster):
    import ray

    specs = plan(TINY)
    serial = run_grid(specs, tmp_path / "serial")
    events = []
    store = run_grid(specs, tmp_path / "ray", executor="ray", address=cluster,
                     on_event=lambda kind, spec, **info: events.append((kind, spec.variant)))
    assert not ray.is_initialized()  # the driver disconnected from the cluster it joined (and left it running)
    rows, expected = store.rows(), serial.rows()
    assert sorted(r["run_id"] for r in rows) == sorted(r["run_id"] for r in expected) == sorted(s.run_id for s in specs)
    assert all(r["status"] == "done" for r in rows)
    # step-budgeted: the same scores and steps, whichever node trained the run
    assert {r["run_id"]: (r["value"], r["steps"]) for r in rows} == {r["run_id"]: (r["value"], r["steps"]) for r in expected}
    assert sorted(events) == [("end", "dense"), ("end", "linear"), ("start", "dense"), ("start", "linear")]
    for s in specs:
        pid, host = (tmp_path / "ray" / "runs" / s.run_id / "worker.pid").read_text().split()
        assert int(pid) != os.getpid() and host == socket.gethostname()
    events.clear()
    run_grid(specs, tmp_path / "ray", executor="ray", address=cluster, on_event=lambda kind, spec, **i: events.append(kind))
    assert events == ["skip", "skip"] and len(store.rows()) == 2


@pytest.mark.slow
def test_a_sigkilled_worker_is_retried_and_resumes_from_its_checkpoint(tmp_path, cluster):
    (spec,) = plan(LONG)
    folder = tmp_path / "runs" / spec.run_id
    config, pid_file = folder / "checkpoint" / "config.json", folder / "worker.pid"
    killed: dict = {}

    def kill_after_the_first_checkpoint():
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                step = json.loads(config.read_text())["step"]
                pid = int(pid_file.read_text().split()[0])
            except (OSError, ValueError, KeyError):  # not written yet, or being replaced
                time.sleep(0.05)
                continue
            os.kill(pid, signal.SIGKILL)
            killed.update(pid=pid, step=step)
            return

    killer = threading.Thread(target=kill_after_the_first_checkpoint)
    killer.start()
    try:
        store = run_grid([spec], tmp_path, executor="ray", address=cluster)
    finally:
        killer.join()
    total = LONG.tasks["pos"].train["steps"]
    assert 0 < killed["step"] < total, killed
    (row,) = store.rows()  # stored once, by the driver
    assert row["status"] == "done" and row["steps"] == total
    assert int(pid_file.read_text().split()[0]) != killed["pid"]  # Ray ran the task again, in another process
    meta = load_checkpoint(folder).meta
    resumed_at = meta["resumes"]
    assert len(resumed_at) == 1 and killed["step"] <= resumed_at[0] < total  # from the checkpoint, not from step 0
    steps = [h["step"] for h in row["history"]]
    assert steps == sorted(set(steps)) and steps[-1] == total  # each validation once: nothing before the checkpoint redone
    assert not list(folder.glob("checkpoint.tmp-*"))


def test_address_needs_the_ray_executor(tmp_path):
    res = runner.invoke(app, ["arena", "--address", "127.0.0.1:6379", "--out", str(tmp_path)])
    assert res.exit_code == 2 and "--address is a Ray cluster's: it needs --executor ray" in " ".join(res.output.split())
    res = runner.invoke(app, ["arena", "--executor", "slurm", "--out", str(tmp_path)])
    assert res.exit_code == 2 and "'slurm' is not one of 'local', 'ray'" in res.output
    with pytest.raises(ValueError, match="needs executor='ray'"):
        run_grid(plan(TINY), tmp_path, address="127.0.0.1:6379")
    res = runner.invoke(app, ["arena", "--executor", "ray", "--address", "127.0.0.1:6379", "--workers", "2", "--out", str(tmp_path)])
    assert res.exit_code == 2 and "with --address the cluster's own CPUs decide" in " ".join(res.output.split())
    with pytest.raises(ValueError, match="cluster's own CPUs decide"):
        run_grid(plan(TINY), tmp_path, executor="ray", address="127.0.0.1:6379", workers=2)
    from attnlab.arena.executors import run_on_ray

    pytest.importorskip("ray")
    with pytest.raises(ValueError, match="threads must be at least 1, got 0"):
        run_on_ray(plan(TINY), tmp_path, None, lambda *a, **k: None, lambda args: {}, threads=0)


def test_a_missing_ray_names_the_cluster_extra(tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m == "ray" or m.startswith("ray.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "ray", None)  # None in sys.modules: the import fails as if not installed
    with pytest.raises(MissingExtraError, match=r"--executor ray needs ray, which is not installed: pip install 'attnlab\[cluster\]'"):
        run_grid(plan(TINY), tmp_path / "grid", executor="ray")
    res = runner.invoke(app, ["arena", "--executor", "ray", "--out", str(tmp_path / "cli")])
    assert res.exit_code == 1 and "pip install 'attnlab[cluster]'" in " ".join(res.output.split()) and "Traceback" not in res.output


def test_a_run_whose_retries_are_spent_is_a_failed_row_the_store_takes(tmp_path):
    from attnlab.arena.executors import _lost
    from attnlab.arena.store import Store

    spec = plan(TINY)[0]
    store = Store(tmp_path / "results.sqlite")
    assert store.add(_lost(spec, RuntimeError("The worker died\nunexpectedly")))
    (row,) = store.rows()
    assert row["run_id"] == spec.run_id and row["status"] == "failed" and row["error"] == "RuntimeError: The worker died unexpectedly"
