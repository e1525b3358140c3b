"""Float32 against bfloat16 mixed-precision training steps, every attention variant, 1K and 4K tokens.

Same as ``attnlab bench precision``; any of its options may follow, e.g.

    python benchmarks/precision.py -o benchmarks/results/precision.json --plot precision.png

The arena's long-task model (width 64, 4 heads, 1 block, 8K tokens a batch); both precisions of
each cell timed round-robin in one process, with the share of this machine's peak each reaches.
See :mod:`attnlab.studies.precision`.
"""

import sys

from attnlab.cli import app

if __name__ == "__main__":
    app(["bench", "precision", *sys.argv[1:]])
