"""The block-sparse ``attend`` against the special engines it replaces, each case in its own process.

``local``'s banded flash engine (efficient/banded.py) and the gathered block-sparse engine of
``longformer`` / ``bigbird`` (efficient/sparse.py) against ``attend`` under the same mask
function: forward + backward seconds (median of 5 steps after a warm-up) and peak resident
memory of the process (ru_maxrss; the inputs and their gradients included), B = 1, H = 4,
D = 64, fp32. The special engines are deleted in the next commit: run this at the commit that
holds them.

    python benchmarks/engines.py > benchmarks/results/engines-<date>-cpu2.txt
"""

import json
import resource
import statistics
import subprocess
import sys
import time

CASES = [("window", n) for n in (4096, 16384, 65536)] + [("window_causal", 16384), ("longformer", 16384), ("bigbird", 16384)]


def one(pattern: str, n: int, engine: str) -> dict:
    import torch

    from attnlab import efficient, masks
    from attnlab.core.attend import attend

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 4, n, 64, requires_grad=True) for _ in range(3))
    causal = pattern == "window_causal"
    if pattern.startswith("window"):
        mask = masks.window(256, causal=causal)
    elif pattern == "longformer":
        mask = masks.window(256) | masks.global_tokens(16)
    else:
        bird = efficient.create("bigbird", embed_dim=256, num_heads=4, window=64, global_tokens=2, random_blocks=3)
        mask = bird.full_pattern()

    def step():
        for t in (q, k, v):
            t.grad = None
        if engine == "attend":
            out = attend(q, k, v, mask=mask).output
        elif pattern.startswith("window"):
            from attnlab.efficient.banded import banded_flash_attention

            out = banded_flash_attention(q, k, v, 256, causal=causal)
        else:
            from attnlab.efficient.sparse import block_sparse_attention

            if pattern == "longformer":
                out = block_sparse_attention(q, k, v, 256, global_index=torch.arange(16))
            else:
                out = block_sparse_attention(q, k, v, 64, global_index=torch.arange(2), random_blocks=bird.random_blocks(n))
        out.sum().backward()

    step()
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return {"pattern": pattern, "n": n, "engine": engine, "seconds": statistics.median(times),
            "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


if __name__ == "__main__":
    if len(sys.argv) > 1:  # a worker: one case
        print(json.dumps(one(sys.argv[1], int(sys.argv[2]), sys.argv[3])))
        sys.exit(0)
    print("forward + backward, B=1, H=4, D=64, fp32, window 256 (bigbird: window 64, 2 global, 3 random blocks of 64); "
          "each case in its own process")
    print(f"{'pattern':14s} {'N':>6s} {'special engine s':>17s} {'attend s':>9s} {'time ratio':>10s} "
          f"{'special MiB':>11s} {'attend MiB':>10s} {'memory ratio':>12s}")
    for pattern, n in CASES:
        got = {}
        for engine in ("special", "attend"):
            proc = subprocess.run([sys.executable, __file__, pattern, str(n), engine], capture_output=True, text=True, check=True)
            got[engine] = json.loads(proc.stdout.strip().splitlines()[-1])
        s, a = got["special"], got["attend"]
        print(f"{pattern:14s} {n:6d} {s['seconds']:17.3f} {a['seconds']:9.3f} {a['seconds'] / s['seconds']:10.2f} "
              f"{s['rss_mib']:11.0f} {a['rss_mib']:10.0f} {a['rss_mib'] / s['rss_mib']:12.2f}")
