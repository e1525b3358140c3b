"""Graph attention at scale: attnlab's sparse :class:`attnlab.models.GraphAttention` against
PyTorch Geometric's ``TransformerConv`` with the same weights, side by side in one process.

A random graph (``nodes`` nodes, ``edges`` directed edges drawn uniformly, seed fixed), node
features ``(nodes, in_dim)``, one layer ``in_dim -> num_heads x head_dim`` with the root weight.
Each call is a forward pass, ``out.sum().backward()``: time is the median of round-robin
repetitions (the first call, a warm-up, is dropped); peak memory is the profiler's peak of live
tensor bytes during one call (:func:`attnlab.studies.attention.peak_bytes`). Both layers compute
the same numbers (checked here on every run: the largest output difference is reported).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..profiling import measure_calls
from ..validate import positive_int
from .records import StudyRecord, timed

__all__ = ["GraphRecord", "run"]


@timed(note=False)
class GraphRecord(StudyRecord):
    """One layer's measurement: ``seconds`` (median fwd+bwd), ``peak_bytes``, ``repeats``."""

    layer: str
    nodes: int
    edges: int


def run(
    nodes: int = 100_000,
    edges: int = 1_000_000,
    *,
    in_dim: int = 256,
    num_heads: int = 4,
    head_dim: int = 64,
    min_repeats: int = 3,
    memory: bool = True,
    pyg: bool = True,
    seed: int = 0,
    device: str | torch.device = "cpu",
    on_record: Callable[[GraphRecord], None] | None = None,
) -> tuple[list[GraphRecord], float | None]:
    """Measure attnlab's sparse layer (and ``TransformerConv`` when ``pyg`` and installed) on
    ``device`` (the graph and the weights drawn on the CPU, then moved: the same on every device).

    Returns the records and the largest absolute output difference between the two (None
    without PyG).
    """
    from ..layers.graph import GraphAttention

    for name, val in (("nodes", nodes), ("edges", edges), ("in_dim", in_dim), ("num_heads", num_heads),
                      ("head_dim", head_dim)):
        positive_int(name, val)
    device = torch.device(device)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(nodes, in_dim, generator=g).to(device).requires_grad_(True)
    edge_index = torch.randint(0, nodes, (2, edges), generator=g).to(device)
    layers: dict[str, torch.nn.Module] = {}
    if pyg:
        try:
            from torch_geometric.nn import TransformerConv
        except ImportError as e:
            raise RuntimeError("PyTorch Geometric is not installed (pip install torch_geometric), or run "
                               "without it") from e
        torch.manual_seed(seed)
        conv = TransformerConv(in_dim, head_dim, heads=num_heads)
        layers["attnlab"] = GraphAttention.from_transformer_conv(conv)
        layers["pyg_transformer_conv"] = conv
    else:
        torch.manual_seed(seed)
        layers["attnlab"] = GraphAttention(in_dim, head_dim, num_heads)
    layers = {k: m.to(device) for k, m in layers.items()}

    def call_of(layer):
        def call():
            x.grad = None
            layer.zero_grad(set_to_none=True)
            _output(layer(x, edge_index)).sum().backward()

        return call

    diff = None
    if pyg:
        with torch.no_grad():
            diff = float((layers["attnlab"](x, edge_index).output
                          - layers["pyg_transformer_conv"](x, edge_index)).abs().max())
    measured = measure_calls({k: call_of(m) for k, m in layers.items()}, min_repeats, memory=memory, device=device)
    records = []
    for name, (secs, peak, reps) in measured.items():
        rec = GraphRecord(name, nodes, edges, secs, peak, reps)
        records.append(rec)
        if on_record is not None:
            on_record(rec)
    return records, diff


def _output(res):
    """The tensor of a layer's result: attnlab's ``AttentionResult`` or PyG's plain tensor."""
    return getattr(res, "output", res)
