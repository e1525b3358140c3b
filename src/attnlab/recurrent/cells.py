"""Self-attention inside recurrent networks: the SimpleRNN with attention, and the LSTMN.

Both run step by step over a ``(B, N, input_size)`` batch, keep a *tape* of the states they
have written, and at every step attend over that tape with any attnlab score (``align``) and
normaliser, so a state from far back is one attention read away instead of N recurrent steps.
Both return the per-step outputs and every step's attention row as a ``(B, N, N)``
lower-triangular matrix (zero above the diagonal), for plotting.

Padding: ``mask`` ``(B, N)`` is True at real positions and must be a prefix per row (right
padding). A recurrent step only reads states before it, so the real positions of a padded
sequence compute exactly what the unpadded sequence computes; padded positions output zeros
and have all-zero attention rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from ..core import scores as score_registry
from ..core.normalize import resolve_normalizer
from ..core.scores import Score, resolve_score
from ..validate import ArgumentTypeError, optional_int, positive_int

__all__ = ["AttentionRNN", "LSTMN", "RecurrentOutput", "check_prefix_mask"]


@dataclass
class RecurrentOutput:
    """What :class:`AttentionRNN` and :class:`LSTMN` return.

    Attributes:
        output: ``(B, N, hidden)``, the hidden state ``h_i`` of every step.
        weights: ``(B, N, N)``, row ``i`` = the attention weights of step ``i`` (zero above the
            diagonal; see each class for what column ``j`` holds).
        memory: ``(B, N, hidden)``: the attention summary ``c_i`` (AttentionRNN) or the memory
            cell ``c_t`` (LSTMN) of every step.
    """

    output: torch.Tensor
    weights: torch.Tensor
    memory: torch.Tensor


def check_prefix_mask(mask: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor | None:
    """Validate a ``(B, N)`` bool mask of real positions, each row a prefix (right padding)."""
    if mask is None:
        return None
    b, n = x.shape[:2]
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or tuple(mask.shape) != (b, n):
        got = f"{mask.dtype} {tuple(mask.shape)}" if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(f"mask must be a bool tensor of shape (B, N) = ({b}, {n}), True at real positions; got {got}")
    if n > 1 and bool((mask[:, 1:] & ~mask[:, :-1]).any()):
        raise ValueError("mask must mark a prefix of each row (right padding): a recurrent layer reads its inputs in "
                         "order")
    return mask.to(x.device)


def _align(align, hidden: int, options: dict | None) -> Score:
    if isinstance(align, str):
        if align not in score_registry.names():
            raise ValueError(f"unknown align score {align!r}; expected one of {score_registry.names()}, a Score module "
                             "or a callable")
        return score_registry.create(align, head_dim=hidden, num_heads=1, **(options or {}))
    if options:
        raise ArgumentTypeError("align_options apply only when align is given by name")
    return resolve_score(align)


def _check_input(x, input_size: int, who: str):
    if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != input_size:
        got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{who} expects inputs of shape (B, N, {input_size}), got {got}")


class _Tape:
    """The states written so far, ``(B, 1, t, D)``: a growing concatenation while gradients are
    recorded (autograd keeps each step's view), a preallocated buffer written in place otherwise."""

    def __init__(self, like: torch.Tensor, n: int, grad: bool):
        self.grad = grad
        self.parts: list[torch.Tensor] = []
        self.buf = None if grad else like.new_zeros(like.shape[0], 1, n, like.shape[-1])
        self.len = 0
        self.cat = None

    def append(self, x: torch.Tensor) -> None:  # x: (B, 1, 1, D)
        if self.grad:
            self.parts.append(x)
            self.cat = None
        else:
            self.buf[:, :, self.len] = x[:, :, 0]
        self.len += 1

    def view(self) -> torch.Tensor:
        if not self.grad:
            return self.buf[:, :, : self.len]
        if self.cat is None:
            self.cat = torch.cat(self.parts, dim=2)
        return self.cat


def _read(score: Score, normalize: Callable, q: torch.Tensor, keys: torch.Tensor, values: list[torch.Tensor]):
    """One attention read: weights ``(B, 1, 1, t)`` of prepared query ``q`` over prepared keys,
    and the weighted sums of each ``values`` tape ``(B, 1, t, D)``."""
    w = normalize(score.pairwise(q, keys), None)
    return w, [(w @ v)[:, 0, 0] for v in values]


class _AttentionCell(nn.Module):
    """What both cells share: sizes, the align score, the normaliser, input checks."""

    def __init__(self, input_size: int, hidden_size: int, align, align_options: dict | None, normalize):
        super().__init__()
        positive_int("input_size", input_size)
        positive_int("hidden_size", hidden_size)
        self.input_size, self.hidden_size = input_size, hidden_size
        self.align = _align(align, hidden_size, align_options)
        self.normalize = resolve_normalizer(normalize)

    def extra_repr(self) -> str:
        return f"input_size={self.input_size}, hidden_size={self.hidden_size}"

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``(B, N, input_size)`` -> the hidden states ``(B, N, hidden_size)``."""
        return self.steps(x, mask).output

    def _begin(self, x, mask, truncate):
        """Checked inputs (padded ones zeroed), the mask, whether gradients are recorded, the first
        step whose incoming hand-over keeps its gradient."""
        _check_input(x, self.input_size, type(self).__name__)
        mask = check_prefix_mask(mask, x)
        optional_int("truncate", truncate, 0)
        if mask is not None:
            x = x.masked_fill(~mask[..., None], 0.0)  # padded inputs never reach a gradient, NaN included
        grad = torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in self.parameters()))
        cut = x.shape[1] - truncate if truncate is not None else 0
        return x, mask, grad, cut


class AttentionRNN(_AttentionCell):
    """The SimpleRNN with self-attention of the lecture (after Cheng, Dong & Lapata 2016).

    For steps ``i = 1 .. N`` (0-based in the tensors)::

        h_i = tanh(A [x_i ; c_{i-1}] + b)
        alpha_{i,j} = normalize_j(align(h_i, h_j)),   j = 1 .. i
        c_i = sum_{j <= i} alpha_{i,j} h_j

    with ``h_0 = c_0 = 0`` (``c0`` sets another ``c_0``). The state handed from step to step
    is ``c_{i-1}``, a summary of every earlier hidden state, instead of ``h_{i-1}`` alone, so
    the network need not forget. ``align`` is the query-key score ``align(h_i, h_j)`` with
    ``h_i`` the query: any attnlab score by name (``"scaled_dot"``, ``"dot"``, ``"cosine"``,
    ``"additive"``, ``"bilinear"``; learnable ones are built for ``hidden_size`` and trained
    with the cell), a :class:`attnlab.Score` module or a callable ``(q, k) -> scores``.
    Weight column ``j`` is step ``j``'s hidden state; row ``i`` is zero after column ``i``.

    Args:
        input_size: width of ``x_i``. hidden_size: width of ``h_i`` and ``c_i``.
        align: the score (default ``"scaled_dot"``). align_options: options of a named score.
        normalize: ``"softmax"`` (rows sum to 1), ``"relu"``, ``"sigmoid"`` or a callable.
        bias: learn ``b``.
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        *,
        align="scaled_dot",
        align_options: dict | None = None,
        normalize="softmax",
        bias: bool = True,
    ):
        super().__init__(input_size, hidden_size, align, align_options, normalize)
        self.A = nn.Linear(input_size + hidden_size, hidden_size, bias=bias)

    def steps(
        self, x: torch.Tensor, mask: torch.Tensor | None = None, *, c0: torch.Tensor | None = None,
        truncate: int | None = None
    ) -> RecurrentOutput:
        """Run every step; returns hidden states, attention rows and summaries.

        Args:
            x: ``(B, N, input_size)``.
            mask: ``(B, N)`` bool, True at real positions (a prefix of each row).
            c0: ``(B, hidden_size)`` initial summary (default zeros).
            truncate: let gradients cross only the last ``truncate`` step-to-step hand-overs
                (``c_{i-1}`` is detached before step ``N - truncate``); None = all. Used to
                measure path lengths; the forward values do not change.
        """
        x, mask, grad, cut = self._begin(x, mask, truncate)
        b, n, _ = x.shape
        hid = self.hidden_size
        w_x, w_c = self.A.weight[:, : self.input_size], self.A.weight[:, self.input_size :]
        ax = x @ w_x.T  # (B, N, hidden): the input part of every step at once
        if self.A.bias is not None:
            ax = ax + self.A.bias
        c = x.new_zeros(b, hid) if c0 is None else c0.to(x)
        keys, hs = _Tape(x.new_empty(b, 1, 1, hid), n, grad), _Tape(x.new_empty(b, 1, 1, hid), n, grad)
        outs, mems = [], []
        weights = x.new_zeros(b, n, n)
        for i in range(n):
            if i < cut:
                c = c.detach()
            h = torch.tanh(ax[:, i] + c @ w_c.T)  # (B, hidden)
            q, k = self.align.prepare(h[:, None, None], h[:, None, None])
            keys.append(k)
            hs.append(h[:, None, None])
            w, (c,) = _read(self.align, self.normalize, q, keys.view(), [hs.view()])
            weights[:, i, : i + 1] = w[:, 0, 0]
            outs.append(h)
            mems.append(c)
        return _finish(torch.stack(outs, 1), weights, torch.stack(mems, 1), mask)


class LSTMN(_AttentionCell):
    """The Long Short-Term Memory-Network (Cheng, Dong & Lapata 2016, https://arxiv.org/abs/1601.06733).

    An LSTM whose single previous state is replaced by attention over a hidden tape
    ``(h_0 .. h_{t-1})`` and a memory tape ``(c_0 .. c_{t-1})`` (eqs. 3-7 of the paper)::

        s^t = normalize(align(q_t, h_i)),  q_t = P [x_t ; h~_{t-1}],   i = 0 .. t-1
        h~_t = sum_i s^t_i h_i,   c~_t = sum_i s^t_i c_i
        [i_t; f_t; o_t] = sigmoid(W [h~_t ; x_t] + b),   c^_t = tanh(W_c [h~_t ; x_t] + b_c)
        c_t = f_t * c~_t + i_t * c^_t,   h_t = o_t * tanh(c_t)

    The tapes start with the initial state ``h_0 = c_0 = 0`` (slot 0), so step ``t`` (0-based
    here) reads slots ``0 .. t``: weight column 0 is the initial state, column ``j >= 1`` the
    state written by step ``j - 1``; every row sums to 1 under softmax and is zero above the
    diagonal. The paper's score is additive, ``w^T tanh(W_h h_i + W_x x_t + W_h~ h~_{t-1})``:
    with ``align="additive"`` (the default) this is exactly ``Additive(P[x; h~], h_i)``, the
    query map folding ``W_x`` and ``W_h~``; any other attnlab score may be used instead.

    Args:
        input_size, hidden_size: widths of ``x_t`` and of ``h_t, c_t``.
        align, align_options, normalize: as for :class:`AttentionRNN` (default ``"additive"``).
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        *,
        align="additive",
        align_options: dict | None = None,
        normalize="softmax",
    ):
        super().__init__(input_size, hidden_size, align, align_options, normalize)
        self.query = nn.Linear(input_size + hidden_size, hidden_size, bias=False)  # P
        self.gates = nn.Linear(hidden_size + input_size, 4 * hidden_size)  # i, f, o, c^

    def steps(self, x: torch.Tensor, mask: torch.Tensor | None = None, *,
              truncate: int | None = None) -> RecurrentOutput:
        """Run every step; returns hidden states, attention rows and memory cells.

        Args:
            x: ``(B, N, input_size)``. mask: ``(B, N)`` bool, True at real positions (a prefix).
            truncate: let gradients cross only the last ``truncate`` step-to-step hand-overs
                (the tape reads ``h~, c~`` are detached before step ``N - truncate``); None = all.
        """
        x, mask, grad, cut = self._begin(x, mask, truncate)
        b, n, _ = x.shape
        hid, inp = self.hidden_size, self.input_size
        p_x, p_h = self.query.weight[:, :inp], self.query.weight[:, inp:]
        g_h, g_x = self.gates.weight[:, :hid], self.gates.weight[:, hid:]
        qx = x @ p_x.T  # (B, N, hidden)
        gx = x @ g_x.T + self.gates.bias  # (B, N, 4 hidden)
        like = x.new_empty(b, 1, 1, hid)
        keys, hs, cs = _Tape(like, n + 1, grad), _Tape(like, n + 1, grad), _Tape(like, n + 1, grad)
        zero = x.new_zeros(b, 1, 1, hid)
        h_tilde = x.new_zeros(b, hid)
        outs, mems = [], []
        weights = x.new_zeros(b, n, n)
        new_h = new_c = zero  # slot 0: the initial state
        for t in range(n):
            if t < cut:
                h_tilde = h_tilde.detach()
            q, k = self.align.prepare((qx[:, t] + h_tilde @ p_h.T)[:, None, None], new_h)
            keys.append(k)
            hs.append(new_h)
            cs.append(new_c)
            w, (h_tilde, c_tilde) = _read(self.align, self.normalize, q, keys.view(), [hs.view(), cs.view()])
            if t < cut:
                h_tilde, c_tilde = h_tilde.detach(), c_tilde.detach()
            weights[:, t, : t + 1] = w[:, 0, 0]
            i_g, f_g, o_g, c_hat = (gx[:, t] + h_tilde @ g_h.T).chunk(4, dim=-1)
            c = torch.sigmoid(f_g) * c_tilde + torch.sigmoid(i_g) * torch.tanh(c_hat)
            h = torch.sigmoid(o_g) * torch.tanh(c)
            outs.append(h)
            mems.append(c)
            new_h, new_c = h[:, None, None], c[:, None, None]
        return _finish(torch.stack(outs, 1), weights, torch.stack(mems, 1), mask)


def _finish(out, weights, memory, mask) -> RecurrentOutput:
    if mask is not None:
        pad = ~mask[..., None]
        out, memory = out.masked_fill(pad, 0.0), memory.masked_fill(pad, 0.0)
        weights = weights.masked_fill(pad, 0.0)
    return RecurrentOutput(out, weights, memory)
