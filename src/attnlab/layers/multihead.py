"""Multi-head attention with interchangeable scores and normalisers, in both head formulations."""

from __future__ import annotations

import math
from typing import Callable, Literal

import torch
import torch.nn.functional as F
from torch import nn

from ..core.attend import AttentionResult, attend, check_mask_or_bias
from ..core.masks import Documents, key_padding_flags
from .cache import KVCache, RecurrentState, StaticKV
from ..core.normalize import resolve_normalizer, softmax
from ..core import scores as score_registry
from ..core.scores import ScaledDot, Score, resolve_score
from ..distributed.ring import ring_attend
from ..distributed.sequence import ShardedMask
from ..positional.base import PositionalEncoding, check_positions, create as create_positional, kind_of
from ..validate import positive_int, probability

__all__ = ["MultiHeadAttention"]

HeadMode = Literal["split", "project"]


def silence_padding(query: torch.Tensor, key: torch.Tensor | None, value: torch.Tensor | None, mask):
    """Replace NaN and infinities by 0 in the input rows that ``mask`` hides from every query (padding).

    A hidden key never reaches an output, but a NaN in its row would still reach gradients: in
    self-attention the padded rows are queries too, their scores are NaN, and autograd multiplies
    their zero upstream gradient by NaN on the way back to the valid keys and to the weights. With
    those entries zeroed, a sequence's outputs and gradients do not depend on what its padding
    holds. Finite rows are left as they are, so outputs (padded rows included) are unchanged for
    finite inputs, bit for bit. Cross-attention cleans the key and value rows; the query rows of
    cross-attention carry no padding information in the mask. Returns the inputs unchanged when
    nothing is hidden (or the mask is not a bool tensor).
    """
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or not 2 <= mask.dim() <= 4:
        return query, key, value
    source = query if key is None else key
    if source.dim() != 3 or mask.shape[-1] != source.shape[1]:
        return query, key, value  # a shape error: project's checks name it
    hidden = ~mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape)).any(-2).any(1)  # (B or 1, M): no query sees it
    if hidden.shape[0] not in (1, source.shape[0]):
        return query, key, value  # a shape error: project's checks name it
    if hidden.device.type == "cpu" and not hidden.any():
        return query, key, value  # nothing hidden: no copy (on an accelerator the check would stall the stream)

    def clean(t: torch.Tensor) -> torch.Tensor:
        return t.masked_fill(hidden[..., None] & ~torch.isfinite(t), 0.0)

    if key is None and value is None:
        return clean(query), None, None
    return query, clean(source), None if value is None else clean(value)


class MultiHeadAttention(nn.Module):
    """Multi-head attention ``concat(head_1, ..., head_H) W^o``, ``head_h = attend(Q_h, K_h, V_h)``.

    Vaswani et al. 2017 (https://arxiv.org/abs/1706.03762), section 3.2.2, with any score and
    normaliser of :func:`attnlab.attend`. Two formulations of the heads:

    * ``head_mode="split"`` (the common form, ``torch.nn.MultiheadAttention``'s): one projection
      ``Q = X W^q`` of width E, split into H heads of width D = E / H.
    * ``head_mode="project"`` (the lecture notes' form): ``q^i = W^q a^i`` of width E, then a
      second projection per head, ``q^{i,h} = W^{q,h} q^i`` of width D; likewise for k and v.

    Both end with the output transform ``W^o``.

    Args:
        embed_dim: E, the width of the queries and of the output.
        num_heads: H; must divide E.
        kdim: width of the keys' input (default E); vdim: of the values' input (default E).
        bias: learn additive biases in the input and output projections.
        score: a name from :func:`attnlab.scores.names` (learnable scores get one set of weights
            per head), a :class:`attnlab.Score` module or a callable ``(q, k) -> scores``.
        score_options: keyword options for a score built by name (``temperature=``, ``learnable=``,
            ``hidden_dim=``).
        normalize: ``"softmax"``, ``"relu"``, ``"sigmoid"`` or a callable ``(scores, mask) -> weights``.
        head_mode: ``"split"`` or ``"project"``.
        dropout: dropout on the attention weights, in training mode only.
        positional: a name from :func:`attnlab.positional.names` or a
            :class:`attnlab.positional.PositionalEncoding`, applied the way it acts: input
            encodings are added to the query, key and value inputs before the projections, bias
            encodings are added to every head's scores, ``rope`` rotates each head's q and k.
            ``None`` (default) or ``"none"``: no positional information.
        positional_options: keyword options for an encoding given by name.
        max_len: the longest sequence, for encodings bounded by it (``learned``).
        num_kv_heads: G, the key / value heads (default H): grouped-query attention (Ainslie et
            al. 2023, https://arxiv.org/abs/2305.13245), each group of H / G query heads sharing
            one key / value head; G = 1 is multi-query attention (Shazeer 2019). G must divide H.
            Softmax over a plain dot score runs on PyTorch's fused kernel with the G heads as
            they are; other paths (and the efficient variants) see them repeated to H.
    """

    uses_keys: bool = True
    """False for a variant whose keys come from the queries (Reformer): no key projection is computed."""

    grouped_kv: bool = True
    """True where :meth:`attend_heads` takes G < H key / value heads itself (:func:`attnlab.attend`
    does); a variant without it is handed them repeated to H heads."""

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        kdim: int | None = None,
        vdim: int | None = None,
        bias: bool = True,
        score: str | Score | Callable = "scaled_dot",
        score_options: dict | None = None,
        normalize: str | Callable = "softmax",
        head_mode: HeadMode = "split",
        dropout: float = 0.0,
        positional: str | PositionalEncoding | None = None,
        positional_options: dict | None = None,
        max_len: int | None = None,
        num_kv_heads: int | None = None,
    ):
        super().__init__()
        e = positive_int("embed_dim", embed_dim)
        h = positive_int("num_heads", num_heads)
        if e % h:
            raise ValueError(f"embed_dim must be divisible by num_heads, got embed_dim={e} and num_heads={h}")
        g = h if num_kv_heads is None else positive_int("num_kv_heads", num_kv_heads)
        if h % g:
            raise ValueError(f"num_kv_heads must divide num_heads, got num_kv_heads={g} and num_heads={h}")
        if g != h and not self.uses_keys:
            raise ValueError(f"{type(self).__name__} derives its keys from the queries: it takes no num_kv_heads")
        if head_mode not in ("split", "project"):
            raise ValueError(f"head_mode must be 'split' or 'project', got {head_mode!r}")
        probability("dropout", dropout)
        self.embed_dim, self.num_heads, self.head_dim, self.num_kv_heads = e, h, e // h, g
        kv = g * (e // h)  # the width of the keys' and values' projections
        self.kdim = e if kdim is None else positive_int("kdim", kdim)
        self.vdim = e if vdim is None else positive_int("vdim", vdim)
        self.head_mode = head_mode
        self.dropout = float(dropout)
        self.normalize = normalize
        resolve_normalizer(normalize)  # fail early on an unknown name
        if isinstance(score, str):
            self.score = score_registry.create(score, head_dim=self.head_dim, num_heads=h, **(score_options or {}))
        else:
            if score_options:
                raise TypeError("score_options apply only to a score given by name")
            self.score = resolve_score(score)
        self.score_name = score if isinstance(score, str) else type(self.score).__name__
        self.positional = self._make_positional(positional, positional_options, max_len)
        self.q_proj = nn.Linear(e, e, bias=bias)
        self.k_proj = nn.Linear(self.kdim, kv if head_mode == "split" else e, bias=bias)
        self.v_proj = nn.Linear(self.vdim, kv if head_mode == "split" else e, bias=bias)
        self.out_proj = nn.Linear(e, e, bias=bias)
        if head_mode == "project":
            # W^{q,h}: (H, D, E), the second, per-head projection of the lecture notes
            self.head_q = nn.Parameter(torch.empty(h, self.head_dim, e))
            self.head_k = nn.Parameter(torch.empty(g, self.head_dim, e))
            self.head_v = nn.Parameter(torch.empty(g, self.head_dim, e))
        self.reset_parameters()

    def _make_positional(self, positional, options, max_len) -> PositionalEncoding | None:
        if positional is None:
            if options:
                raise TypeError("positional_options given without a positional encoding")
            return None
        if isinstance(positional, str):
            kind = kind_of(positional)
            dim = self.head_dim if kind == "rotation" else self.embed_dim
            pe = create_positional(positional, dim=dim, num_heads=self.num_heads, max_len=max_len, **(options or {}))
        elif isinstance(positional, PositionalEncoding):
            if options:
                raise TypeError("positional_options apply only to an encoding given by name")
            pe = positional
        else:
            raise TypeError(f"positional must be a name or a PositionalEncoding, got {type(positional).__name__}")
        if pe.kind == "none":
            return None
        if pe.kind == "input" and (pe.dim != self.embed_dim or self.kdim != self.embed_dim or self.vdim != self.embed_dim):
            raise ValueError(
                f"the {pe.name!r} encoding adds width-{pe.dim} vectors to the inputs, but the inputs have widths "
                f"query {self.embed_dim}, key {self.kdim}, value {self.vdim}"
            )
        if pe.kind == "rotation" and pe.dim != self.head_dim:
            raise ValueError(f"the {pe.name!r} encoding rotates width-{pe.dim} vectors, but the head width is {self.head_dim}")
        if pe.kind == "bias" and pe.num_heads != self.num_heads:
            raise ValueError(f"the {pe.name!r} encoding has {pe.num_heads} heads, this layer {self.num_heads}")
        return pe

    def reset_parameters(self) -> None:
        """Xavier-uniform projections and zero biases, as ``torch.nn.MultiheadAttention``."""
        for lin in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            nn.init.xavier_uniform_(lin.weight)
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)
        if self.head_mode == "project":
            bound = 1.0 / math.sqrt(self.embed_dim)
            for w in (self.head_q, self.head_k, self.head_v):
                nn.init.uniform_(w, -bound, bound)

    def extra_repr(self) -> str:
        return (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, score={self.score_name!r}, "
            f"normalize={self.normalize!r}, head_mode={self.head_mode!r}, dropout={self.dropout}"
            + ("" if self.num_kv_heads == self.num_heads else f", num_kv_heads={self.num_kv_heads}")
            + ("" if self.positional is None else f", positional={self.positional.name!r}")
        )

    def positions(self, n: int, m: int, positions=None, key_positions=None, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        """The query and key positions a forward pass uses: given, or by default keys at
        ``0..M-1`` and queries ending at the last key (``M-N..M-1``; ``0..N-1`` when N > M)."""
        kp = torch.arange(m, device=device) if key_positions is None else check_positions(key_positions, m, "key_positions").to(device)
        if positions is None:
            qp = torch.arange(max(m - n, 0), max(m - n, 0) + n, device=device)
        else:
            qp = check_positions(positions, n, "positions").to(device)
        return qp, kp

    def _check_input(self, name: str, x, width: int, batch: int | None) -> None:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of shape (B, N, {width}), got {type(x).__name__}")
        if x.dim() != 3:
            raise ValueError(f"{name} must have rank 3, shape (B, N, {width}); got shape {tuple(x.shape)}")
        if x.shape[-1] != width:
            raise ValueError(f"{name} must have last dimension {width}, got shape {tuple(x.shape)}")
        if batch is not None and x.shape[0] != batch:
            raise ValueError(f"{name} has batch size {x.shape[0]}, but query has {batch}")

    def _heads(self, x: torch.Tensor, proj: nn.Linear, head_w: torch.Tensor | None, heads: int | None = None) -> torch.Tensor:
        b, n, _ = x.shape
        x = proj(x)  # (B, N, E), or (B, N, G D) for grouped keys / values
        if head_w is None:
            return x.view(b, n, heads or self.num_heads, self.head_dim).transpose(1, 2)  # (B, H|G, N, D)
        return torch.einsum("bne,hde->bhnd", x, head_w)  # q^{i,h} = W^{q,h} q^i: (B, H|G, N, D)

    def _self_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Self-attention's Q, K, V in one product ``x [W^q; W^k; W^v]^T``: q ``(B, H, N, D)``,
        k and v ``(B, G, N, D)``."""
        b, n, _ = x.shape
        projs = [self.q_proj, self.k_proj, self.v_proj] if self.uses_keys else [self.q_proj, self.v_proj]
        w, bias = self._fused_weights(projs)
        out = F.linear(x, w, bias)
        if self.num_kv_heads != self.num_heads:  # grouped: q of H heads, k and v of G
            q, k, v = out.split([self.embed_dim, self.k_proj.out_features, self.v_proj.out_features], dim=-1)
            g = self.num_kv_heads
            return (q.view(b, n, self.num_heads, self.head_dim).transpose(1, 2),
                    k.view(b, n, g, self.head_dim).transpose(1, 2), v.view(b, n, g, self.head_dim).transpose(1, 2))
        heads = out.view(b, n, len(projs), self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)  # (B, H, N, D) each
        if not self.uses_keys:  # a variant that derives its keys from the queries
            return heads[0], heads[0], heads[1]
        return heads

    def _fused_weights(self, projs: list) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``[W^q; W^k; W^v]`` ((3E, E), (E + 2 G D, E) grouped, or (2E, E) without keys) and its
        bias. Without gradients (inference, decoding) it is kept while the weights are unchanged
        (same storage, same version), so a decoding step does not copy the weights again. Writes
        through ``.data`` bypass the version counter: write to the parameters themselves (under
        ``torch.no_grad()``), as optimisers and ``load_state_dict`` do."""
        tensors = [t for p in projs for t in (p.weight, p.bias) if t is not None]
        key = tuple((t.data_ptr(), t._version, t.dtype, t.device) for t in tensors)
        memo = self.__dict__.get("_fused_memo")
        if torch.is_grad_enabled():
            self.__dict__.pop("_fused_memo", None)  # training: nothing kept (the weights change at every step)
        elif memo is not None and memo[0] == key:
            return memo[1], memo[2]
        w = torch.cat([p.weight for p in projs])
        bias = None if projs[0].bias is None else torch.cat([p.bias for p in projs])
        if not torch.is_grad_enabled():  # the detached views keep the storages alive: no new tensor can reuse their addresses
            self.__dict__["_fused_memo"] = (key, w, bias, [t.detach() for t in tensors])
        return w, bias

    def repeat_kv(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Grouped keys and values ``(B, G, M, D)`` repeated to ``(B, H, M, D)``: key head g serves
        query heads ``g H/G .. (g+1) H/G - 1``. Unchanged when G = H."""
        r = self.num_heads // self.num_kv_heads
        if r == 1:
            return k, v
        return k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
        value: torch.Tensor | None = None,
        *,
        mask: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        return_weights: bool = False,
        positions: torch.Tensor | None = None,
        key_positions: torch.Tensor | None = None,
        cache: KVCache | StaticKV | RecurrentState | None = None,
    ) -> AttentionResult:
        """Attend from ``query`` to ``key``/``value`` (self-attention when both are omitted).

        Args:
            query: ``(B, N, E)``.
            key: ``(B, M, kdim)``, default ``query``.
            value: ``(B, M, vdim)``, default ``key``.
            mask: bool, broadcastable to ``(B, H, N, M)``, True = may attend (:mod:`attnlab.masks`);
                or :class:`attnlab.masks.Documents`: packed documents, attended one by one
                (cost linear in the packed length; positions restart in every document);
                or :class:`attnlab.distributed.ShardedMask`: ``query`` is this rank's shard of a
                sequence sharded across a process group, attended over the whole sequence by
                ring attention (exact softmax attention; positions come from the mask).
            bias: float, broadcastable to ``(B, H, N, M)``, added to the scores.
            return_weights: also return the ``(B, H, N, M)`` attention weights.
            positions: integer ``(N,)`` positions of the queries, for the positional encoding
                (default: see :meth:`positions`).
            key_positions: integer ``(M,)`` positions of the keys (default ``0..M-1``).
            cache: decode with a cache from :meth:`new_cache` (self-attention: ``query`` holds the
                new tokens only, which continue the cached ones, causally; ``mask`` is then their
                key padding ``(B, 1, 1, N)`` or ``(B, N)``, or None) or from
                :meth:`new_cross_cache` (cross-attention: the keys of ``key`` are computed on
                the first call and reused).

        Returns:
            :class:`attnlab.AttentionResult`: ``output`` ``(B, N, E)``, ``weights`` or None.
        """
        if cache is not None:
            return self._forward_cached(query, key, value, cache, mask=mask, bias=bias, return_weights=return_weights,
                                        given_positions=positions is not None or key_positions is not None)
        if isinstance(mask, Documents):
            if key is not None or value is not None or bias is not None or return_weights or positions is not None or key_positions is not None:
                raise ValueError("packed documents (mask=Documents) take self-attention alone: no key, value, bias, "
                                 "return_weights or positions (they restart in every document)")
            return self._forward_documents(query, mask)
        if isinstance(mask, ShardedMask):
            if key is not None or value is not None or bias is not None or return_weights or positions is not None or key_positions is not None:
                raise ValueError("a sharded sequence (mask=ShardedMask) takes self-attention alone: no key, value, bias, "
                                 "return_weights or positions (the mask knows every shard's positions)")
            return self._forward_sharded(query, mask)
        query, key, value = silence_padding(query, key, value, mask)
        q, k, v, bias = self.project(query, key, value, bias=bias, positions=positions, key_positions=key_positions)
        if not self.grouped_kv:
            k, v = self.repeat_kv(k, v)
        res = self.attend_heads(q, k, v, mask=mask, bias=bias, return_weights=return_weights)
        return AttentionResult(self.merge_heads(res.output), res.weights)  # concat heads, then W^o

    def _forward_sharded(self, x: torch.Tensor, sharded: ShardedMask) -> AttentionResult:
        """Self-attention of this rank's shard ``x`` ``(B, c, E)`` over the whole sharded sequence
        (:func:`attnlab.distributed.ring_attend`): output ``(B, c, E)``, this rank's positions."""
        if type(self).attend_heads is not MultiHeadAttention.attend_heads:
            raise ValueError(f"{type(self).__name__} is not exact dense attention: ring attention (mask=ShardedMask) runs the dense "
                             "layer only; give a window to the ShardedMask for local attention")
        if self.positional is not None and self.positional.kind == "bias":
            raise ValueError(f"the {self.positional.name!r} encoding adds a bias over all (query, key) pairs, which ring attention "
                             "does not carry: use an input encoding or rope under sequence parallelism")
        if self.training and self.dropout > 0:
            raise ValueError(f"this layer drops attention weights (dropout={self.dropout}) in training, which ring attention does not: "
                             "train with dropout 0 under sequence parallelism (an Encoder's one dropout covers its attention)")
        self._check_input("query", x, self.embed_dim, None)
        pos = sharded.encoding_positions.to(x.device)
        q, k, v, _ = self.project(x, positions=pos, key_positions=pos)
        res = ring_attend(q, k, v, context=sharded.context, causal=sharded.causal, window=sharded.window, score=self.score,
                          normalize=self.normalize, timings=sharded.timings)
        return AttentionResult(self.merge_heads(res.output), None)

    def project(self, query, key=None, value=None, *, bias=None, positions=None, key_positions=None):
        """The heads the attention step sees: ``q`` ``(B, H, N, D)``, ``k`` and ``v`` ``(B, G, M, D)``
        (G = ``num_kv_heads``; :meth:`repeat_kv` repeats them to H) after the projections and the positional encoding (input encodings added first, ``rope``
        rotation after), and the score bias (the caller's plus a bias encoding's, or None).
        Arguments as for :meth:`forward`; :meth:`forward` is ``attend_heads`` on these, then
        ``W^o``. The attention viewer reads q, k and v through this method."""
        self._check_input("query", query, self.embed_dim, None)
        key = query if key is None else key
        value = key if value is None else value
        self._check_input("key", key, self.kdim, query.shape[0])
        self._check_input("value", value, self.vdim, query.shape[0])
        if key.shape[1] != value.shape[1]:
            raise ValueError(f"key and value must have the same length M, got {tuple(key.shape)} and {tuple(value.shape)}")
        pe = self.positional
        if pe is not None or positions is not None or key_positions is not None:
            qpos, kpos = self.positions(query.shape[1], key.shape[1], positions, key_positions, query.device)
        if pe is not None and pe.kind == "input":
            # a^i + e^i before the projections; inputs that are one tensor stay one tensor
            new_query = pe.add_to(query, qpos)
            new_key = new_query if key is query and qpos.equal(kpos) else pe.add_to(key, kpos)
            value = new_key if value is key else pe.add_to(value, kpos)
            query, key = new_query, new_key
        if pe is not None and pe.kind == "bias":
            pos_bias = pe.score_bias(qpos, kpos)
            if bias is not None:
                target = (query.shape[0], self.num_heads, query.shape[1], key.shape[1])
                check_mask_or_bias("bias", bias, target, query.device)
            bias = pos_bias if bias is None else pos_bias + bias
        project = self.head_mode == "project"
        if not project and key is query and value is query:
            q, k, v = self._self_heads(query)
        else:
            q = self._heads(query, self.q_proj, self.head_q if project else None)
            k = self._heads(key, self.k_proj, self.head_k if project else None, self.num_kv_heads)
            v = self._heads(value, self.v_proj, self.head_v if project else None, self.num_kv_heads)
        if pe is not None and pe.kind == "rotation":
            q, k = pe.rotate(q, k, qpos, kpos)
        return q, k, v, bias

    # ---------------------------------------------------------------- packed documents
    def _forward_documents(self, x: torch.Tensor, docs: Documents) -> AttentionResult:
        """Self-attention within each packed document: the batch flattened into one row, the
        documents of one length stacked and attended together (mask and bias of one document
        each), padding left at zero."""
        self._check_input("query", x, self.embed_dim, None)
        b, t, _ = x.shape
        docs.check(b, t)
        pe = self.positional
        exact = not hasattr(self, "causal")  # exact attention takes the documents' mask; an efficient variant has its own causal flag
        if not exact and (docs.window is not None or docs.causal != self.causal):
            raise ValueError(f"the {type(self).__name__} layer (causal={self.causal}) attends packed documents with its own pattern: "
                             f"give Documents(causal={self.causal}) without a window")
        pos = docs.positions(t, device=x.device).reshape(-1)
        q, k, v, _ = self.project(x.reshape(1, b * t, self.embed_dim), positions=pos, key_positions=pos)
        if not self.grouped_kv:
            k, v = self.repeat_kv(k, v)
        pieces = docs.pieces(t)
        starts = [0]
        for n, _ in pieces:
            starts.append(starts[-1] + n)
        by_length: dict[int, list[int]] = {}
        for i, (n, real) in enumerate(pieces):
            if real:
                by_length.setdefault(n, []).append(i)
        outputs: list = [None] * len(pieces)

        def take(heads, idx, n):  # the documents idx, all of length n, stacked: (docs, H, n, D)
            return torch.cat([heads[:, :, starts[i] : starts[i] + n] for i in idx])

        for n, idx in by_length.items():
            local = torch.arange(n, device=x.device)
            bias = pe.score_bias(local, local) if pe is not None and pe.kind == "bias" else None
            mask = docs.block(n, x.device) if exact else None
            res = self.attend_heads(take(q, idx, n), take(k, idx, n), take(v, idx, n), mask=mask, bias=bias)
            for j, i in enumerate(idx):
                outputs[i] = res.output[j : j + 1]
        for i, (n, real) in enumerate(pieces):
            if not real:
                outputs[i] = q.new_zeros(1, self.num_heads, n, v.shape[-1])
        out = self.merge_heads(torch.cat(outputs, dim=2))  # (1, B T, E)
        return AttentionResult(out.reshape(b, t, self.embed_dim))

    # ---------------------------------------------------------------- cached decoding
    def new_cache(self, *, window: int | None = None, sinks: int = 0, positions: str = "absolute"):
        """An empty cache for decoding with this layer's self-attention (see
        :class:`attnlab.layers.cache.KVCache`: ``window``, ``sinks`` and ``positions`` bound it,
        StreamingLLM's way when ``positions="cache"``). Pass it as ``forward(x_new, cache=...)``."""
        return KVCache(window=window, sinks=sinks, positions=positions)

    def new_cross_cache(self) -> StaticKV:
        """An empty cache of cross-attention's keys and values (filled on the first call)."""
        return StaticKV()

    def _forward_cached(self, query, key, value, cache, *, mask, bias, return_weights, given_positions) -> AttentionResult:
        if given_positions:
            raise ValueError("with a cache the positions come from it: pass neither positions nor key_positions")
        if bias is not None:
            raise ValueError("a score bias cannot be combined with a cache (a bias encoding is applied by the layer itself)")
        if isinstance(cache, StaticKV):
            return self._cross_cached(query, key, value, cache, mask=mask, return_weights=return_weights)
        if key is not None or value is not None:
            raise ValueError("a self-attention cache takes the new tokens as query only (key and value come from the cache)")
        self._check_input("query", query, self.embed_dim, None)
        if self.kdim != self.embed_dim or self.vdim != self.embed_dim:
            raise ValueError("cached self-attention needs kdim = vdim = embed_dim")
        b, n, _ = query.shape
        valid = key_padding_flags(mask, b, n, query.device, refuse="with a cache, mask is the new tokens' key padding "
                                  "(causal order and the cache's window are applied by the cache)")
        if isinstance(cache, RecurrentState):
            if return_weights:
                raise ValueError(f"{type(self).__name__} decodes with running sums: it has no attention weights to return")
            return self.recurrent_step(query, cache, valid)
        if not isinstance(cache, KVCache):
            raise TypeError(f"cache must come from new_cache() or new_cross_cache(), got {type(cache).__name__}")
        self.check_cache(cache)
        if cache.positions == "cache" and n > 1:  # StreamingLLM's positions: one token at a time
            if return_weights:
                raise ValueError("a cache with positions='cache' returns weights one token at a time: feed one token per call")
            outs = [self._cached_self(query[:, i : i + 1], cache, None if valid is None else valid[:, i : i + 1], False)
                    for i in range(n)]
            return AttentionResult(torch.cat([o.output for o in outs], 1))
        return self._cached_self(query, cache, valid, return_weights)

    def check_cache(self, cache: KVCache) -> None:
        """Refuse a cache this layer cannot decode with (exact attention takes any)."""

    def _cached_self(self, x, cache: KVCache, valid, return_weights) -> AttentionResult:
        b, n, _ = x.shape
        pe = self.positional
        rotation = pe is not None and pe.kind == "rotation"
        # absolute positions: the new keys are rotated once, as they enter
        q, k, v, qpos = self.new_token_heads(x, cache.seen, rotate=cache.positions == "absolute")
        keys, values, key_valid, kpos = cache.update(k, v, valid)
        bq, bk = qpos, kpos
        if cache.positions == "cache":  # positions in the cache (StreamingLLM): rotate every held key now
            bk, bq = cache.cache_positions(kpos, int(qpos[0]))
            if rotation:
                q, keys = pe.rotate(q, keys, bq, bk)
        bias = pe.score_bias(bq, bk) if pe is not None and pe.kind == "bias" else None
        res = self.attend_exact(q, keys, values, mask=cache.mask(qpos, kpos, key_valid), bias=bias, return_weights=return_weights)
        return AttentionResult(self.merge_heads(res.output), res.weights)

    def new_token_heads(self, x, start: int, *, rotate: bool = True):
        """q ``(B, H, n, D)``, k and v ``(B, G, n, D)`` of ``n`` new tokens ``x`` ``(B, n, E)`` at
        positions ``start .. start + n - 1`` (an input encoding added first; rope applied when
        ``rotate``), and those positions."""
        pe = self.positional
        qpos = torch.arange(start, start + x.shape[1], device=x.device)
        if pe is not None and pe.kind == "input":
            x = pe.add_to(x, qpos)
        if self.head_mode == "split":
            q, k, v = self._self_heads(x)
        else:
            q = self._heads(x, self.q_proj, self.head_q)
            k = self._heads(x, self.k_proj, self.head_k, self.num_kv_heads)
            v = self._heads(x, self.v_proj, self.head_v, self.num_kv_heads)
        if rotate and pe is not None and pe.kind == "rotation":
            q, k = pe.rotate(q, k, qpos, qpos)
        return q, k, v, qpos

    def merge_heads(self, out: torch.Tensor) -> torch.Tensor:
        """``W^o concat(heads)``: ``(B, H, N, D)`` -> ``(B, N, E)``."""
        b, _, n, _ = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(b, n, self.embed_dim))

    def _cross_cached(self, query, key, value, cache: StaticKV, *, mask, return_weights) -> AttentionResult:
        if self.positional is not None:
            raise ValueError("a cross-attention cache needs a layer without a positional encoding (positions belong to the decoder)")
        if cache.k is None:
            if key is None:
                raise ValueError("the first call with an empty cross-attention cache needs the key (the encoder's output)")
            value = key if value is None else value
            self._check_input("key", key, self.kdim, query.shape[0])
            self._check_input("value", value, self.vdim, query.shape[0])
            project = self.head_mode == "project"
            cache.k = self._heads(key, self.k_proj, self.head_k if project else None, self.num_kv_heads)
            cache.v = self._heads(value, self.v_proj, self.head_v if project else None, self.num_kv_heads)
        self._check_input("query", query, self.embed_dim, None)
        if query.shape[0] != cache.k.shape[0]:
            raise ValueError(f"the cross-attention cache holds keys of {cache.k.shape[0]} row(s), the query has {query.shape[0]} "
                             "(reorder() the cache to follow the rows)")
        q = self._heads(query, self.q_proj, self.head_q if self.head_mode == "project" else None)
        res = self.attend_exact(q, cache.k, cache.v, mask=mask, bias=None, return_weights=return_weights)
        return AttentionResult(self.merge_heads(res.output), res.weights)

    def attend_exact(self, q, k, v, *, mask=None, bias=None, return_weights=False) -> AttentionResult:
        """Exact attention over held keys (``k``, ``v`` with H or G heads), as decoding with a
        :class:`attnlab.layers.cache.KVCache` uses it: :meth:`attend_heads` here; the efficient
        variants that decode with such a cache (``local``, ``longformer``) attend exactly over it."""
        return self.attend_heads(q, k, v, mask=mask, bias=bias, return_weights=return_weights)

    def recurrent_step(self, x, state: RecurrentState, valid) -> AttentionResult:
        """Decoding with a :class:`attnlab.layers.cache.RecurrentState`: the kernel variants
        (``linear``, ``performer``) override this."""
        raise ValueError(f"{type(self).__name__} decodes with a KVCache (new_cache()), not a recurrent state")

    def grouped(self, num_kv_heads: int) -> "MultiHeadAttention":
        """A copy with ``num_kv_heads`` key / value heads, each projection the mean of its group's
        H / G heads (Ainslie et al. 2023, section 2: converting a multi-head checkpoint to
        grouped-query attention by mean-pooling; the paper then uptrains it briefly)."""
        import copy

        g = positive_int("num_kv_heads", num_kv_heads)
        if self.head_mode != "split" or self.num_kv_heads != self.num_heads:
            raise ValueError("grouped() converts a layer with head_mode='split' and one key / value head per query head")
        if self.num_heads % g:
            raise ValueError(f"num_kv_heads must divide num_heads, got num_kv_heads={g} and num_heads={self.num_heads}")
        if not self.uses_keys and g != self.num_heads:
            raise ValueError(f"{type(self).__name__} derives its keys from the queries: it takes no num_kv_heads")
        new = copy.deepcopy(self)
        new.num_kv_heads = g
        r, d = self.num_heads // g, self.head_dim
        for name in ("k_proj", "v_proj"):
            old = getattr(self, name)
            lin = nn.Linear(old.in_features, g * d, bias=old.bias is not None, device=old.weight.device, dtype=old.weight.dtype)
            with torch.no_grad():
                lin.weight.copy_(old.weight.view(g, r, d, old.in_features).mean(1).reshape(g * d, old.in_features))
                if old.bias is not None:
                    lin.bias.copy_(old.bias.view(g, r, d).mean(1).reshape(g * d))
            setattr(new, name, lin)
        return new

    def attend_heads(self, q, k, v, *, mask=None, bias=None, return_weights=False) -> AttentionResult:
        """The attention step on projected heads: q ``(B, H, N, D)``, k ``(B, H|G, M, D)``, v
        ``(B, H|G, M, D)`` -> :class:`attnlab.AttentionResult` with output ``(B, H, N, D)``.

        Exact attention here (:func:`attnlab.attend`); the efficient variants of
        :mod:`attnlab.efficient` override this step and keep the projections around it.
        """
        return attend(
            q,
            k,
            v,
            score=self.score,
            normalize=self.normalize,
            mask=mask,
            bias=bias,
            dropout_p=self.dropout if self.training else 0.0,
            return_weights=return_weights,
        )

    # ---------------------------------------------------------------- torch interop
    @classmethod
    def from_torch(cls, m: nn.MultiheadAttention) -> "MultiHeadAttention":
        """A ``MultiHeadAttention`` with the weights of a ``torch.nn.MultiheadAttention``.

        The result computes what ``m(x, x, x)`` computes, batch first (attnlab is always batch
        first; ``m.batch_first`` only changes the layout of ``m``'s own inputs). Mind the masks:
        torch's bool ``attn_mask`` / ``key_padding_mask`` mean True = *not* allowed, attnlab's
        True = allowed.
        """
        if not isinstance(m, nn.MultiheadAttention):
            raise TypeError(f"from_torch expects a torch.nn.MultiheadAttention, got {type(m).__name__}")
        if m.bias_k is not None or m.add_zero_attn:
            raise ValueError("from_torch does not support add_bias_kv=True or add_zero_attn=True")
        has_bias = m.in_proj_bias is not None
        new = cls(m.embed_dim, m.num_heads, kdim=m.kdim, vdim=m.vdim, bias=has_bias, dropout=m.dropout)
        new = new.to(device=m.out_proj.weight.device, dtype=m.out_proj.weight.dtype)
        e = m.embed_dim
        with torch.no_grad():
            if m._qkv_same_embed_dim:
                wq, wk, wv = m.in_proj_weight.split(e, dim=0)
            else:
                wq, wk, wv = m.q_proj_weight, m.k_proj_weight, m.v_proj_weight
            for lin, w in ((new.q_proj, wq), (new.k_proj, wk), (new.v_proj, wv)):
                lin.weight.copy_(w)
            new.out_proj.weight.copy_(m.out_proj.weight)
            if has_bias:
                for lin, b in zip((new.q_proj, new.k_proj, new.v_proj), m.in_proj_bias.split(e)):
                    lin.bias.copy_(b)
                new.out_proj.bias.copy_(m.out_proj.bias)
        return new

    def to_torch(self) -> nn.MultiheadAttention:
        """The equivalent ``torch.nn.MultiheadAttention`` (``batch_first=True``).

        Only the form torch has: ``head_mode="split"``, scaled-dot score, softmax.
        """
        same_math = type(self.score) is ScaledDot and resolve_normalizer(self.normalize) is softmax
        if self.num_kv_heads != self.num_heads:
            raise ValueError("to_torch needs one key / value head per query head (torch.nn.MultiheadAttention has no grouped heads)")
        if self.head_mode != "split" or not same_math or self.positional is not None:
            raise ValueError(
                "to_torch needs head_mode='split', score='scaled_dot', normalize='softmax' and no positional "
                f"encoding, got head_mode={self.head_mode!r}, score={self.score_name!r}, normalize={self.normalize!r}, "
                f"positional={None if self.positional is None else self.positional.name!r}"
            )
        has_bias = self.q_proj.bias is not None
        ref = self.out_proj.weight
        m = nn.MultiheadAttention(
            self.embed_dim,
            self.num_heads,
            dropout=self.dropout,
            bias=has_bias,
            kdim=self.kdim,
            vdim=self.vdim,
            batch_first=True,
            device=ref.device,
            dtype=ref.dtype,
        )
        with torch.no_grad():
            ws = (self.q_proj.weight, self.k_proj.weight, self.v_proj.weight)
            if m._qkv_same_embed_dim:
                m.in_proj_weight.copy_(torch.cat(ws, dim=0))
            else:
                for dst, w in zip((m.q_proj_weight, m.k_proj_weight, m.v_proj_weight), ws):
                    dst.copy_(w)
            m.out_proj.weight.copy_(self.out_proj.weight)
            if has_bias:
                m.in_proj_bias.copy_(torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias]))
                m.out_proj.bias.copy_(self.out_proj.bias)
        return m
