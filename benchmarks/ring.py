"""Sequence parallelism on this machine: peak memory per process and time per training step of
an Encoder against the sequence length, for 1, 2 and 4 processes (ring attention over gloo on
loopback), each process capped at 160 MiB, so that the lengths one process cannot hold show.

Same as ``attnlab bench ring``; any of its options may follow, e.g.

    python benchmarks/ring.py -o benchmarks/results/ring-2026-11-23-cpu2.json --plot benchmarks/results/ring-2026-11-23-cpu2.png

See :mod:`attnlab.studies.ring` and docs/guides/sequence-parallelism.md.
"""

import sys

from attnlab.cli import app

if __name__ == "__main__":
    app(["bench", "ring", *sys.argv[1:]])
