"""Sharding a sequence across ranks and gathering it back, and the mask that tells a layer its
input is a shard (:class:`ShardedMask`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from ..core import spanning
from .context import RingContext, RingTimings
from .layout import SequenceLayout
from .ring import ring_attend, rule_of

__all__ = ["SequenceParallel", "ShardedMask", "attend_sharded", "gather", "parallelize", "shard"]


def shard(x: torch.Tensor, layout: SequenceLayout, rank: int, *, dim: int = 1, fill=0) -> torch.Tensor:
    """Rank ``rank``'s shard of ``x`` along ``dim`` (which holds ``layout.length`` positions),
    padded with ``fill`` to ``layout.padded`` first: size ``layout.shard_len`` along ``dim``."""
    if x.shape[dim] != layout.length:
        raise ValueError(f"x has {x.shape[dim]} positions along dim {dim}, the layout {layout.length}")
    if layout.padded != layout.length:
        extra = list(x.shape)
        extra[dim] = layout.padded - layout.length
        x = torch.cat([x, torch.full(extra, fill, dtype=x.dtype, device=x.device)], dim=dim)
    return x.index_select(dim, layout.positions(rank, device=x.device))


class _Gather(torch.autograd.Function):
    """All-gather along ``dim``; backward: the gradients every rank holds for this shard, summed."""

    @staticmethod
    def forward(ctx, x, group, world, rank, dim):
        parts = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(parts, x.contiguous(), group=group)
        ctx.group, ctx.rank, ctx.dim, ctx.size = group, rank, dim, x.shape[dim]
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad.narrow(ctx.dim, ctx.rank * ctx.size, ctx.size), None, None, None, None


def gather(x: torch.Tensor, layout: SequenceLayout, *, group=None, dim: int = 1) -> torch.Tensor:
    """The whole sequence from every rank's shard ``x`` (size ``layout.shard_len`` along ``dim``),
    in position order, padding removed: size ``layout.length`` along ``dim``. Differentiable:
    the gradient reaching a shard is the sum of the gradients every rank holds for it (each rank
    computing the same loss from the gathered sequence gives P times one rank's gradient, which
    averaging the parameters' gradients over the ranks undoes)."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if world != layout.world:
        raise ValueError(f"the layout is for {layout.world} ranks, the group has {world}")
    full = _Gather.apply(x, group, world, rank, dim) if world > 1 else x
    order = layout.order(device=x.device)  # the position held at each place of the gathered sequence
    full = full.index_select(dim, torch.argsort(order))
    return full.narrow(dim, 0, layout.length)


@dataclass(frozen=True)
class ShardedMask:
    """Pass as ``mask=`` to :class:`attnlab.MultiHeadAttention` (or an Encoder block, or
    :func:`attnlab.attend`): the input is this rank's shard of a sequence (``context`` knows every
    shard's positions and key padding), attended over the whole sequence by
    :func:`attnlab.distributed.ring_attend`. The shard rule is a mask over global positions:
    ``rule``, or ``causal`` / ``window``; combining with another mask (``masks.causal() & sharded``)
    adds it to the rule.

    Attributes:
        context: the :class:`RingContext` of this forward.
        causal: ``j <= i``.
        window: ``|i - j| <= window`` (``0 <= i - j <= window`` causal).
        timings: where ring time is added up.
        length: the real length N when the shards were padded past it (positions from N on are
            padding: masked keys, discarded queries), else None.
        rule: any mask over global positions (:mod:`attnlab.masks`), combined with ``causal`` and
            ``window``.
    """

    context: RingContext
    causal: bool = False
    window: int | None = None
    timings: RingTimings | None = None
    length: int | None = None
    rule: object = None

    @property
    def encoding_positions(self) -> torch.Tensor:
        """The positions a positional encoding sees: the positions this rank holds, padding held at
        N - 1 (so that an encoding with a largest position, such as ``learned``, takes padded shards)."""
        pos = self.context.positions[self.context.rank]
        return pos if self.length is None else pos.clamp(max=self.length - 1)

    def positions(self, n: int, device=None) -> torch.Tensor:
        """This rank's positions for a layer's encoding (:attr:`encoding_positions`)."""
        if n != self.context.positions.shape[1]:
            raise ValueError(f"the ring context holds {self.context.positions.shape[1]} positions per "
                             f"rank, the input {n}")
        return self.encoding_positions.to(device)

    def full_rule(self):
        """The rule as one mask over global positions (None: every pair); the same object at every
        call, so that every layer of a forward reuses the ring's plan."""
        from ..core.masks import and_masks

        if "_rule" not in self.__dict__:
            object.__setattr__(self, "_rule", and_masks(rule_of(self.causal, self.window), self.rule))
        return self.__dict__["_rule"]

    def __rand__(self, other):
        return replace(self, rule=other if self.rule is None else self.rule & other)

    __and__ = __rand__


def attend_sharded(mask: ShardedMask, q, k, v, *, score, normalize, score_mod, bias, dropout_p, return_weights):
    """Ring attention of this rank's heads under the rule of the sharded ``mask`` (what
    :func:`attnlab.attend` runs for this kind of mask: registered in :mod:`attnlab.core.spanning`)."""
    if score_mod is not None:
        name = getattr(score_mod, "name", "score_mod")
        raise ValueError(f"the layer's score function {name!r} is built for one process's positions, so a sharded "
                         "sequence cannot carry it: use an input encoding or rope under sequence parallelism, or call "
                         "attnlab.distributed.ring_attend(..., score_mod=...), which calls it with global positions")
    if dropout_p:
        raise ValueError(f"this layer drops attention weights (dropout={dropout_p}) in training, which ring attention "
                         "does not: train with dropout 0 under sequence parallelism (an Encoder's one dropout "
                         "covers its attention)")
    if bias is not None or return_weights:
        raise ValueError("a sharded sequence (mask=ShardedMask) takes self-attention alone: no key, value, bias, "
                         "return_weights or positions (the mask knows every shard's positions)")
    return ring_attend(q, k, v, context=mask.context, mask=mask.full_rule(), score=score, normalize=normalize,
                       timings=mask.timings)


spanning.register(ShardedMask, attend_sharded)


@dataclass
class SequenceParallel:
    """Sequence parallelism for a model: each rank of ``group`` computes 1/P of every sequence.

    Set it on a model with :func:`parallelize`; a backbone that takes it (the ``transformer``
    token backbone) then embeds only this rank's positions, runs every block on its shard with
    ring attention, and gathers the final vectors, so the heads and the loss see the whole
    sequence. Every rank of ``group`` must run the same batch. Average the parameters'
    gradients over the group after ``backward()`` (the training loop does): that gives the
    gradient of one process running the whole sequence.

    Attributes:
        group: the process group of one sequence's shards (None: the default group).
        layout: one of :data:`attnlab.distributed.LAYOUTS`, or ``"auto"``: zig-zag for a causal
            model (balanced), contiguous otherwise.
        pad: pad a length that does not divide into the shards (padding is masked out) instead
            of raising.
        timings: a :class:`RingTimings` that every ring call adds to (None: not measured).
    """

    group: object = None
    layout: str = "auto"
    pad: bool = True
    timings: RingTimings | None = None

    def layout_for(self, length: int, causal: bool) -> tuple[SequenceLayout, int]:
        """The layout of a sequence of ``length`` positions and this rank's index in the group."""
        from .layout import plan_layout

        kind = ("zigzag" if causal else "contiguous") if self.layout == "auto" else self.layout
        return plan_layout(length, dist.get_world_size(self.group), kind, pad=self.pad), dist.get_rank(self.group)


def parallelize(model: torch.nn.Module, sp: SequenceParallel | None) -> torch.nn.Module:
    """Set (or, with None, clear) sequence parallelism on every submodule of ``model`` that
    takes it (an attribute ``sequence_parallel``); ``ValueError`` if none does. Returns ``model``."""
    takers = [m for m in model.modules() if hasattr(type(m), "sequence_parallel")]
    if not takers:
        raise ValueError(f"{type(model).__name__} has no part that computes a shard of a sequence; sequence "
                         "parallelism runs the 'transformer' token backbone")
    for m in takers:
        m.sequence_parallel = sp
    return model
