"""What every ring-attention call over one sharded sequence shares: the process group, every
shard's positions and key padding (:class:`RingContext`), and where ring time goes
(:class:`RingTimings`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import torch
import torch.distributed as dist

__all__ = ["P2P_BACKENDS", "RingContext", "RingTimings", "backend_of", "check_group", "gather_all"]

P2P_BACKENDS = ("gloo", "nccl", "mpi", "xccl")
"""Backends with the point-to-point ``isend`` / ``irecv`` the ring needs."""

T = TypeVar("T")


@dataclass
class RingTimings:
    """Where a rank's ring-attention time went, summed over calls (forward and backward).

    Attributes:
        compute: seconds computing tiles. wait: seconds blocked on a shard still in flight (the
            communication that overlapping did not hide). sent: bytes this rank sent.
        steps: ring steps taken.
    """

    compute: float = 0.0
    wait: float = 0.0
    sent: int = 0
    steps: int = 0


def backend_of(group, device="cpu") -> str:
    """The backend that carries ``device``'s tensors in ``group`` (a group made without naming a
    backend reports one per device: ``"cpu:gloo,cuda:nccl"``)."""
    name = str(dist.get_backend(group))
    if ":" in name:
        per_device = dict(part.split(":", 1) for part in name.split(","))
        return per_device.get(torch.device(device).type, name)
    return name


def check_group(group, device="cpu") -> tuple[int, int, list[int]]:
    """``(rank, world, global ranks)`` of ``group`` (None: the default group); ``RuntimeError``
    when torch.distributed is not initialised or ``device``'s backend lacks send / receive."""
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("ring attention needs torch.distributed initialised: start with torchrun, or call "
                           "torch.distributed.init_process_group first")
    backend = backend_of(group, device)
    if backend not in P2P_BACKENDS:
        raise RuntimeError(f"ring attention needs point-to-point send / receive, which the {backend!r} backend lacks; "
                           f"use one of {', '.join(P2P_BACKENDS)}")
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    ranks = [dist.get_global_rank(group, r) for r in range(world)] if group is not None else list(range(world))
    return rank, world, ranks


def gather_all(t: torch.Tensor, group, world: int) -> torch.Tensor:
    """Every rank's ``t`` stacked (on CPU under gloo, which gathers CPU tensors; on ``t``'s device otherwise)."""
    if backend_of(group, t.device) == "gloo":
        t = t.cpu()
    out = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(out, t.contiguous(), group=group)
    return torch.stack(out)


@dataclass
class RingContext:
    """What every ring-attention call over one sharded sequence shares: the group, every
    shard's positions and key flags. Build it once per forward with :meth:`build` and pass it
    to each layer's :func:`ring_attend` (it costs three small all-gathers: sizes, positions,
    key flags).

    Attributes:
        group: the process group (None: the default group). rank, world: this rank's index in
            it and its size; ranks: the global rank of each member.
        positions: ``(P, c)`` int64, the positions every rank holds.
        key_valid: ``(P, B, c)`` bool, True = a real key, or None when no key is padding.
    """

    group: object
    rank: int
    world: int
    ranks: list[int]
    positions: torch.Tensor
    key_valid: torch.Tensor | None = None
    _plans: dict = field(default_factory=dict, repr=False)

    @classmethod
    def build(cls, positions: torch.Tensor, key_valid: torch.Tensor | None = None, *, group=None) -> RingContext:
        """Gather every rank's ``positions`` ``(c,)`` and key flags ``(B, c)`` (True = real key;
        None: no padding on this rank). Every rank of ``group`` must call it."""
        rank, world, ranks = check_group(group)
        problem = None  # checked here, raised on every rank together (a rank raising alone leaves the others waiting)
        if (not isinstance(positions, torch.Tensor) or positions.dim() != 1
                or positions.dtype not in (torch.int32, torch.int64)):
            problem = ("positions must be an int tensor of shape (c,), got "
                       f"{tuple(positions.shape) if isinstance(positions, torch.Tensor) else type(positions).__name__}")
            positions = torch.zeros(0, dtype=torch.int64)
        elif key_valid is not None and (not isinstance(key_valid, torch.Tensor) or key_valid.dtype != torch.bool
                                        or key_valid.dim() != 2 or key_valid.shape[1] != positions.shape[0]):
            problem = (f"key_valid must be a bool tensor (B, c) = (B, {positions.shape[0]}), True = a real key; got "
                       f"{tuple(key_valid.shape) if isinstance(key_valid, torch.Tensor) else type(key_valid).__name__}"
                       + (f" of dtype {key_valid.dtype}" if isinstance(key_valid, torch.Tensor) else ""))
        c = positions.shape[0]
        b = -1 if key_valid is None or problem else key_valid.shape[0]
        meta = gather_all(torch.tensor([c, b, problem is not None], dtype=torch.int64, device=positions.device),
                          group, world)
        bad = [r for r in range(world) if meta[r, 2]]
        if bad:
            raise ValueError(problem
                             or f"rank(s) {bad} of the sequence's group gave positions or key_valid that do not fit")
        if bool((meta[:, 0] != c).any()):
            raise ValueError(f"every rank must hold the same number of positions; they hold {meta[:, 0].tolist()} "
                             "(pad the sequence to a multiple of the ranks: attnlab.distributed.plan_layout(pad=True))")
        batches = {int(x) for x in meta[:, 1] if x >= 0}
        if len(batches) > 1:
            raise ValueError(f"the ranks' key_valid disagree on the batch size: {sorted(batches)}")
        pos = gather_all(positions.to(torch.int64), group, world)
        valid = None
        if batches:
            bsz = batches.pop()
            mine = key_valid if key_valid is not None else torch.ones(bsz, c, dtype=torch.bool, device=positions.device)
            valid = gather_all(mine.to(torch.uint8), group, world).bool()
            if bool(valid.all()):
                valid = None
        return cls(group, rank, world, ranks, pos, valid)

    def cached(self, key, make: Callable[[], T]) -> T:
        """What ``make()`` returns, made once per ``key`` and kept in the context (the ring schedule and
        block maps of a mask: every layer of a forward uses the same; the eight newest are kept)."""
        if key not in self._plans:
            if len(self._plans) >= 8:  # a long-lived context: the oldest plan goes
                self._plans.pop(next(iter(self._plans)))
            self._plans[key] = make()
        return self._plans[key]
