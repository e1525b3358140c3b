"""Multi-head attention with interchangeable scores and normalisers, in both head formulations."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.hooks import RemovableHandle

from ..core.attend import AttentionResult
from ..core.scores import Score
from ..positional.base import PositionalEncoding, check_positions
from ..validate import positive_int
from . import checks, decoding, interop, migration, projection
from .cache import KVCache, StaticKV
from .exact import DenseStep
from .state import RecurrentState, check_kind, make_cache
from .step import AttentionStep, Capabilities

__all__ = ["MultiHeadAttention"]

HeadMode = Literal["split", "project"]


class MultiHeadAttention(nn.Module):
    """Multi-head attention ``concat(head_1, ..., head_H) W^o``, ``head_h = attend(Q_h, K_h, V_h)``.

    Vaswani et al. 2017 (https://arxiv.org/abs/1706.03762), section 3.2.2, with any score and
    normaliser of :func:`attnlab.attend`. Two formulations of the heads:

    * ``head_mode="split"`` (the common form, ``torch.nn.MultiheadAttention``'s): one projection
      ``Q = X W^q`` of width E, split into H heads of width D = E / H.
    * ``head_mode="project"`` (the lecture notes' form): ``q^i = W^q a^i`` of width E, then a
      second projection per head, ``q^{i,h} = W^{q,h} q^i`` of width D; likewise for k and v.

    Both end with the output transform ``W^o``. Between them, the layer runs the attention step it holds (``step``, an
    :class:`attnlab.layers.step.AttentionStep`): exact attention (:class:`attnlab.layers.exact.DenseStep`) unless given
    another, such as a variant of :mod:`attnlab.efficient` (``efficient.create(name, ...)`` builds both; its options
    are the step's: ``layer.step.window``). A checkpoint written before the layer held its step (the step's parameters
    at the layer's top level) loads: its keys are mapped to ``step.*``.

    Args:
        embed_dim: E, the width of the queries and of the output.
        num_heads: H; must divide E.
        kdim: width of the keys' input (default E); vdim: of the values' input (default E).
        bias: learn additive biases in the input and output projections.
        score: a name from :func:`attnlab.scores.names` (learnable scores get one set of weights per head), a
            :class:`attnlab.Score` module or a callable ``(q, k) -> scores``.
        score_options: keyword options for a score built by name (``temperature=``, ``learnable=``, ``hidden_dim=``).
        normalize: ``"softmax"``, ``"relu"``, ``"sigmoid"`` or a callable ``(scores, mask) -> weights``.
        head_mode: ``"split"`` or ``"project"``.
        dropout: dropout on the attention weights, in training mode only.
        positional: a name from :func:`attnlab.positional.names` or a :class:`attnlab.positional.PositionalEncoding`,
            applied the way it acts: input encodings are added to the query, key and value inputs before the
            projections, bias encodings are a score function on every head's scores, ``rope`` rotates each head's q and
            k. ``None`` (default) or ``"none"``: no positional information.
        positional_options: keyword options for an encoding given by name.
        max_len: the longest sequence, for encodings bounded by it (``learned``).
        num_kv_heads: G, the key / value heads (default H): grouped-query attention (Ainslie et al. 2023,
            https://arxiv.org/abs/2305.13245), each group of H / G query heads sharing one key / value head; G = 1 is
            multi-query attention (Shazeer 2019). G must divide H. Softmax over a plain dot score runs on PyTorch's
            fused kernel with the G heads as they are; other paths (and the efficient variants) see them repeated to H.
        step: the attention step (default: exact attention with ``score``, ``score_options``, ``normalize`` and
            ``dropout``, which are its options: give them to a step given here), or a function building it, called after
            the projections are drawn (what :func:`attnlab.efficient.create` passes: a seeded layer draws its
            projections first, then the step's parameters).
    """

    step: AttentionStep
    """The attention step this layer holds (registered as the submodule ``step``)."""

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
        step: AttentionStep | Callable[[], AttentionStep] | None = None,
    ):
        super().__init__()
        e = positive_int("embed_dim", embed_dim)
        h = positive_int("num_heads", num_heads)
        if e % h:
            raise ValueError(f"embed_dim must be divisible by num_heads, got embed_dim={e} and num_heads={h}")
        if step is None:  # exact attention, its score drawn first (before the projections)
            step = DenseStep(e, h, score=score, score_options=score_options, normalize=normalize, dropout=dropout)
        else:
            checks.refuse_exact_options({"score": score, "score_options": score_options, "normalize": normalize,
                                         "dropout": dropout})
        g = h if num_kv_heads is None else positive_int("num_kv_heads", num_kv_heads)
        if h % g:
            raise ValueError(f"num_kv_heads must divide num_heads, got num_kv_heads={g} and num_heads={h}")
        if head_mode not in ("split", "project"):
            raise ValueError(f"head_mode must be 'split' or 'project', got {head_mode!r}")
        self.embed_dim, self.num_heads, self.head_dim, self.num_kv_heads = e, h, e // h, g
        kv = g * (e // h)  # the width of the keys' and values' projections
        self.kdim = e if kdim is None else positive_int("kdim", kdim)
        self.vdim = e if vdim is None else positive_int("vdim", vdim)
        self.head_mode = head_mode
        self.positional = checks.make_positional(self, positional, positional_options, max_len)
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
        # a builder is called here: the step's parameters drawn after the projections
        built = checks.built_step(step, e, h)
        checks.check_layer(built, self)
        checks.check_positional(built, self.positional)
        self.step = built
        self.register_load_state_dict_pre_hook(migration.step_keys)

    @property
    def name(self) -> str:
        """The registered name of the step this layer holds (:func:`attnlab.efficient.create`)."""
        return cast(AttentionStep, self._modules["step"]).name

    @property
    def capabilities(self) -> Capabilities:
        """What this layer's attention step can do (:class:`attnlab.layers.step.Capabilities`):
        exact attention takes any mask, forms scores, decodes with any :class:`KVCache` and takes
        grouped keys itself. Each variant's step declares its own."""
        return cast(AttentionStep, self._modules["step"]).capabilities

    def reset_parameters(self) -> None:
        """Xavier-uniform projections and zero biases, as ``torch.nn.MultiheadAttention``."""
        projection.init_projections(self.q_proj, self.k_proj, self.v_proj, self.out_proj)
        if self.head_mode == "project":
            bound = 1.0 / math.sqrt(self.embed_dim)
            for w in (self.head_q, self.head_k, self.head_v):
                nn.init.uniform_(w, -bound, bound)

    def extra_repr(self) -> str:
        return (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, head_mode={self.head_mode!r}"
            + ("" if self.num_kv_heads == self.num_heads else f", num_kv_heads={self.num_kv_heads}")
            + ("" if self.positional is None else f", positional={self.positional.name!r}")
        )

    def positions(self, n: int, m: int, positions=None, key_positions=None,
                  device=None) -> tuple[torch.Tensor, torch.Tensor]:
        """The query and key positions a forward pass uses: given (``(N,)``, or ``(B, N)`` per row), or by default keys
        at ``0..M-1`` and queries ending at the last key (``M-N..M-1``; ``0..N-1`` when N > M)."""
        kp = (torch.arange(m, device=device) if key_positions is None
              else check_positions(key_positions, m, "key_positions").to(device))
        if positions is None:
            qp = torch.arange(max(m - n, 0), max(m - n, 0) + n, device=device)
        else:
            qp = check_positions(positions, n, "positions").to(device)
        return qp, kp

    def check_input(self, name: str, x, width: int, batch: int | None) -> None:
        """Refuse an input that is not a ``(B, N, width)`` tensor of this layer's dtype (``batch``: B, when known)."""
        projection.check_input(self, name, x, width, batch)

    def _heads(self, x: torch.Tensor, proj: nn.Linear, head_w: torch.Tensor | None,
               heads: int | None = None) -> torch.Tensor:
        b, n, _ = x.shape
        x = proj(x)  # (B, N, E), or (B, N, G D) for grouped keys / values, or the step's own width
        if head_w is None:
            heads = heads or self.num_heads
            return x.view(b, n, heads, proj.out_features // heads).transpose(1, 2)  # (B, H|G, N, D)
        return torch.einsum("bne,hde->bhnd", x, head_w)  # q^{i,h} = W^{q,h} q^i: (B, H|G, N, D)

    def _self_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Self-attention's Q, K, V in one product ``x [W^q; W^k; W^v]^T``: q ``(B, H, N, D)``,
        k and v ``(B, G, N, D)``."""
        b, n, _ = x.shape
        shared = self.capabilities.shared_qk
        projs = [self.q_proj, self.v_proj] if shared else [self.q_proj, self.k_proj, self.v_proj]
        w, bias = projection.fused_weights(self, projs)
        out = F.linear(x, w, bias)
        if self.num_kv_heads != self.num_heads:  # grouped
            q, k, v = out.split([self.q_proj.out_features, self.k_proj.out_features, self.v_proj.out_features], dim=-1)
            return (q.view(b, n, self.num_heads, -1).transpose(1, 2),
                    k.view(b, n, self.num_kv_heads, -1).transpose(1, 2),
                    v.view(b, n, self.num_kv_heads, -1).transpose(1, 2))
        # (B, H, N, D) each
        heads = out.view(b, n, len(projs), self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        if shared:  # a variant that derives its keys from the queries
            return heads[0], heads[0], heads[1]
        return heads[0], heads[1], heads[2]

    def key_heads(self, key: torch.Tensor, value: torch.Tensor, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """k and v ``(B, G, M, D)`` of cross-attention inputs (what a cross-attention cache keeps)."""
        self.check_input("key", key, self.kdim, batch)
        self.check_input("value", value, self.vdim, batch)
        project = self.head_mode == "project"
        return (self._heads(key, self.k_proj, self.head_k if project else None, self.num_kv_heads),
                self._heads(value, self.v_proj, self.head_v if project else None, self.num_kv_heads))

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
        mask=None,
        bias: torch.Tensor | None = None,
        return_weights: bool = False,
        positions: torch.Tensor | None = None,
        key_positions: torch.Tensor | None = None,
        cache: KVCache | StaticKV | RecurrentState | None = None,
    ) -> AttentionResult:
        """Attend from ``query`` to ``key``/``value`` (self-attention when both are omitted).

        One path whatever the mask or the cache: where the keys come from and their positions (the call's own, or a
        cache's), the projections and positional encoding, the attention step (``layer.step``: the step this
        layer holds, its hooks first) under the mask, then ``W^o``.

        Args:
            query: ``(B, N, E)``.
            key: ``(B, M, kdim)``, default ``query``.
            value: ``(B, M, vdim)``, default ``key``.
            mask: True = may attend. A mask function (:mod:`attnlab.masks`: causal, windows, padding,
                :class:`attnlab.masks.Documents` — packed documents, whose positions restart in every document — ...), a
                block map, a bool tensor broadcastable to ``(B, H, N, M)``, or :class:`attnlab.distributed.ShardedMask`:
                ``query`` is this rank's shard of a sequence sharded across a process group, attended over the whole
                sequence by ring attention (positions come from the mask).
            bias: float, broadcastable to ``(B, H, N, M)``, added to the scores.
            return_weights: also return the ``(B, H, N, M)`` attention weights.
            positions: integer ``(N,)`` (or ``(B, N)``) positions of the queries, for the positional encoding (default:
                the mask's, else see :meth:`positions`).
            key_positions: integer ``(M,)`` (or ``(B, M)``) positions of the keys (default ``0..M-1``).
            cache: decode with a cache from :meth:`new_cache` (self-attention: ``query`` holds the new tokens only,
                which continue the cached ones, causally; ``mask`` is then their key padding,
                :func:`attnlab.masks.valid_keys` or ``(B, 1, 1, N)``, or None) or from :meth:`new_cross_cache`
                (cross-attention: the keys of ``key`` are computed on the first call and reused).

        Returns:
            :class:`attnlab.AttentionResult`: ``output`` ``(B, N, E)``, ``weights`` or None.
        """
        caps = cast(AttentionStep, self._modules["step"]).capabilities
        call = decoding.begin(self, cache, query, key, value, mask=mask, positions=positions,
                              key_positions=key_positions, bias=bias, return_weights=return_weights)
        q, k, v, score_mod = self.project(call.query, call.key, call.value, positions=call.qpos,
                                          key_positions=call.kpos, rotate=call.rotate, kv=call.kv)
        if not caps.grouped_kv:
            k, v = self.repeat_kv(k, v)
        res = decoding.attend(self, cache, q, k, v, call, score_mod, bias=bias, return_weights=return_weights)
        return AttentionResult(self.merge_heads(res.output), res.weights)  # concat heads, then W^o

    def score_mod(self, q_positions: torch.Tensor | None, k_positions: torch.Tensor | None):
        """The bias encoding's score function at these positions, or None (no bias encoding)."""
        pe = self.positional
        if pe is None or pe.kind != "bias":
            return None
        return pe.score_mod(q_positions, k_positions)

    def project(self, query, key=None, value=None, *, positions=None, key_positions=None, rotate: bool = True, kv=None):
        """The heads the attention step sees: ``q`` ``(B, H, N, D)``, ``k`` and ``v`` ``(B, G, M, D)`` (G =
        ``num_kv_heads``; :meth:`repeat_kv` repeats them to H) after the projections and the positional encoding (input
        encodings added first, ``rope`` rotation after, unless ``rotate`` is False), and the bias encoding's score
        function at these positions (or None). ``kv``: keys and values already projected (a cross-attention cache). The
        attention viewer reads q, k and v through this method."""
        projection.check_input(self, "query", query, self.embed_dim, None)
        if kv is None:
            key = query if key is None else key
            value = key if value is None else value
            projection.check_input(self, "key", key, self.kdim, query.shape[0])
            projection.check_input(self, "value", value, self.vdim, query.shape[0])
            if key.shape[1] != value.shape[1]:
                raise ValueError(f"key and value must have the same length M, got {tuple(key.shape)} and "
                                 f"{tuple(value.shape)}")
        m = kv[0].shape[2] if kv is not None else key.shape[1]
        pe = self.positional
        qpos, kpos = positions, key_positions
        if pe is not None and (qpos is None or kpos is None):
            qpos, kpos = self.positions(query.shape[1], m, positions, key_positions, query.device)
        if pe is not None and pe.kind == "input":
            # a^i + e^i before the projections; inputs that are one tensor stay one tensor
            new_query = pe.add_to(query, qpos)
            if kv is None:
                new_key = new_query if key is query and qpos.equal(kpos) else pe.add_to(key, kpos)
                value = new_key if value is key else pe.add_to(value, kpos)
                key = new_key
            query = new_query
        project = self.head_mode == "project"
        if kv is not None:
            q = self._heads(query, self.q_proj, self.head_q if project else None)
            k, v = kv
        elif not project and key is query and value is query:
            q, k, v = self._self_heads(query)
        else:
            q = self._heads(query, self.q_proj, self.head_q if project else None)
            k = self._heads(key, self.k_proj, self.head_k if project else None, self.num_kv_heads)
            v = self._heads(value, self.v_proj, self.head_v if project else None, self.num_kv_heads)
        if rotate and pe is not None and pe.kind == "rotation":
            q, k = pe.rotate(q, k, qpos, kpos)
        return q, k, v, self.score_mod(qpos, kpos)

    # ---------------------------------------------------------------- cached decoding
    def new_cache(self, *, window: int | None = None, sinks: int = 0, positions: str = "absolute"):
        """An empty cache for decoding with this layer's self-attention, of the kind its step declares
        (``capabilities.cache``). Exact attention: a :class:`KVCache` (``window``, ``sinks`` and ``positions`` bound it,
        StreamingLLM's way when ``positions="cache"``); a sparse pattern: the bounded KVCache that is its causal
        pattern; kernel attention: a :class:`RecurrentState`. Pass it as ``forward(x_new, cache=...)``. (A sequence
        mixer makes its own: :meth:`attnlab.layers.mixer.SequenceMixer.new_cache`.)"""
        return make_cache(self.step, window, sinks, positions)

    def new_cross_cache(self) -> StaticKV:
        """An empty cache of cross-attention's keys and values (filled on the first call)."""
        return StaticKV()

    def check_cache(self, cache) -> None:
        """Refuse a cache other than the kind :meth:`new_cache` makes: another window, sinks or
        positions would compute another pattern, a recurrent variant needs its own state, exact
        attention takes any :class:`KVCache` and no recurrent state."""
        check_kind(self.step, cache)

    def register_step_hook(self, hook: Callable) -> RemovableHandle:
        """Call ``hook(layer, q, k, v, kwargs)`` before each call of this layer's step, whoever calls it, with the heads
        and the call as keyword arguments (:meth:`attnlab.layers.step.StepCall.kwargs`); with a cache, ``k`` and ``v``
        are the held keys (a recurrent state, which the step writes itself: the new tokens'). The handle's ``remove()``
        removes it."""
        return self.step.register_hook(hook, owner=self)

    def clear_step_hooks(self) -> None:
        """Remove every step hook (a copy such as :meth:`grouped`'s is a new layer: hooks stay with the one they were
        registered on)."""
        self.step.clear_hooks()

    merge_heads = projection.merge_heads

    # ---------------------------------------------------------------- interop (attnlab.layers.interop)
    def grouped(self, num_kv_heads: int) -> MultiHeadAttention:
        """A copy with ``num_kv_heads`` key / value heads, each projection the mean of its group's
        H / G heads (Ainslie et al. 2023, section 2: converting a multi-head checkpoint to
        grouped-query attention by mean-pooling; the paper then uptrains it briefly)."""
        return interop.grouped(self, num_kv_heads)

    @classmethod
    def from_torch(cls, m: nn.MultiheadAttention) -> MultiHeadAttention:
        """A ``MultiHeadAttention`` with the weights of a ``torch.nn.MultiheadAttention``.

        The result computes what ``m(x, x, x)`` computes, batch first (attnlab is always batch first; ``m.batch_first``
        only changes the layout of ``m``'s own inputs). Mind the masks: torch's bool ``attn_mask`` /
        ``key_padding_mask`` mean True = *not* allowed, attnlab's True = allowed.
        """
        return interop.from_torch(cls, m)

    def to_torch(self) -> nn.MultiheadAttention:
        """The equivalent ``torch.nn.MultiheadAttention`` (``batch_first=True``).

        Only the form torch has: ``head_mode="split"``, scaled-dot score, softmax.
        """
        return interop.to_torch(self)
