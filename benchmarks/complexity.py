"""The CNN / RNN / self-attention comparison, measured: time against n, sequential steps, path length.

Same as ``attnlab complexity``; any of its options may follow, e.g.

    python benchmarks/complexity.py -o bench-results/complexity

See :mod:`attnlab.studies.complexity`.
"""

import sys

from attnlab.cli import app

if __name__ == "__main__":
    app(["complexity", *sys.argv[1:]])
