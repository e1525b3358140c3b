"""Decoding: the KV cache against recomputing the prefix and against Hugging Face ``generate`` on
a randomly initialised GPT-2 of the same shape, the memory of StreamingLLM's bounded cache over
1K-100K tokens, and (given a docs language model) its perplexity on a stream 8x the training
context. Side by side in one run.

Same as ``attnlab bench decode``; any of its options may follow, e.g.

    attnlab train docs --out runs/docs
    python benchmarks/decode.py --checkpoint runs/docs -o benchmarks/results/decode-2026-11-22-cpu2.json \\
        --plot benchmarks/results/decode-2026-11-22-cpu2.png

See :mod:`attnlab.studies.decode`.
"""

import sys

from attnlab.cli import app

if __name__ == "__main__":
    app(["bench", "decode", *sys.argv[1:]])
