"""attnlab: self-attention over any vector set, every part interchangeable and checked.

The public API::

    attnlab.attend(q, k, v, score=..., normalize=..., mask=..., bias=...)  -> AttentionResult
    attnlab.MultiHeadAttention(embed_dim, num_heads, score=..., normalize=..., head_mode=...)
    attnlab.masks.causal / window / padding / graph / no_self / and_masks / or_masks
    attnlab.dot / scaled_dot / cosine, attnlab.Additive / Bilinear / Cosine (scores)
    attnlab.softmax / relu / sigmoid (normalisers)
    attnlab.reference_attention (the float64 textbook steps)
    attnlab.positional.create / list / sinusoidal_table (positional encodings by name)
    attnlab.BlockBias (a score bias handed over block by block)
    attnlab.models.Encoder (the Transformer encoder, any encoding and score)
    attnlab.create_attention / list_attention (dense and efficient variants by name)
    attnlab.recurrent.AttentionRNN / LSTMN / create_layer (attention inside RNNs; RNN/CNN baselines)
    attnlab.tasks.create_task / list_tasks, attnlab.training.train / evaluate (the train pipeline)

Shapes follow the legend in :mod:`attnlab.core`.
"""

from importlib.metadata import PackageNotFoundError, version as _version

from . import efficient, masks, models, positional, recurrent, tasks
from .core import (
    Additive,
    AttentionResult,
    Bilinear,
    BlockBias,
    Cosine,
    Dot,
    ScaledDot,
    Score,
    attend,
    cosine,
    create_score,
    dot,
    list_normalizers,
    list_scores,
    plan,
    reference_attention,
    relu,
    scaled_dot,
    sigmoid,
    softmax,
)
from .efficient import create_attention, list_attention
from .layers.multihead import MultiHeadAttention

try:
    __version__ = _version("attnlab")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+unknown"

__all__ = [
    "__version__",
    "masks",
    "positional",
    "models",
    "efficient",
    "recurrent",
    "tasks",
    "create_attention",
    "list_attention",
    "attend",
    "BlockBias",
    "plan",
    "AttentionResult",
    "MultiHeadAttention",
    "reference_attention",
    "Score",
    "Dot",
    "ScaledDot",
    "Cosine",
    "Additive",
    "Bilinear",
    "dot",
    "scaled_dot",
    "cosine",
    "create_score",
    "list_scores",
    "softmax",
    "relu",
    "sigmoid",
    "list_normalizers",
]
