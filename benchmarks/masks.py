"""Masks that scale: a dense mask, the mask function block-sparse, PyTorch's causal kernel and
compiled FlexAttention, against N, each cell in its own plain process.

Same as ``attnlab bench masks``; any of its options may follow, e.g.

    python benchmarks/masks.py -o benchmarks/results/masks.json --plot benchmarks/results/masks.png

See :mod:`attnlab.studies.masks`.
"""

import sys

from attnlab.cli import app

if __name__ == "__main__":
    app(["bench", "masks", *sys.argv[1:]])
