"""Benchmark attend vs scaled_dot_product_attention vs a naive materialised implementation.

Same as ``attnlab bench attention``; any of its options may follow, e.g.

    python benchmarks/attention.py --sizes 1024,4096,8192 -o bench-results/attention.json

B = 1, H = 4, D = 64, fp32; every implementation of a configuration is timed round-robin in
one process, and its peak memory (tensor bytes alive above the inputs) read from PyTorch's
profiler. See :mod:`attnlab.studies.attention`.
"""

import sys

from attnlab.cli import app

if __name__ == "__main__":
    app(["bench", "attention", *sys.argv[1:]])
