"""attnlab's efficient variants against the best-known PyTorch implementations of the same methods.

lucidrains' ``performer-pytorch``, ``local-attention``, ``nystrom-attention``, ``linformer``
and ``reformer-pytorch`` (benchmark-only dependencies: ``pip install -e '.[bench]'``), timed
round-robin with ours in one process, forward + backward, B = 1, H = 4, D = 64, fp32, with
matched settings:

* performer: 256 random features, the attention step on (q, k, v) (``FastAttention``);
* local: window 256 (theirs: buckets of 256 looking one bucket back and one forward, so a query
  sees 512 to 768 keys; ours: keys within +-256 exactly, 513), the attention step on (q, k, v);
* nystrom: 64 landmarks, 6 pseudo-inverse iterations, no convolution residual, whole layer
  (projections included, both sides);
* linformer: k = 256, separate key and value projections, whole layer;
* reformer: buckets of 64 positions (chunk 64), 2 hash rounds, whole layer.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .. import efficient
from ..profiling import round_robin
from .records import StudyRecord
from .scaling import HEAD_DIM, HEADS

__all__ = ["PEERS", "PeerRecord", "run_peers"]

PEERS = ("performer", "local", "nystrom", "linformer", "reformer")


@dataclass
class PeerRecord(StudyRecord):
    """Median forward+backward seconds of ours and of the peer's implementation at one N."""

    method: str
    n: int
    ours_seconds: float | None
    peer_seconds: float | None
    peer: str
    repeats: int
    note: str | None = None


def _qkv(n: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(n)
    return [torch.randn(1, HEADS, n, HEAD_DIM, generator=g).requires_grad_(True) for _ in range(3)]


def _pair(method: str, n: int) -> tuple[Callable[[], None], Callable[[], None], str]:
    """(ours, theirs, the peer's name) for one method at length n."""
    torch.manual_seed(0)
    e = HEADS * HEAD_DIM
    if method in ("performer", "local"):
        qkv = _qkv(n)
        if method == "performer":
            from performer_pytorch import FastAttention

            peer = FastAttention(dim_heads=HEAD_DIM, nb_features=256, causal=False)
            ours = efficient.create("performer", embed_dim=e, num_heads=HEADS, num_features=256, seed=0)
            name = "performer_pytorch.FastAttention"
        else:
            from local_attention import LocalAttention

            peer = LocalAttention(window_size=256, causal=False, look_backward=1, look_forward=1,
                                  dim=HEAD_DIM, autopad=True)
            ours = efficient.create("local", embed_dim=e, num_heads=HEADS, window=256)
            name = "local_attention.LocalAttention"

        def step(fn):
            def call():
                for t in qkv:
                    t.grad = None
                fn(*qkv).sum().backward()

            return call

        return step(lambda q, k, v: ours.step(q, k, v).output), step(peer), name
    x = torch.randn(1, n, e, generator=torch.Generator().manual_seed(n), requires_grad=True)
    if method == "nystrom":
        from nystrom_attention import NystromAttention

        peer = NystromAttention(dim=e, dim_head=HEAD_DIM, heads=HEADS, num_landmarks=64,
                                pinv_iterations=6, residual=False)
        ours = efficient.create("nystrom", embed_dim=e, num_heads=HEADS, landmarks=64, pinv_iters=6)
        name = "nystrom_attention.NystromAttention"
    elif method == "linformer":
        from linformer import LinformerSelfAttention

        peer = LinformerSelfAttention(dim=e, seq_len=n, heads=HEADS, k=256, one_kv_head=False, share_kv=False)
        ours = efficient.create("linformer", embed_dim=e, num_heads=HEADS, max_len=n, k=256)
        name = "linformer.LinformerSelfAttention"
    elif method == "reformer":
        from reformer_pytorch import LSHSelfAttention

        peer = LSHSelfAttention(dim=e, heads=HEADS, bucket_size=64, n_hashes=2, causal=False)
        ours = efficient.create("reformer", embed_dim=e, num_heads=HEADS, num_buckets=max(2, 2 * (n // 128)),
                                num_hashes=2, chunk_size=64)
        name = "reformer_pytorch.LSHSelfAttention"
    else:
        raise ValueError(f"no peer for {method!r}; expected one of {PEERS}")

    def whole(fn):
        def call():
            x.grad = None
            for p in list(ours.parameters()) + list(peer.parameters()):
                p.grad = None
            fn(x).sum().backward()

        return call

    return whole(lambda t: ours(t).output), whole(peer), name


def run_peers(n: int = 16384, methods=PEERS, *, min_repeats: int = 3, on_record=None) -> list[PeerRecord]:
    """Time ours and the peer's implementation of each method side by side at length n."""
    out = []
    for method in methods:
        try:
            ours, theirs, name = _pair(method, n)
        except ImportError as e:
            rec = PeerRecord(method, n, None, None, "", 0, f"peer not installed ({e.name}): pip install -e '.[bench]'")
        else:
            times = round_robin({"ours": ours, "peer": theirs}, min_repeats, 3.0)
            rec = PeerRecord(
                method, n, statistics.median(times["ours"][1:]), statistics.median(times["peer"][1:]), name,
                len(times["ours"]) - 1
            )
        out.append(rec)
        if on_record is not None:
            on_record(rec)
    return out
