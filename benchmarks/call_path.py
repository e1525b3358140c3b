"""The way from a layer to its math: the distinct attnlab functions and files one forward of each
variant's layer runs through, the calls, and the attnlab frames on the stack at the recurrence
(``chunk_delta``, ``chunk_gated``), measured with ``sys.setprofile`` (:func:`attnlab.profiling.call_path`).

One layer of 32 wide, 4 heads, at 128 tokens, batch 1, its second forward (the first may import
and register). The counts depend on the code and the Python version, not on the machine.

    PYTHONPATH=src python benchmarks/call_path.py [-o OUT.json]
"""

import argparse
import json
import platform

import torch

from attnlab import efficient
from attnlab.profiling import call_path

TARGETS = ("chunk_delta", "chunk_gated")


def measure(name: str) -> dict:
    """One variant's row."""
    options = {"max_len": 128} if efficient.budget(name).max_len else {}
    torch.manual_seed(0)
    layer = efficient.create(name, embed_dim=32, num_heads=4, **options)
    x = torch.randn(1, 128, 32)
    layer(x)
    path = call_path(lambda: layer(x), TARGETS)
    return {"variant": name, "functions": len(path.functions), "files": len(path.files), "calls": path.calls,
            "depth_at_recurrence": max(path.depth.values(), default=None), "file_list": sorted(path.files)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-o", "--output", default=None)
    a = p.parse_args()
    rows = [measure(n) for n in efficient.names()]
    for r in rows:
        print(f"{r['variant']:15s} {r['functions']:3d} functions in {r['files']:2d} files, {r['calls']:4d} calls, "
              f"depth at the recurrence {r['depth_at_recurrence']}")
    if a.output:
        with open(a.output, "w") as f:
            json.dump({"python": platform.python_version(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
