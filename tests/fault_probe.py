"""Child process of tests/test_profiling.py: the median minor page faults of a step that allocates,
fills and frees one large tensor (spec on stdin: {"mib": size, "steps": count})."""

import json
import statistics
import sys

import torch

from attnlab.profiling import minor_faults

if __name__ == "__main__":
    spec = json.loads(sys.stdin.read())
    per_step = []
    for _ in range(spec["steps"]):
        before = minor_faults()
        t = torch.ones(spec["mib"] * 2**20 // 4)  # filled: every page is touched
        del t
        per_step.append(minor_faults() - before)
    print(json.dumps(statistics.median(per_step[1:])))  # the first step maps the block in any case
