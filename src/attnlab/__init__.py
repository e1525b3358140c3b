"""attnlab: self-attention over any vector set, every part interchangeable and checked.

The public API::

    attnlab.attend(q, k, v, score=..., normalize=..., mask=..., score_mod=..., bias=...)  -> AttentionResult
    attnlab.MultiHeadAttention(embed_dim, num_heads, score=..., normalize=..., head_mode=...)
    attnlab.masks.causal / window / padding / documents / prefix_lm / global_tokens / ... (mask functions; & | ~)
    attnlab.masks.block_map (a mask's tiles: built once, reused; attend computes only those it allows)
    attnlab.score_mods.alibi / softcap / offset_bias / compose (score functions)
    attnlab.dot / scaled_dot / cosine, attnlab.Additive / Bilinear / Cosine (scores)
    attnlab.softmax / relu / sigmoid (normalisers)
    attnlab.reference_attention (the float64 textbook steps)
    attnlab.positional.create / names / sinusoidal_table (positional encodings by name)
    attnlab.models.Encoder (the Transformer encoder, any encoding and score)
    attnlab.efficient.create / names (dense and efficient variants by name)
    attnlab.scores.create / names, attnlab.normalizers.create / names
    attnlab.recurrent.AttentionRNN / LSTMN / create / names (attention inside RNNs; RNN/CNN baselines)
    attnlab.models.create / names (backbones), attnlab.tasks.create / names
    attnlab.training.train / evaluate (the train pipeline)
    attnlab.pretrained.load("all-MiniLM-L6-v2" | folder, attention=...) (BERT-family weights in attnlab's modules)
    import attnlab.integrations.transformers (then attn_implementation="attnlab" / "attnlab:<variant>" in transformers)

Every family is a registry with the same verbs: ``create(name, ...)``, ``names()``, ``register(name)``.

Shapes follow the legend in :mod:`attnlab.core`.
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version

from . import efficient, masks, models, normalizers, positional, pretrained, recurrent, score_mods, scores, tasks
from .core import (
    Additive,
    AttentionResult,
    Bilinear,
    Cosine,
    Dot,
    ScaledDot,
    Score,
    attend,
    backend_for,
    cosine,
    dot,
    reference_attention,
    relu,
    scaled_dot,
    sigmoid,
    softmax,
)
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
    "pretrained",
    "efficient",
    "recurrent",
    "tasks",
    "scores",
    "normalizers",
    "score_mods",
    "attend",
    "backend_for",
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
    "softmax",
    "relu",
    "sigmoid",
]
