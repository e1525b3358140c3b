"""Length extrapolation of every positional encoding: trained at length 64, tested at 64, 128, 256.

Same as ``attnlab bench positional``; any of its options may follow, e.g.

    python benchmarks/positional.py -o bench-results/positional.json --plot bench-results/positional.png

The task (delayed copy: the target at position i is the token 5 positions back) is generated
inside :mod:`attnlab.studies.positional`; each encoding trains the same causal encoder on the
same data stream for each seed, and its token accuracy is measured on the same test sets.
"""

import sys

from attnlab.cli import app

if __name__ == "__main__":
    app(["bench", "positional", *sys.argv[1:]])
