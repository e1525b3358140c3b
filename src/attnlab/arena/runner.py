"""The arena's grid: train each planned run (:mod:`attnlab.arena.planning`) resumably, and
store one row per finished run (:class:`attnlab.arena.store.Store`).

Folder layout (``--out DIR``)::

    DIR/results.sqlite        the store
    DIR/runs/<run id>/        each run's checkpoint/ (atomic, resumable) and attention.safetensors
    DIR/report.html, DIR/*.png   written by :func:`attnlab.arena.report.build_report`

A run's id is a hash of its full training config, and of the contents of the user's file it reads
(``--data``: :func:`attnlab.tasks.data_digest`), so the same command plans the same ids:
rerunning skips stored runs and resumes an interrupted one from its checkpoint (losing at most
one ``eval_every`` interval), and a changed file gets new runs.
"""

from __future__ import annotations

import dataclasses
import json
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

from .. import objectives
from ..devices import in_words
from ..objectives import collate
from ..tasks import TASKS, DataChangedError, data_files
from ..training import load_checkpoint, train
from .planning import RunSpec
from .presets import NO_ATTENTION
from .store import Store

__all__ = ["RUN_THREADS", "attention_maps", "run_grid", "run_one", "training_step_peak"]


def training_step_peak(model: torch.nn.Module, task, batch_size: int, precision: str = "fp32") -> int | None:
    """Peak tensor bytes of one training step (forward + backward) on the first training batch,
    at ``precision`` (:mod:`attnlab.training.precision`)."""
    from ..profiling import peak_bytes
    from ..training.precision import autocast

    objective = objectives.get(task)
    data = task.split("train")
    device = next(model.parameters()).device
    inputs, labels = collate(task, data, torch.arange(min(batch_size, len(data))), objective, device=device)
    model.train()

    def step():
        model.zero_grad(set_to_none=True)
        with autocast(precision, device):
            loss = objective.loss(model, inputs, labels)
        loss.backward()

    step()  # warm-up: lazy buffers stay out of the measurement
    return peak_bytes(step, device)


def _first_attention(model: torch.nn.Module):
    from ..layers.mixer import SequenceMixer
    from ..layers.multihead import MultiHeadAttention

    return next((m for m in model.modules() if isinstance(m, (MultiHeadAttention, SequenceMixer))), None)


def _first_record(model, inputs, register):
    """The first thing ``register(record)``'s hook records during one ``model(**inputs)`` in eval mode, or None."""
    seen: list = []
    handle = register(seen.append)
    try:
        model.eval()
        model(**inputs)
    finally:
        handle.remove()
    return seen[0] if seen else None


def _mixer_weights(model, attn, inputs) -> torch.Tensor | None:
    """The weights of a mixer that forms scores (FoX): its call in ``model(**inputs)`` again, with
    ``return_weights``."""
    call = _first_record(model, inputs, lambda record: attn.register_forward_pre_hook(
        lambda m, args, kwargs: record((args, kwargs)), with_kwargs=True))
    if call is None:
        return None
    args, kwargs = call
    return attn(*args, **{**kwargs, "return_weights": True}).weights


@torch.no_grad()
def attention_maps(model: torch.nn.Module, task, count: int = 2) -> list[torch.Tensor]:
    """The first attention layer's map ``(N, M)`` (mean over heads) for the first ``count``
    test examples; for a tagging task scored at a few positions (``lookup``'s reads), only those
    rows ``(R, M)``: at 1K a whole map is a dark square, the scored rows show where the weight goes.
    For every variant this is its *effective* map: its attention applied to
    the identity as values (``out = A V`` with ``V = I`` gives ``A``), so efficient variants,
    which never build the matrix, show the one they compute implicitly. A step that forms its
    scores returns its weights themselves. The gated recurrences have none to show: their
    short convolution and output norm act on the values, so the identity does not pass through
    as ``A I`` (their capabilities: a sequence mixer that forms no scores); a mixer that forms
    them (FoX) gives the weights of its call in the model."""
    attn = _first_attention(model)
    caps = None if attn is None else attn.capabilities
    if caps is None or task.kind == "seq2seq" or (caps.mixer and not caps.forms_scores):
        return []  # a decoder's maps need a decoded target: not drawn here
    data = task.split("test")
    maps = []
    for i in range(min(count, len(data))):
        inputs, labels = collate(task, data, torch.tensor([i]))  # the labels stay on the CPU, where the map is read
        inputs, _ = collate(task, data, torch.tensor([i]), device=next(model.parameters()).device)
        scored = _scored_rows(task, labels)
        if caps.mixer:  # its weights come from the whole layer
            weights = _mixer_weights(model, attn, inputs)
            if weights is not None:
                maps.append(_rows(weights[0].mean(0).float().cpu(), scored))
            continue
        got = _first_record(model, inputs, lambda record: attn.register_step_hook(
            lambda layer, heads_q, heads_k, heads_v, call: record((heads_q, heads_k, call))))
        if got is None:
            continue
        q, k, kw = got
        m, d = k.shape[2], k.shape[3]
        kw = {key: val for key, val in kw.items() if key != "return_weights"}
        if caps.forms_scores:
            weights = attn.step(q, k, torch.zeros_like(k), return_weights=True, **kw).weights
            maps.append(_rows(weights[0].mean(0).float().cpu(), scored))
            continue
        cols = []
        for c in range(0, m, d):  # identity columns in slices of the head width (fused kernels want Dv = D)
            eye = torch.zeros(m, d, dtype=q.dtype, device=q.device)
            w = min(d, m - c)
            eye[c : c + w, :w] = torch.eye(w, dtype=q.dtype, device=q.device)
            # k.shape[1]: G heads when grouped
            out = attn.step(q, k, eye.expand(q.shape[0], k.shape[1], m, d), **kw).output
            cols.append(out[..., :w])
        maps.append(_rows(torch.cat(cols, dim=-1)[0].mean(0).float().cpu(), scored))
    return maps


def _scored_rows(task, labels: torch.Tensor) -> torch.Tensor | None:
    """The query positions a tagging example is scored at, when only some are (``lookup``'s
    reads: 64 of 1,024): the rows of its map worth drawing. None: every row (or not tagging)."""
    from ..tasks.base import IGNORE

    if task.kind != "tagging" or labels.dim() != 2:
        return None
    rows = (labels[0] != IGNORE).nonzero().flatten()
    return rows if 0 < len(rows) < labels.shape[1] else None


def _rows(m: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """The map's scored rows, over the keys up to the last of them (a causal read sees no later key)."""
    if rows is None or m.shape[0] <= int(rows.max()):
        return m
    last = int(rows.max()) + 1
    return m[rows][:, :last] if bool((m[rows][:, last:] == 0).all()) else m[rows]


class _TaskCache:
    """The last task built, by name and options: the runs of one task reuse its data (a
    generator such as pathfinder's takes seconds) instead of building it again."""

    def __init__(self):
        self.key, self.task = None, None

    def get(self, name: str, options: dict):
        from .. import tasks as task_registry

        key = json.dumps([name, options], sort_keys=True)
        if key != self.key:
            self.key, self.task = None, None  # the old data is freed before the new is built
            self.task, self.key = task_registry.create(name, **options), key
        return self.task


def run_one(spec: RunSpec, out: Path, *, budget_seconds: float | None = None,
            on_step: Callable[[int, int, float], None] | None = None,
            on_eval: Callable[[int, float], None] | None = None, tasks: _TaskCache | None = None) -> dict:
    """Train (or resume) one run in ``out/runs/<id>`` and return its store row (status ``done``
    or ``failed``; an error is caught and stored with its message, never raised).

    The run trains on **one thread** (:data:`RUN_THREADS`), whatever this process has: a matrix
    product split over more threads sums in another order, so the same run id would give other
    weights, and after a few hundred steps another score. Parallelism comes from running several
    runs at once (``run_grid(workers=...)``, Ray), which changes no run."""
    before = torch.get_num_threads()
    torch.set_num_threads(RUN_THREADS)
    try:
        return _run_one(spec, out, budget_seconds=budget_seconds, on_step=on_step, on_eval=on_eval, tasks=tasks)
    finally:
        torch.set_num_threads(before)


RUN_THREADS = 1
"""torch threads of every arena run (:func:`run_one`): the same computation on any machine."""


def _run_one(spec: RunSpec, out: Path, *, budget_seconds: float | None, on_step, on_eval,
             tasks: _TaskCache | None) -> dict:
    folder = out / "runs" / spec.run_id
    row = {"run_id": spec.run_id, "task": spec.task, "variant": spec.variant, "seed": spec.seed,
           "config": dataclasses.asdict(spec.config), "sweep": spec.sweep, "data_sha256": spec.data_sha256,
           "level": spec.level}
    try:
        task = (tasks or _TaskCache()).get(spec.config.task, spec.config.task_options)
        if spec.data_sha256 is not None and task.artifacts.get("data_sha256") != spec.data_sha256:
            raise DataChangedError(f"{', '.join(data_files(spec.task, spec.config.task_options).values())} changed "
                                   "after the grid was planned: run the arena again to plan runs of its new contents")
        if spec.variant == NO_ATTENTION and task.kind == "seq2seq":
            raise ValueError("a seq2seq model's decoder attends whatever its encoder: the task has no "
                             "no-attention baseline")
        resume = (folder / "checkpoint" / "config.json").exists()
        # resumed: a task that derives its encoding from the data (user data's tokenizers) is rebuilt from what the
        # run saved
        reuse = not (resume and getattr(TASKS.get(spec.task), "rebuild", None) is not None)
        res = train(spec.config, folder, resume=resume, on_step=on_step, on_eval=on_eval, max_seconds=budget_seconds,
                    task=task if reuse else None)
        ck = load_checkpoint(folder, device=res.device)
        try:
            maps = attention_maps(ck.model, task)
        except Exception:
            maps = []
        if maps:
            from safetensors.torch import save_file

            save_file({f"map_{i}": m.contiguous() for i, m in enumerate(maps)}, str(folder / "attention.safetensors"))
        peak = training_step_peak(ck.model, task, spec.config.batch_size, res.precision)
        row.update(
            status="done", metric=res.metric, value=res.value, train_seconds=res.step_seconds, steps=res.steps,
            steps_per_second=(res.steps_run / res.step_seconds) if res.step_seconds > 0 else None, peak_bytes=peak,
            params=sum(p.numel() for p in ck.model.parameters()), history=res.history, test_size=res.test_size,
            precision=res.precision, flop_rate=res.flop_rate, peak_fraction=res.peak_fraction,
            device=in_words(res.device),
        )
    except Exception as e:
        row.update(status="failed", error=f"{type(e).__name__}: {e}")
        (folder).mkdir(parents=True, exist_ok=True)
        (folder / "error.txt").write_text(traceback.format_exc())
    row["finished_at"] = time.time()
    return row


def _keep_grid(out: Path, specs: list[RunSpec]) -> None:
    """Write the plan's notes to ``out/notes.json`` and its run ids to ``out/grid.json`` for the
    report: the board shows the last grid (:mod:`attnlab.arena.scope`), whose notes hold."""
    from .report import NOTES_FILE
    from .scope import GRID_FILE

    grid = {"run_ids": [s.run_id for s in specs], "cost": getattr(specs, "cost", None)}
    for name, payload in ((NOTES_FILE, list(getattr(specs, "notes", ()))), (GRID_FILE, grid)):
        tmp = out / (name + ".tmp")
        tmp.write_text(json.dumps(payload, indent=1))
        tmp.replace(out / name)


def _worker(args):
    spec, out, budget, threads = args
    torch.set_num_threads(threads)
    return run_one(spec, Path(out), budget_seconds=budget)


def run_grid(
    specs: list[RunSpec],
    out: str | Path,
    *,
    budget_seconds: float | None = None,
    workers: int = 1,
    retry_failed: bool = False,
    on_event: Callable[..., None] | None = None,
    executor: str = "local",
    address: str | None = None,
) -> Store:
    """Run every spec not yet in ``out/results.sqlite``; returns the store.

    Args:
        budget_seconds: cap on each run's training time (it then validates, checkpoints, tests).
        workers: runs at a time, each in its own process (every run trains on one thread); with
            ``executor="ray"`` and no ``address``, more than one caps the local Ray instance at
            that many CPUs (default: every core).
        retry_failed: forget stored failures first, so they run again.
        on_event: ``(kind, spec, **info)`` with kind ``skip``, ``start``, ``step`` (step, total,
            loss), ``eval`` (step, value: the validation score; these two serially only) and
            ``end`` (row).
        executor: ``local`` (this machine: serially, or ``workers`` processes) or ``ray`` (each
            run a Ray task of one thread: :func:`attnlab.arena.executors.run_on_ray`; the
            ``cluster`` extra).
        address: with ``ray``, the cluster to connect to (``host:port``); None starts one here.
    """
    if executor not in ("local", "ray"):
        raise ValueError(f"unknown executor {executor!r}; choose local or ray")
    if address is not None and executor != "ray":
        raise ValueError("an address is a Ray cluster's: it needs executor='ray'")
    if address is not None and workers > 1:
        raise ValueError("workers caps a Ray instance started here; with an address the cluster's own CPUs decide")
    out = Path(out)
    store = Store(out / "results.sqlite")
    # here, before any run: a run's cleanup after a failure never removes it under another
    (out / "runs").mkdir(exist_ok=True)
    _keep_grid(out, specs)
    if retry_failed:
        store.remove_failed()
    done = store.finished()
    todo = []
    for spec in specs:
        if spec.run_id in done:
            if on_event:
                on_event("skip", spec)
        else:
            todo.append(spec)
    emit = on_event or (lambda *a, **k: None)
    if executor == "ray":
        from .executors import run_on_ray

        run_on_ray(todo, out, store, emit, _worker, budget_seconds=budget_seconds, address=address,
                   num_cpus=workers if workers > 1 else None)
        return store
    if workers <= 1:
        cache = _TaskCache()
        for spec in todo:
            emit("start", spec)
            row = run_one(spec, out, budget_seconds=budget_seconds, tasks=cache,
                          on_step=lambda s, t, loss, spec=spec: emit("step", spec, step=s, total=t, loss=loss),
                          on_eval=lambda s, val, spec=spec: emit("eval", spec, step=s, value=val))
            store.add(row)
            emit("end", spec, row=row)
        return store
    import concurrent.futures as cf
    import multiprocessing as mp

    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as pool:
        futures = {pool.submit(_worker, (spec, str(out), budget_seconds, RUN_THREADS)): spec for spec in todo}
        # the pool takes runs in this order: the first `workers` are running, the next starts as one ends
        waiting = list(todo)
        for spec in waiting[:workers]:
            emit("start", spec)
        del waiting[:workers]
        for fut in cf.as_completed(futures):
            spec = futures[fut]
            row = fut.result()
            store.add(row)
            emit("end", spec, row=row)
            if waiting:
                emit("start", waiting.pop(0))
    return store
