"""Long-distance labelling: SimpleRNN, LSTM, AttentionRNN, LSTMN and self-attention against distance.

Same as ``attnlab bench distance``; any of its options may follow, e.g.

    python benchmarks/distance.py -o bench-results/distance.json --plot bench-results/distance.png

See :mod:`attnlab.studies.distance`.
"""

import sys

from attnlab.cli import app

if __name__ == "__main__":
    app(["bench", "distance", *sys.argv[1:]])
