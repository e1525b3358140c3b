"""Forward+backward time and peak memory of every attention variant against N, side by side.

Same as ``attnlab bench scaling``; any of its options may follow, e.g.

    python benchmarks/scaling.py --peers -o bench-results/scaling.json --plot bench-results/scaling.png

See :mod:`attnlab.studies.scaling` (and :mod:`attnlab.studies.peers` for ``--peers``).
"""

import sys

from attnlab.cli import app

if __name__ == "__main__":
    app(["bench", "scaling", *sys.argv[1:]])
