"""Hybrid models' linear-attention layers: transformers' own CPU path against attnlab's kernels.

    python benchmarks/hybrid.py -o benchmarks/results/hybrid-2026-11-26-cpu2.json

Side by side in one process, each pair in a fresh round-robin (:func:`attnlab.profiling.round_robin`:
machine noise hits both alike), float32, B = 1, two copies of one randomly initialised model, the
second with :func:`attnlab.integrations.hybrid.use_kernels`:

* **step**: the functions attnlab serves alone, on the layers' shapes below (Gated DeltaNet:
  ``torch_chunk_gated_delta_rule``; KDA: ``chunk_kimi_delta_attention``, up to ``--kda-step-up-to``
  tokens, as transformers' takes minutes a call beyond; SSD: ``mamba2_chunk_scan``), forward +
  backward at each ``--lengths``;
* **layer**: one linear-attention layer of each family (Qwen3-Next and Qwen3.5: Gated DeltaNet
  with 4 key and 8 value heads of 128; Kimi Linear: KDA with 8 heads of 128; Mamba-2 and
  Falcon-H1: SSD with 16 heads of 128, one group, state 128; hidden size 1024), forward +
  backward at each ``--lengths``, and a third copy whose served functions cost nothing (each
  returns an input of its output's shape): the time left is the layer's own (its projections,
  gates, norms), its share of transformers' layer time is ``rest``, and ``bound`` = 1 / ``rest`` is
  the speed-up that the fastest possible served functions would give (Amdahl's law); ``of bound``
  is the share of that possible saving attnlab's kernels take;
* **prefill**: the whole small model (4 layers, 3 linear to 1 attention; hidden 256, 4 heads of 64),
  one forward over ``--prefill`` tokens with its cache, no gradient;
* **decode**: the same model, ``--steps`` single-token steps with its cache after a prompt of
  ``--prompt`` tokens (the prompt's prefill is not timed): tokens per second.

Prints the seconds (median over the repeats after a warm-up) and attnlab's speed-up. The process
reuses freed memory as ``attnlab bench scaling``'s timing processes do (it restarts itself with
:func:`attnlab.profiling.allocator_env`'s ``"keep"``).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM
from transformers.utils import logging

from attnlab.integrations import hybrid
from attnlab.integrations.hybrid import LAYERS, tiny_config, use_kernels
from attnlab.profiling import allocator_env, round_robin

FAMILIES = ("qwen3_next", "qwen3_5_text", "kimi_linear", "mamba2", "falcon_h1")
LAYER_SHAPE = dict(hidden=1024, heads=8, head_dim=128, layers=1)
SSD = {"mamba2": dict(state_size=128, n_groups=1), "falcon_h1": dict(mamba_d_state=128, mamba_n_groups=1)}
SMALL = dict(hidden=256, heads=4, head_dim=64, layers=4)


def pair(family: str, shape: dict, **overrides):
    """Two copies of one model, transformers' path and attnlab's."""
    torch.manual_seed(0)
    ref = AutoModelForCausalLM.from_config(tiny_config(family, **shape, **overrides)).float()
    ours = copy.deepcopy(ref)
    use_kernels(ours)
    return ref, ours


def linear_layer(model):
    return next(m for m in model.modules() if type(m).__name__ in LAYERS)


def _free(name: str):
    """A stand-in for a served function that costs nothing: an input of the output's shape (the
    values for the delta rules, the input for the convolution and the SSD scan)."""
    if name in ("causal_conv1d_fn", "mamba2_chunk_scan"):
        return lambda hidden_states, *args, **kwargs: hidden_states
    return lambda query, key, value, *args, **kwargs: (value, None)


@contextlib.contextmanager
def free_functions(layer):
    """The layer's modeling module with its served functions costing nothing, for the call inside."""
    modeling = sys.modules[type(layer).__module__]
    names = hybrid._served(LAYERS[type(layer).__name__], modeling)
    saved = {name: getattr(modeling, name) for name in names}
    for name in names:
        setattr(modeling, name, _free(name))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(modeling, name, fn)


def layer_calls(family: str, n: int) -> dict:
    overrides = dict(SSD.get(family, {}), **({"layer_types": ["linear_attention"]} if family not in SSD else {}))
    if family == "kimi_linear":
        overrides["mlp_layer_types"] = ["dense"]
    ref, ours = pair(family, LAYER_SHAPE, **overrides)
    x = torch.randn(1, n, LAYER_SHAPE["hidden"], generator=torch.Generator().manual_seed(n)).requires_grad_(True)

    def run(layer, free=False):
        def call():
            x.grad = None
            with free_functions(layer) if free else contextlib.nullcontext():
                layer(hidden_states=x).square().mean().backward()
        return call
    return {"transformers": run(linear_layer(ref)), "attnlab": run(linear_layer(ours)), "free": run(linear_layer(ref), free=True)}


def step_calls(family: str, n: int) -> dict:
    """The served function against transformers' own, forward + backward, on the layer's shapes."""
    modeling = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    g = torch.Generator().manual_seed(n)
    grad = lambda *shape: torch.randn(*shape, generator=g).requires_grad_(True)  # noqa: E731
    if family == "mamba2":
        x, dt, b, c = grad(1, n, 16, 128), grad(1, n, 16), grad(1, n, 1, 128), grad(1, n, 1, 128)
        a, d = -torch.rand(16, generator=g), torch.ones(16)
        args, kw = (x, dt, a, b, c), dict(chunk_size=64, D=d, dt_softplus=True)
        pair = (modeling.mamba2_chunk_scan, hybrid.ssd_scan)
    else:
        heads = 4 if family == "qwen3_next" else 8
        q, k, v = grad(1, n, heads, 128), grad(1, n, heads, 128), grad(1, n, 8, 128)
        decay = (-torch.rand(1, n, 8, *((128,) if family == "kimi_linear" else ()), generator=g)).requires_grad_(True)
        args, kw = (q, k, v, decay, torch.rand(1, n, 8, generator=g).requires_grad_(True)), dict(use_qk_l2norm_in_kernel=True)
        name = "torch_chunk_gated_delta_rule" if family == "qwen3_next" else "chunk_kimi_delta_attention"
        pair = (getattr(modeling, name), hybrid.delta_rule(modeling.l2norm))

    def run(fn):
        def call():
            out = fn(*args, **kw)
            (out[0] if isinstance(out, tuple) else out).square().mean().backward()
        return call
    return {"transformers": run(pair[0]), "attnlab": run(pair[1])}


def prefill_calls(family: str, n: int) -> dict:
    ref, ours = pair(family, SMALL, **SSD.get(family, {}))
    ids = torch.randint(3, 128, (1, n), generator=torch.Generator().manual_seed(n))

    def run(model):
        @torch.no_grad()
        def call():
            model(ids, use_cache=True)
        return call
    return {"transformers": run(ref.eval()), "attnlab": run(ours.eval())}


def decode_times(family: str, prompt: int, steps: int, repeats: int) -> dict:
    """Seconds for ``steps`` cached single-token steps, round-robin over the two paths."""
    ref, ours = pair(family, SMALL, **SSD.get(family, {}))
    ids = torch.randint(3, 128, (1, prompt + steps), generator=torch.Generator().manual_seed(prompt))
    times: dict[str, list[float]] = {"transformers": [], "attnlab": []}
    with torch.no_grad():
        for _ in range(repeats + 1):  # the first round is the warm-up
            for name, model in (("transformers", ref.eval()), ("attnlab", ours.eval())):
                cache = model(ids[:, :prompt], use_cache=True).past_key_values
                t0 = time.perf_counter()
                for t in range(prompt, prompt + steps):
                    cache = model(ids[:, t : t + 1], cache=cache, use_cache=True).past_key_values
                times[name].append(time.perf_counter() - t0)
    return times


def main() -> None:
    if "ATTNLAB_ALLOCATOR" not in os.environ:  # restart once with freed memory reused, as `attnlab bench scaling` times
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **allocator_env("keep"), "ATTNLAB_ALLOCATOR": "keep"})
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--lengths", default="2048,8192")
    ap.add_argument("--kda-step-up-to", type=int, default=2048)
    ap.add_argument("--prefill", type=int, default=2048)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("-o", "--output", default=None)
    args = ap.parse_args()
    logging.set_verbosity_error()  # transformers' "falling back to its reference path" warnings
    records = []

    def record(measure, family, n, times):
        row = {"measure": measure, "family": family, "n": n, **{k: statistics.median(t[1:]) for k, t in times.items()},
               "repeats": len(times["attnlab"]) - 1}
        row["speedup"] = row["transformers"] / row["attnlab"]
        bound = ""
        if "free" in row:  # Amdahl: the layer's own share of transformers' layer time bounds the speed-up
            row["rest"] = row["free"] / row["transformers"]
            row["bound"] = 1 / row["rest"]
            row["of_bound"] = (row["transformers"] - row["attnlab"]) / (row["transformers"] - row["free"])
            bound = f"  rest {100 * row['rest']:4.0f}%  bound {row['bound']:5.2f}x  of bound {100 * row['of_bound']:4.0f}%"
        records.append(row)
        print(f"{measure:8s} {family:13s} N={n:5d}  transformers {row['transformers']:8.3f} s  attnlab {row['attnlab']:8.3f} s"
              f"  {row['speedup']:5.2f}x{bound}  ({row['repeats']} repeats)", flush=True)
        if args.output:
            Path(args.output).write_text(json.dumps({"records": records}, indent=1))

    families = args.families.split(",")
    for n in (int(s) for s in args.lengths.split(",") if s):  # --lengths "": the whole model only
        for family in ("qwen3_next", "kimi_linear", "mamba2"):
            if family in families and (family != "kimi_linear" or n <= args.kda_step_up_to):
                record("step", family, n, round_robin(step_calls(family, n), args.repeats, 10.0, max_repeats=args.repeats))
        for family in families:
            record("layer", family, n, round_robin(layer_calls(family, n), args.repeats, 10.0, max_repeats=args.repeats))
    for family in families:
        record("prefill", family, args.prefill, round_robin(prefill_calls(family, args.prefill), args.repeats, 10.0,
                                                            max_repeats=args.repeats))
        times = decode_times(family, args.prompt, args.steps, args.repeats)
        record("decode", family, args.steps, times)
        row = records[-1]
        print(f"         decode tokens per second: transformers {args.steps / row['transformers']:.1f}, "
              f"attnlab {args.steps / row['attnlab']:.1f}", flush=True)


if __name__ == "__main__":
    main()
