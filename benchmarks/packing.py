"""Packed documents: cost per token of a causal encoder's forward + backward, attended document by
document, against the dense block-diagonal mask and against padding. Side by side in one run.

Same as ``attnlab bench packing``; any of its options may follow, e.g.

    python benchmarks/packing.py -o benchmarks/results/packing-2026-11-22-cpu2.json

See :mod:`attnlab.studies.packing`.
"""

import sys

from attnlab.cli import app

if __name__ == "__main__":
    app(["bench", "packing", *sys.argv[1:]])
