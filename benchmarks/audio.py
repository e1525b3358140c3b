"""Full vs truncated attention on 60 seconds of audio (6000 frames): Conformer and Transformer.

Same as ``attnlab bench audio``; any of its options may follow, e.g.

    python benchmarks/audio.py -o benchmarks/results/audio.json

See :mod:`attnlab.studies.audio`.
"""

import sys

from attnlab.cli import app

if __name__ == "__main__":
    app(["bench", "audio", *sys.argv[1:]])
