"""Graph attention on a random graph of 100k nodes and 1M edges: attnlab vs TransformerConv.

Same as ``attnlab bench graph``; any of its options may follow, e.g.

    python benchmarks/graph.py -o benchmarks/results/graph.json

Needs PyTorch Geometric (``pip install -e '.[bench]'``). See :mod:`attnlab.studies.graph`.
"""

import sys

from attnlab.cli import app

if __name__ == "__main__":
    app(["bench", "graph", *sys.argv[1:]])
