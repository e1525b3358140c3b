"""The BERT architecture (BERT, MiniLM, ...) built from attnlab's own modules.

``BertModel`` in Hugging Face's layout (Devlin et al. 2019, https://arxiv.org/abs/1810.04805):

    h^0 = LayerNorm(word[x_i] + position[i] + token_type[t_i])
    h^l = LayerNorm(u + FFN(u)),  u = LayerNorm(h^{l-1} + SelfAttention(h^{l-1}))   (post-norm)

The embedding sum is :class:`BertEmbeddings`; the stack of blocks is an :class:`attnlab.Encoder`
with ``norm_first=False`` and ``positional="none"`` (positions are added in the embeddings), so
every attention variant, score and normaliser of attnlab can replace the trained softmax.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..models.encoder import Encoder, EncoderOutput
from ..validate import is_int, positive_int

__all__ = ["BertConfig", "BertEmbeddings", "BertModel", "PretrainedError", "load_weights", "read_tensors"]


class PretrainedError(ValueError):
    """A model folder attnlab cannot load: a missing file, another architecture, or tensors that do
    not fit (the message names the file or the tensor)."""


SUPPORTED_TYPES = ("bert",)
ACTIVATIONS = {"gelu": "gelu", "relu": "relu"}


@dataclass(frozen=True)
class BertConfig:
    """The fields of a Hugging Face ``config.json`` that define a ``BertModel``."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    pad_token_id: int = 0

    @classmethod
    def from_json(cls, path: str | Path) -> BertConfig:
        """Read and check ``config.json``; raises :class:`PretrainedError` for another architecture
        (naming it) or a BERT variant attnlab does not build (relative positions, another activation)."""
        path = Path(path)
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise PretrainedError(f"{path.parent} has no config.json: not a Hugging Face model folder") from None
        except json.JSONDecodeError as e:
            raise PretrainedError(f"{path} is not valid JSON: {e}") from None
        if not isinstance(raw, dict):
            raise PretrainedError(f"{path} is not a JSON object of model settings")
        kind = raw.get("model_type")
        archs = raw.get("architectures") or []
        if kind not in SUPPORTED_TYPES:
            what = f"model_type {kind!r}" + (f" ({', '.join(archs)})" if archs else "")
            raise PretrainedError(
                f"{path.parent} holds a {what} model; attnlab.pretrained loads the BERT family (model_type 'bert': "
                "BERT, MiniLM, ...); run any other architecture in transformers with attnlab as its attention "
                "(attnlab.integrations.transformers)"
            )
        if raw.get("position_embedding_type", "absolute") != "absolute":
            raise PretrainedError(f"{path}: position_embedding_type {raw['position_embedding_type']!r}; only "
                                  "'absolute' is supported")
        fields = {f: raw[f] for f in cls.__dataclass_fields__ if f in raw and raw[f] is not None}
        missing = [f for f in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                               "intermediate_size")
                   if f not in fields]
        if missing:
            raise PretrainedError(f"{path} lacks {', '.join(missing)}")
        cfg = cls(**fields)
        try:
            check_config(cfg)
        except (ValueError, TypeError) as e:
            raise PretrainedError(f"{path}: {e}") from None
        return cfg


class BertEmbeddings(nn.Module):
    """``LayerNorm(word[x_i] + position[i] + token_type[t_i])``: ``(B, N)`` ids -> ``(B, N, E)``
    (BERT's dropout after it is the :class:`attnlab.Encoder`'s input dropout)."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size, padding_idx=cfg.pad_token_id)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        n = ids.shape[1]
        if n > self.position_embeddings.num_embeddings:
            raise ValueError(f"the input has {n} tokens, but the model has positions for "
                             f"{self.position_embeddings.num_embeddings}")
        pos = torch.arange(n, device=ids.device)
        types = torch.zeros_like(ids) if token_type_ids is None else token_type_ids
        # the order of the sum is Hugging Face's (word + type, then + position): bitwise the same in float32
        x = self.word_embeddings(ids) + self.token_type_embeddings(types) + self.position_embeddings(pos)
        return self.norm(x)


class BertModel(nn.Module):
    """A BERT encoder in attnlab modules: :class:`BertEmbeddings` and an :class:`attnlab.Encoder`.

    Args:
        cfg: the architecture (:meth:`BertConfig.from_json`).
        attention, attention_options: the attention of every block by name (``"dense"``, the
            trained model's own, or any :func:`attnlab.efficient.names` variant with its options).
        score, score_options, normalize: the dense layer's score and normaliser (the trained model
            used ``"scaled_dot"`` and ``"softmax"``).
        dropout: dropout everywhere (0: inference).
    """

    def __init__(
        self,
        cfg: BertConfig,
        *,
        attention: str = "dense",
        attention_options: dict | None = None,
        score: str = "scaled_dot",
        score_options: dict | None = None,
        normalize: str = "softmax",
        dropout: float = 0.0,
    ):
        super().__init__()
        check_config(cfg)
        self.config = cfg
        self.embeddings = BertEmbeddings(cfg)
        self.encoder = Encoder(
            cfg.hidden_size,
            cfg.num_attention_heads,
            cfg.num_hidden_layers,
            ff_dim=cfg.intermediate_size,
            dropout=dropout,
            norm_first=False,
            activation=ACTIVATIONS[cfg.hidden_act],
            score=score,
            score_options=score_options,
            normalize=normalize,
            layer_norm_eps=cfg.layer_norm_eps,
            attention=attention,
            attention_options=attention_options,
            max_len=cfg.max_position_embeddings,
        )

    def forward(
        self,
        ids: torch.Tensor,
        *,
        padding: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        return_weights: bool = False,
        return_hidden: bool = False,
    ) -> EncoderOutput:
        """Encode token ids ``(B, N)``.

        Args:
            padding: bool ``(B, N)``, True = a real token (Hugging Face's ``attention_mask``);
                padded keys get no attention.
            token_type_ids: ``(B, N)`` segment ids (default all 0).
            return_weights: also return each block's ``(B, H, N, N)`` weights (exact attention only).
            return_hidden: also return the hidden states: the embeddings and every block's output.

        Returns:
            :class:`attnlab.models.encoder.EncoderOutput` (``output``, ``weights``, ``hidden``).
        """
        if ids.dim() != 2:
            raise ValueError(f"ids must have shape (B, N), got {tuple(ids.shape)}")
        mask = None if padding is None else padding.bool()[:, None, None, :]  # (B, 1, 1, N): the keys that are real
        return self.encoder(self.embeddings(ids, token_type_ids), mask=mask, return_weights=return_weights,
                            return_hidden=return_hidden)


def read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """The tensors of ``model.safetensors`` (preferred) or ``pytorch_model.bin`` in ``folder``."""
    st, pt = folder / "model.safetensors", folder / "pytorch_model.bin"
    if st.exists():
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(st))
        except (SafetensorError, OSError) as e:
            raise PretrainedError(f"{st} could not be read: {e}") from None
    if pt.exists():
        try:
            return torch.load(pt, map_location="cpu", weights_only=True)
        except Exception as e:  # torch raises several types for a damaged pickle
            raise PretrainedError(f"{pt} could not be read: {e}") from None
    raise PretrainedError(f"{folder} has neither model.safetensors nor pytorch_model.bin")


def _hf_names(cfg: BertConfig) -> dict[str, str]:
    """Our parameter name -> Hugging Face ``BertModel``'s."""
    names = {
        "embeddings.word_embeddings.weight": "embeddings.word_embeddings.weight",
        "embeddings.position_embeddings.weight": "embeddings.position_embeddings.weight",
        "embeddings.token_type_embeddings.weight": "embeddings.token_type_embeddings.weight",
        "embeddings.norm.weight": "embeddings.LayerNorm.weight",
        "embeddings.norm.bias": "embeddings.LayerNorm.bias",
    }
    parts = {
        "attn.q_proj": "attention.self.query",
        "attn.k_proj": "attention.self.key",
        "attn.v_proj": "attention.self.value",
        "attn.out_proj": "attention.output.dense",
        "norm1": "attention.output.LayerNorm",
        "ff.linear1": "intermediate.dense",
        "ff.linear2": "output.dense",
        "norm2": "output.LayerNorm",
    }
    for i in range(cfg.num_hidden_layers):
        for ours, theirs in parts.items():
            for p in ("weight", "bias"):
                names[f"encoder.layers.{i}.{ours}.{p}"] = f"encoder.layer.{i}.{theirs}.{p}"
    return names


_OLD_NORM = re.compile(r"LayerNorm\.(gamma|beta)$")


def load_weights(model: BertModel, tensors: dict[str, torch.Tensor], source: str = "the checkpoint") -> list[str]:
    """Copy Hugging Face ``BertModel`` tensors into ``model``; returns the names of our parameters
    that the checkpoint does not provide (a swapped-in variant's own, e.g. Linformer's projections).

    Accepts the bare layout and the ``bert.`` prefix of task models, and the old ``gamma`` /
    ``beta`` LayerNorm names. Raises :class:`PretrainedError` naming a missing tensor or one whose
    shape differs.
    """
    fixed = {}
    for name, t in tensors.items():
        name = _OLD_NORM.sub(lambda m: "LayerNorm." + {"gamma": "weight", "beta": "bias"}[m.group(1)], name)
        fixed[name.removeprefix("bert.")] = t
    own = model.state_dict()
    loaded = {}
    for ours, theirs in _hf_names(model.config).items():
        if theirs not in fixed:
            raise PretrainedError(f"{source} has no tensor {theirs!r} (needed for {ours})")
        t = fixed[theirs]
        if tuple(t.shape) != tuple(own[ours].shape):
            raise PretrainedError(f"{source}: tensor {theirs!r} has shape {tuple(t.shape)}, the model expects "
                                  f"{tuple(own[ours].shape)}")
        loaded[ours] = t
    result = model.load_state_dict(loaded, strict=False)
    return sorted(k for k in result.missing_keys)


def check_config(cfg: BertConfig) -> None:
    """Positive integer sizes, heads that divide the width, a padding id inside the vocabulary, a
    known activation; ``ValueError`` naming the field otherwise."""
    for f in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
              "max_position_embeddings", "type_vocab_size"):
        positive_int(f, getattr(cfg, f))
    if cfg.hidden_size % cfg.num_attention_heads:
        raise ValueError(f"hidden_size {cfg.hidden_size} is not divisible by num_attention_heads "
                         f"{cfg.num_attention_heads}")
    if not is_int(cfg.pad_token_id) or not 0 <= cfg.pad_token_id < cfg.vocab_size:
        raise ValueError(f"pad_token_id must be in 0 .. {cfg.vocab_size - 1}, got {cfg.pad_token_id!r}")
    if cfg.hidden_act not in ACTIVATIONS:
        raise ValueError(f"hidden_act {cfg.hidden_act!r}; supported: {', '.join(ACTIVATIONS)}")
    if not isinstance(cfg.layer_norm_eps, (int, float)) or cfg.layer_norm_eps <= 0:
        raise ValueError(f"layer_norm_eps must be a positive number, got {cfg.layer_norm_eps!r}")
