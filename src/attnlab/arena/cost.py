"""What each variant costs where efficient attention pays: one training step (forward and
backward, batch 1) of a task's own model at 1K, 4K and 16K tokens, its seconds and peak tensor
bytes, beside the fused dense (PyTorch's ``scaled_dot_product_attention``, memory linear in N)
and the dense that materialises the N x N weights (``dense_naive``: LRA's memory baseline).

At 1K a fused dense kernel is hard to beat; the lecture's (and LRA's) claim that efficient
attention is faster and smaller lives at 4K and beyond. :func:`measure_cost` measures it on this
machine (the seconds are this machine's; the bytes are the same on any machine), on the device
the arena's runs trained on (:func:`grid_device`): on a CUDA device each step is timed between
synchronisations, its peak read from the device's allocator, and the lengths reach 64K
(:data:`CUDA_COST_LENGTHS`); and
:func:`attnlab.arena.charts.plot_cost` draws the lecture's chart from it: score against speed at the longest length,
bubble area = peak memory relative to the fused dense, the materialising dense beside them.

Results are kept in ``<out>/cost.json`` (:func:`cost_table`): a rerun measures only what is missing.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from ..devices import in_words
from .presets import COST_LENGTHS, NO_ATTENTION, VARIANT_OPTIONS

__all__ = ["COST_FILE", "CUDA_COST_LENGTHS", "MODEL_FIELDS", "REFERENCE", "cost_summary", "cost_table", "cpu_name",
           "grid_device", "measure_cost", "measure_one", "measures", "ratios"]

REFERENCE = "dense_naive"
"""The materialising dense, measured beside the variants: its scores are dense's (the same function)."""

COST_FILE = "cost.json"

MODEL_FIELDS = ("embed_dim", "num_heads", "num_layers", "positional", "causal")
"""The training settings that shape the measured model (the rest, steps or learning rate, do not)."""

CUDA_COST_LENGTHS = (*COST_LENGTHS, 65536)
"""The lengths measured on a CUDA device where a plan asks for :data:`attnlab.arena.presets.COST_LENGTHS`:
a GPU steps through 64K tokens sooner than a CPU through 16K."""


def cpu_name() -> str:
    """This machine's processor as ``/proc/cpuinfo`` names it, with the kernel path PyTorch takes
    (``torch.backends.cpu.get_cpu_capability()``: ``AVX512``, ``AVX2``, ...)."""
    import platform

    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    except OSError:
        pass
    return f"{name}, {torch.backends.cpu.get_cpu_capability()}"


def measure_one(task: str, variant: str, length: int, *, task_options: dict | None = None, train: dict | None = None,
                repeats: int = 1, device: str | torch.device = "cpu") -> dict:
    """One variant's training step at ``length`` tokens on ``task``'s own model (batch 1, fp32) on
    ``device``: ``{"variant", "length", "seconds"`` (the fastest of ``repeats`` timed steps after
    one warm-up, each between synchronisations on a GPU), ``"peak_bytes"``
    (:func:`attnlab.profiling.peak_bytes`: the allocator's peak on CUDA), ``"params"}``. On a GPU a
    step that runs out of its memory is a row without seconds or bytes, ``"note": "out of memory"``."""
    from .. import objectives
    from .. import tasks as task_registry
    from ..devices import synchronize
    from ..models import build_model
    from ..objectives import collate
    from ..profiling import peak_bytes
    from ..training import TrainConfig, model_config

    opts = {**(task_options or {}), "length": length, "size": 8}
    data = task_registry.create(task, **opts)
    attention = "dense" if variant == NO_ATTENTION else variant
    extra = VARIANT_OPTIONS.get(variant, {}) if variant != NO_ATTENTION else {}
    cfg = TrainConfig.for_task(task, attention=attention, task_options=opts,
                               **({"attention_options": dict(extra)} if extra else {}),
                               **{k: v for k, v in (train or {}).items() if k in MODEL_FIELDS})
    if variant == NO_ATTENTION:
        cfg = cfg.baseline()
    device = torch.device(device)
    torch.manual_seed(0)
    model = build_model(model_config(cfg, data)).to(device)  # drawn on the CPU: the same weights on every device
    objective = objectives.get(data)
    inputs, labels = collate(data, data.split("train"), torch.arange(1), objective, device=device)
    model.train()
    params = sum(p.numel() for p in model.parameters())

    def step():
        model.zero_grad(set_to_none=True)
        objective.loss(model, inputs, labels).backward()

    def timed() -> float:
        synchronize(device)
        t = time.perf_counter()
        step()
        synchronize(device)
        return time.perf_counter() - t

    try:
        step()  # warm-up: lazy buffers and kernels' first calls stay out of both measurements
        best = min(timed() for _ in range(max(1, repeats)))
        peak = peak_bytes(step, device)
    except torch.cuda.OutOfMemoryError:
        if device.type != "cuda":
            raise
        del model, inputs, labels
        torch.cuda.empty_cache()
        return {"variant": variant, "length": length, "seconds": None, "peak_bytes": None, "params": params,
                "note": "out of memory"}
    return {"variant": variant, "length": length, "seconds": best, "peak_bytes": peak, "params": params}


def _key(task: str, task_options: dict | None, train: dict | None, device: str | torch.device = "cpu") -> str:
    """What the kept measurements are valid for: the task, its model, and this machine's CPU and threads (the seconds
    are theirs), or the GPU the steps ran on."""
    model = {k: v for k, v in (train or {}).items() if k in MODEL_FIELDS}
    device = torch.device(device)
    where = [cpu_name(), torch.get_num_threads()] if device.type == "cpu" else [in_words(device)]
    return json.dumps([task, task_options or {}, model, *where], sort_keys=True)




def grid_device(out: str | Path) -> str:
    """The kind of device the last grid in ``out`` trained its runs on (their
    :attr:`attnlab.training.TrainConfig.device`, as :func:`attnlab.arena.plan` set it): ``"cpu"``
    where no stored run says otherwise, or where the runs disagree."""
    from .scope import grid_ids
    from .store import Store

    path = Path(out) / "results.sqlite"
    if not path.exists():
        return "cpu"
    ids = grid_ids(out)
    kinds = {(r.get("config") or {}).get("device") or "cpu" for r in Store(path).rows()
             if ids is None or r["run_id"] in ids}
    return kinds.pop() if len(kinds) == 1 else "cpu"


def measures(table: dict, cost: dict) -> bool:
    """Whether the kept ``table`` (:func:`cost_table`) measured the model a plan's ``cost`` asks for
    (:attr:`attnlab.arena.Plan.cost`: the same task, options and model; on any CPU)."""
    if not table.get("key"):
        return False
    return json.loads(table["key"])[:3] == json.loads(_key(cost["task"], cost.get("task_options"),
                                                           cost.get("train")))[:3]


def cost_table(out: str | Path) -> dict:
    """The measurements kept in ``out/cost.json``: ``{"task", "key", "threads", "cpu", "rows": [...]}``, a row
    ``{"variant", "length", "seconds", "peak_bytes", "params"}`` (``"projected": True`` for a projection, see
    :func:`measure_cost`); ``{}`` when none were made."""
    path = Path(out) / COST_FILE
    if not path.exists():
        return {}
    return json.loads(path.read_text())


def measure_cost(out: str | Path, task: str, variants: Iterable[str], *, lengths: Iterable[int] = COST_LENGTHS,
                 task_options: dict | None = None, train: dict | None = None, reference: str | None = REFERENCE,
                 reference_up_to: int = 4096, on_progress: Callable[[str, int], None] | None = None,
                 device: str | torch.device | None = None) -> dict:
    """Measure (:func:`measure_one`) each of ``variants`` and ``reference`` at each of ``lengths``
    on ``task``'s model, keep the results in ``out/cost.json`` (rows already there for the same
    task, options, model and machine are kept, not measured again) and return the table (:func:`cost_table`).

    ``device``: where to measure (default: ``train["device"]`` where given, else the device of the
    grid's runs in ``out``, :func:`grid_device`). On a CUDA device the default lengths
    (:data:`~attnlab.arena.presets.COST_LENGTHS`) become :data:`CUDA_COST_LENGTHS`, and the table
    names the GPU (``"device"``).

    The materialising reference is measured up to ``reference_up_to`` tokens (at 16K its N x N
    tensors alone are gigabytes, and one step takes tens of seconds); beyond, its row is
    **projected** (``"projected": True``, no seconds): peak bytes ``b N + c N^2`` fitted through its
    two longest measured lengths (its N x N weights, scores, softmax and their gradients are all
    N^2, the rest linear in N)."""
    from .. import efficient
    from ..devices import resolve
    from ..validate import positive_int

    device = resolve(device if device is not None else (train or {}).get("device") or grid_device(out))
    if device.type == "cuda" and tuple(lengths) == COST_LENGTHS:
        lengths = CUDA_COST_LENGTHS
    lengths, variants = [positive_int("length", n) for n in lengths], list(variants)
    positive_int("reference_up_to", reference_up_to)
    if not lengths:
        raise ValueError("measure_cost needs at least one length")
    for v in [*variants, *([reference] if reference else [])]:
        if v != NO_ATTENTION and v not in efficient.VARIANTS:
            raise ValueError(f"unknown variant {v!r}; choose from {', '.join(efficient.names())} (or "
                             f"{NO_ATTENTION!r}: no attention)")
    out = Path(out)
    key = _key(task, task_options, train, device)
    table = cost_table(out)
    if table.get("key") != key:  # another task, model, CPU or thread count, or another device: measured again
        table = {"task": task, "key": key, "rows": []}
    table.update(threads=torch.get_num_threads(), cpu=cpu_name(),
                 **({} if device.type == "cpu" else {"device": in_words(device)}))
    table["rows"] = [r for r in table["rows"] if not r.get("projected")]
    have = {(r["variant"], r["length"]) for r in table["rows"]}
    names = list(dict.fromkeys([*variants, *([reference] if reference else [])]))
    for length in sorted(lengths):
        for v in names:
            if (v, length) in have:
                continue
            if v == reference and length > reference_up_to:  # projected, not run: tens of seconds and gigabytes a step
                projected = _projected(table["rows"], v, length)
                if projected is not None:
                    table["rows"].append(projected)
                continue
            if on_progress:
                on_progress(v, length)
            table["rows"].append(measure_one(task, v, length, task_options=task_options, train=train,
                                             repeats=2 if length <= 4096 else 1, device=device))
            _write(out, table)
    _write(out, table)
    return table


def _projected(rows: list[dict], variant: str, length: int) -> dict | None:
    """``variant``'s peak bytes at ``length``, projected as ``b N + c N^2`` through its two longest
    measured lengths (None with fewer than two)."""
    got = sorted((r for r in rows if r["variant"] == variant and r.get("peak_bytes") and not r.get("projected")),
                 key=lambda r: r["length"])
    if len(got) < 2:
        return None
    (n1, p1), (n2, p2) = ((r["length"], r["peak_bytes"]) for r in got[-2:])
    c = (p2 / n2 - p1 / n1) / (n2 - n1)
    b = p1 / n1 - c * n1
    return {"variant": variant, "length": length, "seconds": None, "peak_bytes": int(b * length + c * length**2),
            "params": got[-1]["params"],
            "projected": True, "from": [n1, n2]}


def _write(out: Path, table: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / (COST_FILE + ".tmp")
    tmp.write_text(json.dumps(table, indent=1))
    os.replace(tmp, out / COST_FILE)


def ratios(table: dict, length: int) -> dict[str, dict]:
    """Per variant at ``length``: ``speed`` (dense's seconds over its own: above 1 is faster),
    ``memory`` (its peak bytes over the fused dense's) and ``memory_vs_naive`` (over the
    materialising dense's, when measured); None where dense (or the reference) is missing."""
    rows = {r["variant"]: r for r in table.get("rows", []) if r["length"] == length}
    dense, naive = rows.get("dense"), rows.get(REFERENCE)
    out = {}
    for v, r in rows.items():
        out[v] = {"seconds": r["seconds"], "peak_bytes": r["peak_bytes"],
                  "speed": dense["seconds"] / r["seconds"] if dense and r["seconds"] else None,
                  "memory": (r["peak_bytes"] / dense["peak_bytes"]
                             if dense and dense["peak_bytes"] and r["peak_bytes"] else None),
                  "memory_vs_naive": (r["peak_bytes"] / naive["peak_bytes"]
                                      if naive and naive["peak_bytes"] and r["peak_bytes"] else None)}
    return out


def cost_summary(table: dict) -> dict | None:
    """The cost table as the leaderboard carries it (``board["cost"]``): ``{"task", "lengths", "cpu",
    "threads", "variants": {variant: {str(length): ratios + "projected"}}}`` (:func:`ratios`; and
    ``"device"``, the GPU, where the steps ran on one); None when empty."""
    rows = table.get("rows") or []
    if not rows:
        return None
    lengths = sorted({r["length"] for r in rows})
    variants: dict[str, dict] = {}
    for n in lengths:
        for v, r in ratios(table, n).items():
            projected = any(x.get("projected") for x in rows if x["variant"] == v and x["length"] == n)
            variants.setdefault(v, {})[str(n)] = {**r, "projected": projected}
    where = {"device": table["device"]} if table.get("device") else {}
    return {"task": table.get("task"), "lengths": lengths, "cpu": table.get("cpu"), "threads": table.get("threads"),
            **where, "variants": variants}
