"""The Transformer encoder: self-attention and a feed-forward network, alternating, with residuals."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from ..core.attend import AttentionResult
from ..core.masks import causal as causal_mask
from ..core.masks import positions_of
from ..layers.feedforward import ACTIVATIONS, FeedForward
from ..positional.base import PositionalEncoding, check_positions, kind_of, positions_for
from ..positional.base import create as create_positional
from ..validate import ArgumentTypeError, positive_int

__all__ = ["Encoder", "EncoderCache", "EncoderConfig", "EncoderLayer", "EncoderOutput"]


@dataclass(frozen=True)
class EncoderConfig:
    """Everything that defines an :class:`Encoder`, serialisable with ``dataclasses.asdict``.

    Attributes:
        embed_dim: E. num_heads: H. num_layers: the number of blocks.
        ff_dim: the feed-forward hidden width (default 4 E).
        dropout: on attention weights, the feed-forward hidden layer and each residual branch.
        norm_first: pre-norm (LayerNorm before each sub-layer, and a final LayerNorm) or
            post-norm (after each residual sum, as in the 2017 paper).
        activation: ``"gelu"`` or ``"relu"``.
        score, score_options, normalize, head_mode: as for :class:`attnlab.MultiHeadAttention`.
        positional, positional_options, max_len: the positional encoding by name (see
            :func:`attnlab.positional.create`); one encoding shared by all blocks.
        layer_norm_eps: LayerNorm's epsilon.
        attention, attention_options: the attention by name (:func:`attnlab.efficient.names`;
            ``"dense"`` is :class:`attnlab.MultiHeadAttention` with ``score``, ``normalize`` and
            ``head_mode``, as is every variant whose declared causal form is a mask; any other
            name is an efficient variant created with ``attention_options``, ``max_len`` and the
            encoding, and ignores the score options). Variants registered later work unchanged.
        causal: every block is causal (a variant causal by a mask, exact attention: the causal
            mask is combined with the caller's; the others: created with ``causal=True``).
        num_kv_heads: G key / value heads per block (grouped-query attention; None: H).
    """

    embed_dim: int
    num_heads: int
    num_layers: int
    ff_dim: int | None = None
    dropout: float = 0.0
    norm_first: bool = True
    activation: str = "gelu"
    score: str = "scaled_dot"
    score_options: dict | None = None
    normalize: str = "softmax"
    head_mode: str = "split"
    positional: str = "none"
    positional_options: dict | None = None
    max_len: int | None = None
    layer_norm_eps: float = 1e-5
    attention: str = "dense"
    attention_options: dict | None = None
    causal: bool = False
    num_kv_heads: int | None = None


@dataclass
class EncoderOutput:
    """What an :class:`Encoder` returns whatever the flags.

    Attributes:
        output: ``(B, N, E)``.
        weights: one ``(B, H, N, N)`` attention-weight tensor per block when asked, else None.
        hidden: when asked, the ``(B, N, E)`` states entering the first block, then each block's
            output (before a pre-norm encoder's final LayerNorm), else None.
    """

    output: torch.Tensor
    weights: list[torch.Tensor] | None = None
    hidden: list[torch.Tensor] | None = None


@dataclass
class EncoderCache:
    """What a causal :class:`Encoder` keeps for decoding: one cache per block (each block's
    :meth:`attnlab.MultiHeadAttention.new_cache`) and the number of tokens seen.

    Attributes:
        layers: the blocks' caches. seen: tokens written so far (the next token's position).
    """

    layers: list
    seen: int = 0

    def nbytes(self) -> int:
        """Bytes held by every block's cache."""
        return sum(c.nbytes() for c in self.layers)


def causal_by_mask(attention: str) -> bool:
    """Whether the variant ``attention`` is made causal by a causal mask: its declared causal form
    (:attr:`attnlab.layers.step.Capabilities.causal`) is ``"mask"`` (exact attention that takes any
    mask and the score options: ``dense``, ``dense_naive``); else it is given ``causal=True``."""
    from .. import efficient

    return efficient.capabilities(attention).causal == "mask"


def make_attention(cfg: EncoderConfig, positional: PositionalEncoding | None) -> nn.Module:
    """The self-attention module of one block of ``cfg``: a variant causal by a mask
    (:func:`causal_by_mask`: ``"dense"``, :class:`attnlab.MultiHeadAttention`, or ``"dense_naive"``,
    the same attention with its weights materialised) with the score options, else the variant
    by name with ``attention_options`` (and ``causal=True`` for a causal model)."""
    from .. import efficient

    if causal_by_mask(cfg.attention):
        if cfg.attention_options:
            raise ValueError(f"attention_options apply to efficient variants; the {cfg.attention} layer takes "
                             "score/normalize/head_mode")
        return efficient.create(cfg.attention, embed_dim=cfg.embed_dim, num_heads=cfg.num_heads, score=cfg.score,
                                score_options=cfg.score_options, normalize=cfg.normalize, head_mode=cfg.head_mode,
                                dropout=cfg.dropout, positional=positional, num_kv_heads=cfg.num_kv_heads)
    opts = dict(cfg.attention_options or {})
    opts.setdefault("max_len", cfg.max_len)
    if cfg.num_kv_heads is not None:
        opts["num_kv_heads"] = cfg.num_kv_heads
    if cfg.causal:
        opts["causal"] = True
    return efficient.create(cfg.attention, embed_dim=cfg.embed_dim, num_heads=cfg.num_heads, positional=positional,
                            **opts)


class EncoderLayer(nn.Module):
    """One block: ``x + SelfAttention(x)`` then ``x + FFN(x)``, each with LayerNorm and dropout.

    Pre-norm: ``x = x + drop(SA(LN(x)))``; post-norm: ``x = LN(x + drop(SA(x)))`` (likewise for
    the FFN). Input and output ``(B, N, E)``.
    """

    def __init__(self, cfg: EncoderConfig, positional: PositionalEncoding | None):
        super().__init__()
        self.norm_first = cfg.norm_first
        self.attn = make_attention(cfg, positional)
        self.causal_mask = cfg.causal and causal_by_mask(cfg.attention)
        self.ff = FeedForward(cfg.embed_dim, cfg.ff_dim or 4 * cfg.embed_dim, activation=cfg.activation,
                              dropout=cfg.dropout)
        self.norm1 = nn.LayerNorm(cfg.embed_dim, eps=cfg.layer_norm_eps)
        self.norm2 = nn.LayerNorm(cfg.embed_dim, eps=cfg.layer_norm_eps)
        self.drop1 = nn.Dropout(cfg.dropout)
        self.drop2 = nn.Dropout(cfg.dropout)

    def forward(self, x, *, mask=None, positions=None, return_weights=False, cache=None) -> AttentionResult:
        """``(B, N, E)`` -> :class:`attnlab.AttentionResult` (output ``(B, N, E)``, weights or None).
        ``positions``: the tokens' positions for the attention's encoding (None: the mask's or
        ``0..N-1``). With ``cache`` (this block's), ``x`` holds new tokens and ``mask`` their key
        padding."""
        where = {"cache": cache} if cache is not None else {"positions": positions, "key_positions": positions}
        if self.norm_first:
            res = self.attn(self.norm1(x), mask=mask, return_weights=return_weights, **where)
            x = x + self.drop1(res.output)
            x = x + self.drop2(self.ff(self.norm2(x)))
        else:
            res = self.attn(x, mask=mask, return_weights=return_weights, **where)
            x = self.norm1(x + self.drop1(res.output))
            x = self.norm2(x + self.drop2(self.ff(x)))
        return AttentionResult(x, res.weights)


class Encoder(nn.Module):
    """A stack of :class:`EncoderLayer` blocks over a set of vectors, with any positional encoding.

    The encoder of Vaswani et al. 2017 (section 3.1) with every part of attnlab selectable
    by name. An input encoding (sinusoidal, learned, rnn, floater) is added once to the input
    vectors; a bias or rotation encoding (relative, alibi, rope) acts inside every block's
    attention, one instance shared by all blocks. Without one (``positional="none"``) the
    encoder is permutation-equivariant: permuting the input vectors permutes the outputs.

    Args:
        embed_dim, num_heads, num_layers, and keyword options: see :class:`EncoderConfig`.
    """

    options_target = EncoderConfig  # its **options (for the list of valid options in errors)

    def __init__(self, embed_dim: int, num_heads: int, num_layers: int, **options):
        super().__init__()
        valid = [f.name for f in dataclasses.fields(EncoderConfig)
                 if f.name not in ("embed_dim", "num_heads", "num_layers")]
        unknown = set(options) - set(valid)
        if unknown:
            raise ArgumentTypeError(f"unknown Encoder option(s): {', '.join(sorted(unknown))}; it takes "
                                    f"{', '.join(sorted(valid))}")
        cfg = EncoderConfig(embed_dim=embed_dim, num_heads=num_heads, num_layers=num_layers, **options)
        positive_int("num_layers", num_layers)
        positive_int("embed_dim", embed_dim)
        # before the encoding, which sees one head's width
        if positive_int("num_heads", num_heads) and embed_dim % num_heads:
            raise ValueError(f"embed_dim must be divisible by num_heads, got embed_dim={embed_dim} and "
                             f"num_heads={num_heads}")
        if cfg.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {cfg.activation!r}")
        if not isinstance(cfg.positional, str):
            raise ArgumentTypeError("positional must be a name (see attnlab.positional.names()), got "
                                    f"{type(cfg.positional).__name__}")
        self.config = cfg
        kind = kind_of(cfg.positional)
        head_dim = embed_dim // num_heads
        pe = create_positional(
            cfg.positional,
            dim=head_dim if kind == "rotation" else embed_dim,
            num_heads=num_heads,
            max_len=cfg.max_len,
            **(cfg.positional_options or {}),
        )
        self.positional = pe
        shared = pe if kind in ("bias", "rotation") else None
        self.layers = nn.ModuleList(EncoderLayer(cfg, shared) for _ in range(num_layers))
        self.input_dropout = nn.Dropout(cfg.dropout)
        self.final_norm = nn.LayerNorm(embed_dim, eps=cfg.layer_norm_eps) if cfg.norm_first else nn.Identity()

    @classmethod
    def from_config(cls, cfg: EncoderConfig) -> Encoder:
        """An encoder built from a config (as stored with a checkpoint)."""
        d = dataclasses.asdict(cfg)
        return cls(d.pop("embed_dim"), d.pop("num_heads"), d.pop("num_layers"), **d)

    def new_cache(self, *, window: int | None = None, sinks: int = 0, positions: str = "absolute") -> EncoderCache:
        """An empty cache for decoding with a causal encoder (``causal=True``): every block's
        (:meth:`attnlab.MultiHeadAttention.new_cache`; ``window``, ``sinks`` and ``positions``
        bound the dense blocks' caches, StreamingLLM's way with ``positions="cache"``: rotation
        and bias encodings then use places in the cache, while an input encoding is still added
        at the absolute position, so ``learned`` stops at its ``max_len``)."""
        if not self.config.causal:
            raise ValueError("cached decoding needs a causal encoder (causal=True): a later token would change earlier "
                             "outputs")
        return EncoderCache([layer.attn.new_cache(window=window, sinks=sinks, positions=positions)
                             for layer in self.layers])

    def forward(
        self,
        x: torch.Tensor,
        *,
        mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        return_weights: bool = False,
        return_hidden: bool = False,
        cache: EncoderCache | None = None,
    ) -> EncoderOutput:
        """Encode ``x`` ``(B, N, E)``.

        Args:
            x: the input vectors ``(B, N, E)``.
            mask: True = may attend (padding, windows, ...): a mask function (:mod:`attnlab.masks`),
                a block map or a bool tensor broadcastable to ``(B, H, N, N)``; a causal encoder
                adds the causal mask. :class:`attnlab.masks.Documents`: packed documents, whose
                positions restart in every document; :class:`attnlab.distributed.ShardedMask`:
                ``x`` is this rank's shard of a sequence sharded across a process group (every
                block attends over the whole sequence by ring attention).
            positions: integer ``(N,)`` (or ``(B, N)``) positions (default: the mask's, else ``0..N-1``).
            return_weights: also return each block's ``(B, H, N, N)`` weights.
            return_hidden: also return the hidden states (:class:`EncoderOutput`).
            cache: decode with a cache from :meth:`new_cache`: ``x`` holds the new tokens, which
                continue the cached ones (their positions follow), and ``mask`` is their key
                padding ``(B, 1, 1, N)`` or None.
        """
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.config.embed_dim:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"Encoder expects inputs of shape (B, N, {self.config.embed_dim}), got {got}")
        n = x.shape[1]
        if cache is not None:
            if positions is not None:
                raise ValueError("with a cache the positions come from it: pass no positions")
            positions = torch.arange(cache.seen, cache.seen + n, device=x.device)
        elif positions is None:
            positions = positions_of(mask, n, x.device)
            positions = positions_for(n, device=x.device) if positions is None else positions
        else:
            positions = check_positions(positions, n, "positions").to(x.device)
        if self.config.causal and cache is None and self.layers and self.layers[0].causal_mask:
            mask = causal_mask() & mask if mask is not None else causal_mask()
        x = self.input_dropout(self.positional.add_to(x, positions))
        weights = [] if return_weights else None
        hidden = [x] if return_hidden else None
        for i, layer in enumerate(self.layers):
            extra = {} if cache is None else {"cache": cache.layers[i]}
            res = layer(x, mask=mask, positions=None if cache is not None else positions, return_weights=return_weights,
                        **extra)
            x = res.output
            if weights is not None:
                weights.append(res.weights)
            if hidden is not None:
                hidden.append(x)
        if cache is not None:
            cache.seen += n
        return EncoderOutput(self.final_norm(x), weights, hidden)
