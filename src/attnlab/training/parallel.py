"""The training loop's processes: the process group torchrun starts, sequence-parallel groups, the
gradients averaged over every process, and the per-step numbers they agree on (:func:`attnlab.training.train`
calls these; one process needs none of them)."""

from __future__ import annotations

import os

import torch
from torch import nn

__all__ = ["agree", "average_gradients", "finish", "local_device", "process_group", "sequence_groups"]


def process_group(device: torch.device | None = None) -> tuple[int, int, bool]:
    """``(rank, world size, whether this call started the process group)``; starts one when
    launched by torchrun with ``WORLD_SIZE`` > 1: NCCL when the loop trains on CUDA, else gloo."""
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 or not dist.is_available():
        return 0, 1, False
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), False
    cuda = device is not None and device.type == "cuda"
    dist.init_process_group("nccl" if cuda and dist.is_nccl_available() else "gloo")
    return dist.get_rank(), dist.get_world_size(), True


def local_device(device: torch.device) -> torch.device:
    """The device of this process: under torchrun on CUDA, the GPU of its local rank (``LOCAL_RANK``)."""
    if device.type == "cuda" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        index = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return device


def sequence_groups(rank: int, world: int, p: int):
    """``(SequenceParallel or None, data-parallel rank, data-parallel world)`` for P-way sequence
    parallelism: consecutive ranks ``k P .. k P + P - 1`` share each sequence."""
    if not isinstance(p, int) or p < 1:
        raise ValueError(f"sequence_parallel must be a positive int, got {p!r}")
    if p == 1:
        return None, rank, world
    if world % p:
        raise ValueError(f"sequence parallelism over {p} processes needs a multiple of {p} processes, got {world}: "
                         f"launch with torchrun --nproc-per-node {p} (or a multiple)")
    import torch.distributed as dist

    from ..distributed.context import RingTimings
    from ..distributed.sequence import SequenceParallel

    mine = None
    for start in range(0, world, p):  # every rank creates every group, in the same order
        group = dist.new_group(list(range(start, start + p)))
        if start <= rank < start + p:
            mine = group
    return SequenceParallel(mine, timings=RingTimings()), rank // p, world // p


def average_gradients(model: nn.Module, world: int) -> None:
    """Average the parameters' gradients over every process (one all-reduce of them all)."""
    import torch.distributed as dist

    params = [p for p in model.parameters() if p.requires_grad]
    device = params[0].device if params else torch.device("cpu")  # NCCL reduces tensors on the GPU
    has = torch.tensor([p.grad is not None for p in params], dtype=torch.int64, device=device)
    dist.all_reduce(has)  # a parameter no process used keeps no gradient, as in one process
    params = [p for p, n in zip(params, has.tolist()) if n]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if not params:
        return
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat)
    flat /= world
    at = 0
    for p in params:
        p.grad.copy_(flat[at : at + p.numel()].view_as(p))
        at += p.numel()


def agree(loss: torch.Tensor, over_budget: bool, took: float, world: int) -> tuple[torch.Tensor, bool, float]:
    """What every process of a step agrees on: the global loss (the mean of the processes'), whether
    any process is over the time budget, and the step's time (the slowest process's)."""
    import torch.distributed as dist

    both = torch.tensor([float(loss.detach()), float(over_budget)], dtype=torch.float64, device=loss.device)
    dist.all_reduce(both)
    slowest = torch.tensor([took], dtype=torch.float64, device=loss.device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return both[0] / world, bool(both[1] > 0), float(slowest)


def finish(own_group: bool) -> None:
    """Wait for every process, then end the process group, when :func:`process_group` started it."""
    if own_group:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
