"""``attnlab backends``: which backend computes each variant on this machine's device, and why."""

from __future__ import annotations

import typer

from .common import out, print_json
from .errors import device_or_fail
from .options import choices, device_option, json_option, plain
from .tables import table

__all__ = ["DType", "backends"]

_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
DType = choices("DType", _DTYPES, "``backends --dtype``: the inputs' dtype, fp32, bf16 or fp16.")


def backends(
    device: str = device_option(),
    dtype: DType = typer.Option(DType.fp32, "--dtype", help="The dtype of the inputs the kernels are checked in."),
    as_json: bool = json_option(
        "Print one JSON object: {device, dtype, variants: [{variant, backend, why, inference}]}."),
) -> None:
    """Which backend computes each variant here (a fast kernel once it matched attnlab's own form on this device),
    and why."""
    import torch

    from ..devices import describe
    from ..efficient.serving import serving_table

    dtype = plain(dtype)
    where = device_or_fail(device)
    rows = serving_table(where, getattr(torch, _DTYPES[dtype]))
    if as_json:
        print_json({"device": str(where), "device_name": describe(where), "dtype": dtype,
                    "variants": [{"variant": r.variant, "backend": r.backend, "why": r.why, "inference": r.inference}
                                 for r in rows]})
        return
    columns = ["variant", "backend", "why"]
    t = table(f"backends on {where} ({describe(where)}), inputs in {dtype}", columns, left=columns)
    for r in rows:
        t.add_row(r.variant, r.backend + (f" ({r.inference} without gradients)" if r.inference else ""), r.why)
    out.print(t)
