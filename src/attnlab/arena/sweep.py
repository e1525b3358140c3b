"""The arena's sweeps: run every (task, variant, seed) at each point of a grid of training
settings (``attnlab arena --sweep lr=3e-4,1e-3,3e-3``), pick each cell's point on the
validation split and report the test score there, with the sweep's spread.

A comparison at one learning rate measures the learning rate as much as the attention (Zoology,
Arora et al. 2023, sweeps it per sequence mixer; arXiv 2508.19029 shows state-space models' recall
hinges on a narrow window of it): a sweep gives every variant its own best setting, chosen on
data the test score never sees.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import statistics

__all__ = ["NOT_SWEPT", "best_val", "choose", "parse_sweep", "points"]

NOT_SWEPT = ("task", "attention", "seed", "task_options", "model_options", "attention_options", "positional_options")
""":class:`attnlab.training.TrainConfig` fields a sweep cannot vary: the grid's own axes (task,
variant, seed) and the option dicts (give a task option with the task, an attention option
through the variant)."""


def parse_sweep(items: list[str]) -> dict[str, list]:
    """``["lr=3e-4,1e-3", "batch_size=8,16"]`` -> ``{"lr": [0.0003, 0.001], "batch_size": [8, 16]}``:
    each a :class:`attnlab.training.TrainConfig` field and its values (JSON numbers, booleans, or
    words); several fields make a product. Raises ``ValueError`` for a malformed item, an unknown
    or unsweepable field, a repeated field or value, or a value of the wrong kind."""
    from ..training import TrainConfig

    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    out: dict[str, list] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        name = name.strip()
        if not sep or not name or not raw.strip():
            raise ValueError(f"--sweep takes FIELD=V1,V2,..., got {item!r}")
        if name not in fields:
            raise ValueError(f"--sweep {name}: not a training setting; choose from "
                             f"{', '.join(n for n in fields if n not in NOT_SWEPT)}")
        if name in NOT_SWEPT:
            raise ValueError(f"--sweep {name}: {name} is an axis of the grid or an option dict, not a setting to sweep")
        if name in out:
            raise ValueError(f"--sweep {name} given twice; list every value in one --sweep {name}=V1,V2")
        values = [_value(name, v.strip()) for v in raw.split(",")]
        if len(set(map(json.dumps, values))) != len(values):
            raise ValueError(f"--sweep {name}: a value is repeated in {raw!r}")
        out[name] = values
    return out


def _value(name: str, raw: str):
    from ..training import TrainConfig

    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    default = getattr(TrainConfig(task="pos"), name)
    if isinstance(default, bool) and not isinstance(value, bool):
        raise ValueError(f"--sweep {name}: {raw!r} is not true or false")
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or (isinstance(default, int) and not float(value).is_integer())):
            raise ValueError(f"--sweep {name}: {raw!r} is not a {type(default).__name__}")
        value = type(default)(value)
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"--sweep {name}: {raw!r} must be a finite number >= 0")
    return value


def points(sweep: dict[str, list] | None) -> list[dict]:
    """The product of a sweep's values, as one dict of settings per point (``[{}]``: no sweep)."""
    if not sweep:
        return [{}]
    names = list(sweep)
    return [dict(zip(names, combo)) for combo in itertools.product(*(sweep[n] for n in names))]


def best_val(row: dict) -> float | None:
    """A finished run's best validation score (the weights its test score was measured with)."""
    vals = [h["val"] for h in row.get("history") or [] if h.get("val") is not None and math.isfinite(h["val"])]
    return max(vals) if vals else None


def choose(rows: list[dict]) -> tuple[str, list[dict], list[dict]]:
    """Pick a cell's sweep point on validation.

    ``rows``: the finished runs of one cell (one task, variant and setting), each with its
    ``sweep`` point (``{}`` without a sweep). Returns ``(key, chosen rows, points)``: the chosen
    point's key (JSON of its settings), its runs (one per seed), and every point as
    ``{"point", "val", "value", "seeds"}`` (means over seeds: validation, test) in sweep order.
    The chosen point has the highest mean validation score; a point whose runs have no
    validation history cannot be chosen unless no point has one."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(json.dumps(r.get("sweep") or {}, sort_keys=True), []).append(r)
    table = []
    for key, rs in groups.items():
        vals = [v for v in map(best_val, rs) if v is not None]
        table.append({"point": json.loads(key), "val": statistics.fmean(vals) if vals else None,
                      "value": statistics.fmean(r["value"] for r in rs), "seeds": len(rs), "key": key})
    ranked = sorted(table, key=lambda p: (p["val"] is None, -(p["val"] if p["val"] is not None else 0.0)))
    key = ranked[0]["key"]
    for p in table:
        p.pop("key")
    return key, groups[key], table
