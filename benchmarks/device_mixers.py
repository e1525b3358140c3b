"""Every sequence mixer on CUDA (attnlab's own forms, fla not installed): float32 on the GPU against
float64 on the CPU with the same weights, forward and input gradient, causal and bidirectional, and
cached decoding against the whole sequence. Usage: PYTHONPATH=src python3 benchmarks/device_mixers.py OUT.json
(results: benchmarks/results/device-mixers-*)."""
import json
import sys
import time

import torch

from attnlab import efficient


def rel(a, b):
    return float((a.detach().double().cpu() - b.detach()).norm() / b.detach().norm())


rows = []
for name in efficient.select(mixer=True):
    for causal in (True, False):
        t0 = time.time()
        torch.manual_seed(0)
        ref = efficient.create(name, embed_dim=64, num_heads=4, causal=causal).double()
        gpu = efficient.create(name, embed_dim=64, num_heads=4, causal=causal).cuda()
        gpu.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
        x = torch.randn(2, 300, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        xr, xg = x.clone().requires_grad_(True), x.float().cuda().requires_grad_(True)
        yr, yg = ref(xr).output, gpu(xg).output
        cot = torch.randn_like(yr)
        yr.backward(cot)
        yg.backward(cot.float().cuda())
        row = {"variant": name, "causal": causal, "output": rel(yg, yr), "input_grad": rel(xg.grad, xr.grad)}
        if causal:
            with torch.no_grad():
                cache = gpu.new_cache()
                steps = torch.cat([gpu(xg[:, i:i + 1].detach(), cache=cache).output for i in range(40)], 1)
                row["decode_vs_whole"] = float((steps - gpu(xg[:, :40].detach()).output).abs().max())
        row["seconds"] = round(time.time() - t0, 2)
        rows.append(row)
        print(row, flush=True)
json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, open(sys.argv[1], "w"), indent=1)
