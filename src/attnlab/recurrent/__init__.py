"""Attention inside recurrent networks, and the layers of the CNN / RNN / self-attention comparison.

* :class:`AttentionRNN` — the SimpleRNN with self-attention of the lecture;
* :class:`LSTMN` — the Long Short-Term Memory-Network (Cheng, Dong & Lapata 2016);
* :func:`create` / :func:`names` — ``rnn``, ``lstm``, ``cnn``, ``self_attention``,
  ``attention_rnn``, ``lstmn`` with one interface ``(B, N, d) -> (B, N, d)``.
"""

from .cells import LSTMN, AttentionRNN, RecurrentOutput, check_prefix_mask
from .layers import LAYERS, SequenceLayer, create, names, register

__all__ = [
    "AttentionRNN",
    "LSTMN",
    "RecurrentOutput",
    "check_prefix_mask",
    "SequenceLayer",
    "create",
    "names",
    "register",
    "LAYERS",
]
