"""Efficient attention swapped into a trained model (all-MiniLM-L6-v2), no retraining: fidelity
against speed and memory, side by side in one run.

Same as ``attnlab bench pretrained``; any of its options may follow, e.g.

    python benchmarks/pretrained.py -o benchmarks/results/pretrained-2026-11-22-cpu2.json \\
        --plot benchmarks/results/pretrained-2026-11-22-cpu2.png

See :mod:`attnlab.studies.pretrained`.
"""

import sys

from attnlab.cli import app

if __name__ == "__main__":
    app(["bench", "pretrained", *sys.argv[1:]])
