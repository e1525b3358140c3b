"""Writes layers.pt: every registered variant's state_dict and its output on a fixed input, from
the code before the attention step became an object the layer holds (commit e70159d). The test
(tests/layers/test_step_checkpoints.py) loads each state_dict into today's layer and checks the
output. Run from the repository root: python tests/data/layers-v1/make.py"""

from pathlib import Path

import torch

from attnlab import efficient

E, H, N = 16, 4, 12
EXTRA = {  # cases whose parameters sit elsewhere: grouped B and C, a learnable score, grouped keys
    "mamba2_groups": ("mamba2", {"ngroups": 1, "state_size": 8, "causal": True}),
    "dense_learnable": ("dense", {"score": "additive", "num_kv_heads": 2}),
    "dense_project": ("dense", {"head_mode": "project"}),
}


def options(name):
    out = dict(efficient.budget(name).short)
    if efficient.budget(name).max_len:
        out["max_len"] = N
    if efficient.capabilities(name).causal == "flag":
        out["causal"] = True
    return out


def main():
    cases = {n: (n, options(n)) for n in efficient.names()} | EXTRA
    out = {}
    for key, (name, opts) in cases.items():
        torch.manual_seed(0)
        layer = efficient.create(name, embed_dim=E, num_heads=H, **opts).double().eval()
        x = torch.randn(2, N, E, dtype=torch.float64)
        with torch.no_grad():
            y = layer(x).output
        out[key] = {"name": name, "options": opts, "state": layer.state_dict(), "x": x, "output": y}
    torch.save(out, Path(__file__).with_name("layers.pt"))


if __name__ == "__main__":
    main()
