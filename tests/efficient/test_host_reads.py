"""The gated family's forward and backward never read a tensor's value on the host: on a GPU such
a read (``.item()``, ``bool(t)``, ``.tolist()``) waits for every kernel queued before it, so one
per chunk would serialise the device. Counted on the CPU, where the same calls are made."""

import collections
import traceback

import pytest
import torch
from torch.overrides import TorchFunctionMode

from attnlab import efficient

READS = {"item", "__bool__", "tolist", "__int__", "__float__", "__index__", "numpy"}


class HostReads(TorchFunctionMode):
    """Counts the calls that read a tensor's value on the host, by the attnlab line that made them."""

    def __init__(self):
        super().__init__()
        self.seen = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in READS:
            mine = [f for f in traceback.extract_stack() if "/attnlab/" in f.filename]
            if mine:
                self.seen[f"{mine[-1].filename.split('/attnlab/')[-1]}:{mine[-1].lineno} {func.__name__}"] += 1
        return func(*args, **(kwargs or {}))


GATED = ["retnet", "gla", "deltanet", "gated_deltanet", "kda", "mamba2", "deltaproduct"]


def test_the_counter_sees_a_host_read():
    with HostReads() as r:
        bool(torch.ones(2).any())
        efficient.create("nystrom", embed_dim=32, num_heads=2)(torch.randn(1, 128, 32))
    assert r.seen and any("nystrom.py" in k for k in r.seen)


@pytest.mark.parametrize("name", GATED)
@pytest.mark.parametrize("causal", [False, True])
def test_a_gated_layer_reads_no_value_on_the_host(name, causal):
    assert set(GATED) <= set(efficient.names())
    torch.manual_seed(0)
    layer = efficient.create(name, embed_dim=32, num_heads=2, causal=causal)
    x = torch.randn(2, 300, 32, requires_grad=True)  # several chunks, the last one ragged
    layer(x)  # lazy set-up out of the count
    with HostReads() as r:
        out = layer(x).output
        out.square().sum().backward()
    assert not r.seen, dict(r.seen)
