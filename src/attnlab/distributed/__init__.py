"""Sequence parallelism on torch.distributed: a sequence sharded across the ranks of a process
group, attended exactly by ring attention (forward and backward), on gloo (CPU) or nccl (GPU).

* :func:`ring_attend` — the functional ring: this rank's q, k, v shards in, this rank's output
  out, equal to :func:`attnlab.attend` over the whole sequence;
* :func:`plan_layout` / :class:`SequenceLayout` — how positions are cut across ranks
  (contiguous, zig-zag, striped); :func:`shard` and :func:`gather` move between the whole
  sequence and a rank's shard;
* :class:`ShardedMask` — the ``mask=`` that makes :class:`attnlab.MultiHeadAttention` and the
  Encoder's blocks attend over the whole sharded sequence;
* :class:`SequenceParallel` — the model-level switch (:func:`parallelize`): a backbone built
  for whole sequences computes each rank's shard only.

The design for many machines is in the sequence-parallelism guide (``docs/guides/sequence-parallelism.md``).
"""

from .context import RingContext, RingTimings
from .layout import LAYOUTS, SequenceLayout, plan_layout
from .ring import ring_attend
from .sequence import SequenceParallel, ShardedMask, gather, parallelize, shard

__all__ = ["LAYOUTS", "RingContext", "RingTimings", "SequenceLayout", "SequenceParallel", "ShardedMask", "gather",
           "parallelize", "plan_layout", "ring_attend", "shard"]
