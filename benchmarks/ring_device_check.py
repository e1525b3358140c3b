"""Ring attention's tile path on a GPU: the exactness cases of tests/distributed on CUDA tensors
in a one-process gloo group (the ring's arithmetic, not its transport), and the refusal of
gloo for CUDA tensors between processes. Prints the largest error per case.

    python benchmarks/ring_device_check.py

Needs a CUDA device; this machine has none (it ran on a lent H100, see the issue's closing note).
"""

import torch

from attnlab.distributed.spawn import spawn
from tests.distributed import workers
from tests.distributed.test_ring import _cases


def gloo_refuses_cuda():
    q = torch.randn(1, 2, 4, 4, device="cuda")
    try:
        workers.ring_attend(q, q, q)
    except ValueError as err:
        return str(err)
    return "no error"


if __name__ == "__main__":
    cases = [dict(case, device="cuda") for case in _cases()]
    (errs,) = spawn(workers.exactness, 1, cases)
    worst = 0.0
    for case, err in zip(cases, errs):
        tol = 1e-10 if case["dtype"] == torch.float64 else 1e-5
        worst_case = max(err.values())
        worst = max(worst, worst_case / tol)
        print(f"{case['layout']:>10} causal={case['causal']!s:5} window={case['window']!s:4} padding={case.get('padding')!s:5} "
              f"{str(case['dtype']):>13} score={case.get('score', 'scaled_dot'):>10}: max error {worst_case:.1e} (tolerance {tol:.0e})")
    print(f"largest error / tolerance: {worst:.2e}")
    print("2 gloo processes with CUDA tensors:", spawn(gloo_refuses_cuda, 2)[0])
