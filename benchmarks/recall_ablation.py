"""Which part of the delta-rule variants solves associative recall: the delta rule, or the short
convolution that DeltaNet, Gated DeltaNet and Mamba-2 have and linear attention, RetNet and GLA
do not?

    python benchmarks/recall_ablation.py -o benchmarks/results/recall-ablation-2026-11-24-cpu2.json

The cells of ``attnlab bench recall`` (8 and 16 key-value pairs, widths 32 and 64, 1500 steps,
at most 60 s a run) for ``deltanet`` without its convolution (``conv_size=0``: the delta rule
alone) and ``gla`` with one (``conv_size=4``: a gated sum with the convolution).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from attnlab.studies.recall import run

ABLATIONS = {"deltanet": {"conv_size": 0}, "gla": {"conv_size": 4}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", default=None)
    args = ap.parse_args()
    records = []

    def keep(rec):
        records.append(rec.to_dict())
        print(f"{rec.variant:22s} pairs={rec.pairs:3d} d={rec.dim:3d} state={rec.state_floats:6d} accuracy {rec.accuracy:.3f} "
              f"({rec.steps} steps, {rec.train_seconds:.0f} s)", flush=True)
        if args.output:
            Path(args.output).write_text(json.dumps({"records": records}, indent=1))

    run(list(ABLATIONS), options=ABLATIONS, on_record=keep)


if __name__ == "__main__":
    main()
