"""A device check anyone can run (``attnlab bench device``): what this device computes, how close it is to the float64
reference, how fast, and whether the arena scores as on the CPU. Four sections, one results dict:

* ``environment``: torch, CUDA, the device in words (:func:`attnlab.devices.describe`), and on CUDA the versions of
  Triton and fla where they import.
* ``parity``: every registered variant as a small layer (E=64, 4 heads, the arena's options,
  :data:`attnlab.arena.presets.VARIANT_OPTIONS`) run in float64 on the CPU as the reference, then with the same weights
  on the device in float32, and in float32 under bfloat16 autocast; B=2, N=128, bidirectional and, where the variant has
  one, causal. A row holds the largest difference of the output and of the input's gradient (against a random cotangent)
  over the reference's largest magnitude, and the backend serving the variant in that dtype
  (:func:`attnlab.efficient.serving.serving`). Off the CPU the CPU's differences stand beside them
  (``cpu_output_error``, ``cpu_grad_error``): a bfloat16 error as large there (reformer: a query rounded to bfloat16 can
  hash to another bucket) is not the device's fault.
* ``speed``: forward + backward of each variant's layer at each length, float32 and bf16 autocast, beside
  :func:`torch.nn.functional.scaled_dot_product_attention` alone (:mod:`attnlab.studies.device_speed`).
* ``arena``: the default arena's ``lookup`` task (:func:`attnlab.arena.plan`, preset ``quick``) trained on the device
  into a temporary folder, each variant's score beside the CPU's stored in ``benchmarks/results/arena-repro-*.json``.
  The runs are budgeted in steps, so the scores are comparable across devices, but not bitwise equal: another device
  sums in another order."""

from __future__ import annotations

import copy
import json
import platform
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from .. import efficient
from ..devices import describe, resolve, synchronize
from .device_common import PRECISIONS, Say, first_line, free, out_of_memory, quiet
from .device_speed import CELL_SECONDS, CPU_LENGTHS, CUDA_LENGTHS, SPEED_SECONDS, speed, speed_shape

__all__ = ["TOLERANCE", "TOTAL_SECONDS", "arena_check", "compare_with_cpu", "cpu_reference", "environment", "parity",
           "run"]

TOTAL_SECONDS = 450.0
"""The whole check's deadline: the speed section (the last) ends by then, whatever its own."""

TOLERANCE = {"fp32": 5e-3, "bf16": 6e-2}
"""The difference a parity row stays within (relative to the reference's largest magnitude):
:data:`attnlab.core.kernels.TOLERANCE` of the dtype (float32 allows TF32 products)."""

_PARITY = {"batch": 2, "length": 128, "embed_dim": 64, "num_heads": 4}


def environment(device: torch.device) -> dict:
    """Versions and the device: torch, CUDA, Python, attnlab, and on CUDA its properties and the
    versions of Triton and fla (None where they do not import; imported only on CUDA)."""
    from .. import __version__

    env = {"device": str(device), "device_name": describe(device), "torch": torch.__version__,
           "cuda": torch.version.cuda, "python": platform.python_version(), "platform": platform.platform(),
           "attnlab": __version__, "threads": torch.get_num_threads(),
           "float32_matmul_precision": torch.get_float32_matmul_precision()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(capability=f"sm_{props.major}{props.minor}", memory_bytes=int(props.total_memory),
                   cudnn=torch.backends.cudnn.version())
        for lib in ("triton", "fla"):
            try:
                env[lib] = str(getattr(__import__(lib), "__version__", "unknown"))
            except Exception:  # not installed, or fails to import on this machine: recorded as absent
                env[lib] = None
    return env


def _relative(a: torch.Tensor, ref: torch.Tensor) -> float:
    ref = ref.detach().double().cpu()
    return float((a.detach().double().cpu() - ref).abs().max()) / max(float(ref.abs().max()), 1e-12)


def _parity_options(name: str, causal: bool) -> dict:
    from ..arena.presets import VARIANT_OPTIONS

    opts = dict(VARIANT_OPTIONS.get(name, {}))
    if name == "reformer":
        opts["seed"] = 0  # the same hash rotations in every run
    if efficient.budget(name).max_len:
        opts["max_len"] = _PARITY["length"]
    if causal:
        opts["causal"] = True
    return opts


def _errors(layer, x, cot, ref_out, ref_grad, *, device: torch.device, precision: str) -> tuple[float, float]:
    """Output and input-gradient differences of ``layer`` (a float32 copy) on ``device``."""
    m = copy.deepcopy(layer).float().to(device)
    xd = x.detach().float().to(device).requires_grad_(True)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
        out = m(xd).output
    (out.float() * cot.float().to(device)).sum().backward()
    synchronize(device)
    return _relative(out, ref_out), _relative(xd.grad, ref_grad)


def _parity_rows(name: str, causal: bool, device: torch.device, served: dict) -> list[dict]:
    """The fp32 and bf16 rows of one variant in one form (causal or not)."""
    p = _PARITY
    torch.manual_seed(0)
    ref = efficient.create(name, embed_dim=p["embed_dim"], num_heads=p["num_heads"],
                           **_parity_options(name, causal)).double()
    layer = copy.deepcopy(ref)  # before any call: a layer that counts its calls starts where the reference did
    g = torch.Generator().manual_seed(1)
    x = torch.randn(p["batch"], p["length"], p["embed_dim"], generator=g, dtype=torch.float64, requires_grad=True)
    ref_out = ref(x).output
    cot = torch.randn(ref_out.shape, generator=g, dtype=torch.float64)
    (ref_out * cot).sum().backward()
    rows = []
    for precision in PRECISIONS:
        s = served[precision]
        row = {"variant": name, "causal": causal, "precision": precision, "output_error": None, "grad_error": None,
               "tolerance": TOLERANCE[precision], "within": None, "backend": s.backend, "inference": s.inference,
               "why": s.why, "error": None}
        try:
            row["output_error"], row["grad_error"] = _errors(layer, x, cot, ref_out, x.grad, device=device,
                                                             precision=precision)
            # NaN: not within
            row["within"] = all(e <= TOLERANCE[precision] for e in (row["output_error"], row["grad_error"]))
        except Exception as e:  # the device refused or failed: recorded, the check goes on
            row["error"] = "out of memory" if out_of_memory(e) else first_line(e)
        if row["error"]:
            free(device)
        if device.type != "cpu":
            row["cpu_output_error"], row["cpu_grad_error"] = _errors(layer, x, cot, ref_out, x.grad,
                                                                     device=torch.device("cpu"), precision=precision)
        rows.append(row)
    return rows


def parity(device, variants: Iterable[str] | None = None, say: Say = quiet, *,
           after_each: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """The parity rows (module docstring) of ``variants`` (default: every registered one) on ``device``;
    ``after_each``: given the rows so far after each variant (a check stopped midway keeps them)."""
    from ..efficient.serving import Serving, serving

    def served_by(name: str, precision: str) -> Serving:
        try:
            return serving(name, device, torch.float32 if precision == "fp32" else torch.bfloat16)
        except Exception as e:  # checking a kernel failed outside the check's own guard: recorded, the check goes on
            return Serving(name, "unknown", f"finding the backend raised {first_line(e)}")

    device = resolve(device)
    rows: list[dict] = []
    for name in efficient.names() if variants is None else variants:
        start = time.monotonic()
        served = {p: served_by(name, p) for p in PRECISIONS}
        forms = (False, True) if efficient.capabilities(name).causal is not None else (False,)
        for causal in forms:
            rows.extend(_parity_rows(name, causal, device, served))
        mine = rows[-len(PRECISIONS) * len(forms):]
        worst = {p: max(max(r["output_error"] or 0.0, r["grad_error"] or 0.0) for r in mine if r["precision"] == p)
                 for p in PRECISIONS}
        failed = sum(r["error"] is not None for r in mine)
        say(f"parity {name}: fp32 {worst['fp32']:.1e}, bf16 {worst['bf16']:.1e} ({served['fp32'].backend})"
            + (f", {failed} failed" if failed else "") + f", {time.monotonic() - start:.1f} s")
        if after_each is not None:
            after_each(rows)
    return rows

def cpu_reference(path: str | Path | None = None) -> dict | None:
    """The CPU's stored ``lookup`` scores of the default arena: ``{"file", "scores": {variant:
    {"value", "levels": {level as sorted JSON: value}}}}`` from ``path``, else the newest
    ``benchmarks/results/arena-repro-*.json`` of the working folder or of this source tree; None without one."""
    if path is None:
        here = Path(__file__).resolve().parents[3]
        found = [f for root in (Path.cwd(), here) for f in (root / "benchmarks" / "results").glob("arena-repro-*.json")]
        if not found:
            return None
        path = max(found, key=lambda f: f.name)
    data = json.loads(Path(path).read_text())
    board = next(iter(data["commands"].values()))["leaderboard"]
    scores = {key.split(" / ", 1)[1]: {"value": e["value"], "levels": e.get("levels", {})}
              for key, e in board.items() if key.startswith("lookup / ")}
    return {"file": str(path), "scores": scores}


def compare_with_cpu(entries: list[dict], reference: dict | None) -> list[dict]:
    """Per leaderboard entry of ``lookup`` (:func:`attnlab.arena.leaderboard`): its score here
    (``device``), the CPU's (``cpu``, from :func:`cpu_reference`; None without it) and
    ``device - cpu``, overall and per difficulty level (``levels``)."""
    scores = (reference or {"scores": {}})["scores"]
    variants = []
    for e in entries:
        cpu = scores.get(e["variant"], {})
        levels = []
        for part in e.get("levels") or []:
            theirs = cpu.get("levels", {}).get(json.dumps(part["level"], sort_keys=True))
            levels.append({"level": part["level"], "device": part["value"], "cpu": theirs})
        variants.append({"variant": e["variant"], "device": e["value"], "cpu": cpu.get("value"), "levels": levels,
                         "error": e.get("error")})
    for item in (x for v in variants for x in (v, *v["levels"])):
        item["difference"] = None if item["device"] is None or item["cpu"] is None else item["device"] - item["cpu"]
    return variants


def arena_check(device, *, workers: int | None = None, reference: str | Path | None = None, say: Say = quiet) -> dict:
    """The default arena's ``lookup`` task on ``device`` (module docstring): wall seconds, and per
    variant its score here, the CPU's (:func:`cpu_reference`) and their difference, level by level.
    ``workers``: runs at a time, each in its own process (default: one per torch thread, at most
    four off the CPU: small models leave a GPU idle between launches)."""
    from ..arena import Store, leaderboard, plan, run_grid

    device = resolve(device)
    specs = plan("quick", tasks=["lookup"], device=device.type)
    if workers is None:
        workers = max(1, min(torch.get_num_threads(), len(specs), *(() if device.type == "cpu" else (4,))))
    done = [0]

    def on_event(kind, spec, **info):
        if kind == "end":
            done[0] += 1
            row = info["row"]
            got = f"{row['value']:.3f}" if row["status"] == "done" else "failed"
            say(f"arena [{done[0]}/{len(specs)}] lookup {spec.variant} seed {spec.seed} "
                f"{json.dumps(spec.level)}: {got}")

    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="attnlab-device-check-") as tmp:
        run_grid(specs, tmp, workers=workers, on_event=on_event)
        rows = Store(Path(tmp) / "results.sqlite").rows()
    wall = time.monotonic() - start
    ref = cpu_reference(reference)
    variants = compare_with_cpu(leaderboard(rows)["tasks"].get("lookup", []), ref)
    return {"task": "lookup", "preset": "quick", "runs": len(specs), "failed": sum(r["status"] != "done" for r in rows),
            "wall_seconds": wall, "workers": workers, "reference": None if ref is None else ref["file"],
            "variants": variants, "note": "step-budgeted runs: scores comparable across devices, not bitwise equal "
                                          "(another device sums in another order)"}


def run(device="auto", *, lengths: Iterable[int] | None = None, variants: Iterable[str] | None = None,
        arena: bool = True, speed_section: bool = True, repeats: int = 3, cell_seconds: float = CELL_SECONDS,
        speed_seconds: float = SPEED_SECONDS, total_seconds: float = TOTAL_SECONDS, say: Say = quiet,
        on_update: Callable[[dict], None] | None = None) -> dict:
    """The device check (module docstring) on ``device``: ``{"device", "environment", "settings",
    "parity", "speed", "arena", "wall_seconds"}`` (``speed``, ``arena``: None when not run).

    Args:
        lengths: the speed section's (default :data:`~attnlab.studies.device_speed.CUDA_LENGTHS`, on the CPU
            :data:`~attnlab.studies.device_speed.CPU_LENGTHS`).
        variants: the variants checked (default: every registered one).
        arena / speed_section: run those sections; repeats: timed calls per speed cell, at most.
        cell_seconds, speed_seconds, total_seconds: :data:`~attnlab.studies.device_speed.CELL_SECONDS`,
            :data:`~attnlab.studies.device_speed.SPEED_SECONDS`, :data:`TOTAL_SECONDS`.
        say: a progress line; on_update: the results so far, after each section.
    """
    device = resolve(device)
    start = time.monotonic()
    lengths = sorted(lengths or (CPU_LENGTHS if device.type == "cpu" else CUDA_LENGTHS))
    names = list(efficient.names() if variants is None else variants)
    data: dict = {"device": str(device), "environment": environment(device),
                  "settings": {"lengths": lengths, "variants": names, "parity": dict(_PARITY), "repeats": repeats,
                               "speed_batch": 1, "speed_heads": speed_shape(device)[0],
                               "speed_head_dim": speed_shape(device)[1], "cell_seconds": cell_seconds,
                               "speed_seconds": speed_seconds, "total_seconds": total_seconds},
                  "parity": [], "speed": None, "arena": None, "wall_seconds": None}

    def update() -> None:
        data["wall_seconds"] = time.monotonic() - start
        if on_update is not None:
            on_update(data)

    update()
    say(f"device check on {device} ({data['environment']['device_name']})")
    def progress(rows: list[dict]) -> None:
        data["parity"] = rows
        update()

    data["parity"] = parity(device, names, say, after_each=progress)
    update()
    if arena:
        data["arena"] = arena_check(device, say=say)
        update()
    if speed_section:
        deadline = min(time.monotonic() + speed_seconds, start + total_seconds)
        data["speed"] = speed(device, lengths, names, repeats=repeats, cell_seconds=cell_seconds, deadline=deadline,
                              say=say)
    update()
    return data
