"""An arena grid's runs as Ray tasks: ``attnlab arena --executor ray [--address ADDR]``.

Each run of the grid is one Ray task asking for the CPUs it trains with (one thread by default),
so a grid spreads over every node of a cluster. Ray is the optional extra ``cluster``
(``pip install 'attnlab[cluster]'``); this module imports it only when called, so
``import attnlab`` never does.

- **One writer.** A task trains (or resumes) its run with :func:`attnlab.arena.runner.run_one`
  and *returns* the row; only the driver (the process that called
  :func:`attnlab.arena.run_grid`) writes it to ``results.sqlite`` and emits the ``end`` event,
  as with the process pool of ``--workers N``.
- **Lost workers.** A task whose worker process dies (SIGKILLed, out of memory, its node lost)
  is run again by Ray, up to :data:`RAY_RETRIES` times (``max_retries``; ``retry_exceptions``
  off: an error inside a run is already a ``failed`` row, not a reason to retry), and resumes
  from the run's checkpoint, ``out/runs/<run id>/checkpoint``, losing at most one
  ``eval_every`` interval. A run whose retries are spent is stored as ``failed`` with Ray's reason.
- **Shared folder.** The checkpoints and the attention maps are written by the workers, the store
  by the driver, all under ``--out``: on a cluster of several machines ``--out`` must be a folder
  every node sees at the same path (a shared filesystem such as NFS), and every node needs attnlab
  installed, at the same version, in the Python its ``ray start`` ran with.
- **Token authentication.** Ray (2.60) turns token authentication on for a head started where a
  token exists (``~/.ray/auth_token``, which any earlier ``ray.init()`` there writes); a node or a
  driver joining it by address then needs ``RAY_AUTH_MODE=token`` and that token (the file copied,
  or ``RAY_AUTH_TOKEN``): Ray does not turn it on by itself for an explicit address.
- **Which process runs a run.** A task starts by writing ``<pid> <hostname>`` to
  ``out/runs/<run id>/worker.pid`` (a retry overwrites it), so a run can be followed to its node
  and process (and a test can kill that process).

Without an address, a Ray instance is started on this machine (``ray.init(num_cpus=...)``) and
shut down when the grid ends; with one (``host:port`` of a ``ray start --head``, or ``auto``), the
driver connects to that cluster and disconnects at the end, leaving the cluster running.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from ..extras import MissingExtraError
from .store import Store

__all__ = ["RAY_RETRIES", "require_ray", "run_on_ray"]

RAY_RETRIES = 3
"""How many times Ray runs a task again after its worker process died (Ray's ``max_retries``)."""


def require_ray() -> ModuleType:
    """Import ``ray``, or raise :class:`attnlab.extras.MissingExtraError` naming the ``cluster`` extra."""
    try:
        import ray
    except ImportError as e:
        raise MissingExtraError("--executor ray needs ray, which is not installed: pip install "
                                "'attnlab[cluster]'") from e
    return ray


def _ray_task(work: Callable[[tuple], dict], spec: Any, out: str, budget: float | None, threads: int) -> dict:
    """The body of one Ray task: note which process runs it, then train (or resume) the run with ``work``."""
    folder = Path(out) / "runs" / spec.run_id
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "worker.pid").write_text(f"{os.getpid()} {socket.gethostname()}\n")
    return work((spec, out, budget, threads))


def _lost(spec: Any, error: Exception) -> dict:
    """The failed row of a run whose task Ray gave up on (its worker died more than :data:`RAY_RETRIES` times)."""
    reason = " ".join(str(error).split())[:500]
    return {"run_id": spec.run_id, "task": spec.task, "variant": spec.variant, "seed": spec.seed,
            "config": dataclasses.asdict(spec.config), "sweep": getattr(spec, "sweep", {}),
            "data_sha256": getattr(spec, "data_sha256", None), "level": getattr(spec, "level", {}), "status": "failed",
            "error": f"{type(error).__name__}: {reason}",
            "finished_at": time.time()}


def run_on_ray(
    specs: list,
    out: Path,
    store: Store,
    emit: Callable[..., None],
    work: Callable[[tuple], dict],
    *,
    budget_seconds: float | None = None,
    address: str | None = None,
    num_cpus: int | None = None,
    threads: int = 1,
    max_retries: int = RAY_RETRIES,
    gpus_per_run: float = 1.0,
) -> None:
    """Run ``specs`` as Ray tasks; store each returned row and emit ``start`` / ``end`` here, in the driver.

    Args:
        specs: the runs (:class:`attnlab.arena.RunSpec`) to train.
        out: the grid's folder (on a multi-node cluster, one every node sees at this path).
        store: where the rows go (written by this process only).
        emit: ``(kind, spec, **info)``, as for :func:`attnlab.arena.run_grid`.
        work: trains one run in a worker: ``work((spec, out, budget_seconds, threads))`` returns its row
            (the runner's ``_worker``, passed in: this module does not import the runner, which imports it).
        address: a running cluster's address (``host:port``, ``auto``); None starts a local Ray instance.
        num_cpus: the local instance's CPUs (default: this machine's cores); ignored with ``address``.
        threads: torch threads of each run, and the CPUs its task asks for.
        max_retries: Ray's retries of a task whose worker died.
        gpus_per_run: the GPUs a run on CUDA asks Ray for (1: one run per GPU; 0.25: four share one).
    """
    ray = require_ray()
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    if not specs:  # every run already stored: no cluster to start or join
        return
    started = not ray.is_initialized()  # a caller's own session is used as it is, and left open
    if started:
        # the workers' output stays in Ray's logs, off the live grid
        common = {"log_to_driver": False, "logging_level": "WARNING"}
        if address:
            try:
                ray.init(address=address, **common)
            except ConnectionError as e:
                raise ConnectionError(f"{e} (is 'ray start --head' running there? A cluster with Ray's token "
                                      "authentication also needs RAY_AUTH_MODE=token and its token here)") from e
        else:
            ray.init(num_cpus=num_cpus or os.cpu_count() or 1, include_dashboard=False, **common)
    try:
        remote = ray.remote(_ray_task)
        pending = {}
        for spec in specs:
            # Ray places it on a GPU
            gpus = gpus_per_run if str(getattr(spec.config, "device", "cpu")).startswith("cuda") else 0
            task = remote.options(num_cpus=threads, num_gpus=gpus, max_retries=max_retries, retry_exceptions=False)
            pending[task.remote(work, spec, str(out), budget_seconds, threads)] = spec
            emit("start", spec)
        while pending:
            (ref,), _ = ray.wait(list(pending), num_returns=1)
            spec = pending.pop(ref)
            try:
                row = ray.get(ref)
            except ray.exceptions.RayError as e:  # retries spent (or the task could not be scheduled at all)
                row = _lost(spec, e)
            store.add(row)
            emit("end", spec, row=row)
    finally:
        if started:
            ray.shutdown()
