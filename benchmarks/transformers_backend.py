"""transformers models with ``attn_implementation="attnlab"`` against their own ``"sdpa"``: one
forward pass of the same model, same weights, side by side in one process (round-robin).

Models: all-MiniLM-L6-v2 (the real weights, from the attnlab[pretrained] extra) and random-weight
models built from their architectures' configs at GPT-2 small / small-Llama sizes: GPT-2, Llama
(grouped heads), Mistral (sliding window 256), Qwen2 and ModernBERT (local attention 128).
Inputs: float32, B x N tokens; with ``--padded`` a quarter of the rows are padded by a quarter.

    python benchmarks/transformers_backend.py -o benchmarks/results/transformers-backend-2026-11-25-cpu2.json

Prints one row per model: seconds per forward pass under sdpa and attnlab, and sdpa / attnlab
(above 1: attnlab is faster).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
from functools import partial

import torch
import transformers

import attnlab.integrations.transformers  # noqa: F401  (registers attn_implementation="attnlab")
from attnlab.profiling import round_robin

DECODER = dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=6, num_attention_heads=12,
               max_position_embeddings=2048)
MODELS = {
    "gpt2": ("GPT2Model", "GPT2Config", dict(n_embd=768, n_head=12, n_layer=6, n_positions=2048)),
    "llama": ("LlamaModel", "LlamaConfig", {**DECODER, "num_key_value_heads": 4}),
    "mistral": ("MistralModel", "MistralConfig", {**DECODER, "num_key_value_heads": 4, "sliding_window": 256}),
    "qwen2": ("Qwen2Model", "Qwen2Config", {**DECODER, "num_key_value_heads": 4}),
    "modernbert": ("ModernBertModel", "ModernBertConfig", {**DECODER, "local_attention": 128, "global_attn_every_n_layers": 3,
                                                           "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
                                                           "cls_token_id": 1, "sep_token_id": 2}),
}


def _models(name: str):
    """(sdpa model, attnlab model) with the same weights, eval mode."""
    if name == "all-MiniLM-L6-v2":
        from attnlab.pretrained import locate

        folder = locate(name)
        return tuple(transformers.AutoModel.from_pretrained(str(folder), attn_implementation=i).eval() for i in ("sdpa", "attnlab"))
    model_cls, config_cls, kwargs = MODELS[name]
    config = getattr(transformers, config_cls)(**kwargs)
    torch.manual_seed(0)
    a = getattr(transformers, model_cls)._from_config(copy.deepcopy(config), attn_implementation="sdpa").eval()
    b = getattr(transformers, model_cls)._from_config(copy.deepcopy(config), attn_implementation="attnlab").eval()
    b.load_state_dict(a.state_dict())  # the same weights under the other implementation
    return a, b


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="all-MiniLM-L6-v2," + ",".join(MODELS))
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--n", type=int, default=512)
    p.add_argument("--padded", action="store_true", help="pad a quarter of the rows by a quarter of their length")
    p.add_argument("--seconds", type=float, default=10.0, help="round-robin time per model")
    p.add_argument("-o", "--output")
    args = p.parse_args()
    torch.manual_seed(0)
    rows = []
    for name in args.models.split(","):
        sdpa, ours = _models(name)
        ids = torch.randint(5, 1000, (args.batch, args.n))
        am = torch.ones_like(ids)
        if args.padded:
            am[: max(1, args.batch // 4), -args.n // 4 :] = 0
        with torch.no_grad():
            calls = {"sdpa": partial(sdpa, input_ids=ids, attention_mask=am), "attnlab": partial(ours, input_ids=ids, attention_mask=am)}
            diff = (calls["sdpa"]().last_hidden_state - calls["attnlab"]().last_hidden_state)[am.bool()].abs().max().item()
            times = round_robin(calls, 5, args.seconds)
        t = {k: statistics.median(v[1:]) for k, v in times.items()}
        rows.append({"model": name, "batch": args.batch, "n": args.n, "padded": args.padded, "sdpa_s": t["sdpa"],
                     "attnlab_s": t["attnlab"], "speed": t["sdpa"] / t["attnlab"], "repeats": len(times["sdpa"]) - 1,
                     "max_abs_diff": diff})
        r = rows[-1]
        print(f"{name:18s} B={r['batch']} N={r['n']} padded={r['padded']}: sdpa {r['sdpa_s'] * 1e3:7.1f} ms, attnlab "
              f"{r['attnlab_s'] * 1e3:7.1f} ms, sdpa/attnlab {r['speed']:.3f}x ({r['repeats']} rounds; max |diff| {diff:.1e})",
              flush=True)
        del calls, sdpa, ours
        if args.output:  # after every model, atomically: an interrupted run keeps what it measured
            with open(args.output + ".tmp", "w") as f:
                json.dump({"threads": torch.get_num_threads(), "cpus": os.cpu_count(), "records": rows}, f, indent=1)
            os.replace(args.output + ".tmp", args.output)


if __name__ == "__main__":
    main()
