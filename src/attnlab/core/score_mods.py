"""Score functions: ``score_mod(score, b, h, q_idx, kv_idx) -> score``, applied to each score before the mask and the
normaliser.

FlexAttention's ``score_mod`` signature (``torch.nn.attention.flex_attention``), so the same
callables run on both; attnlab calls them with broadcasting index tensors on a block of scores
at a time, so a bias over all ``N x M`` pairs is never materialised. Every score function here
is a :class:`ScoreMod`: a callable that lists the tensors it learns (``params``), which
:func:`attnlab.attend` differentiates block by block.

* :func:`alibi` — ``s + m_h (j - i)`` (Press et al. 2022, https://arxiv.org/abs/2108.12409);
* :func:`softcap` — ``c tanh(s / c)`` (Gemma 2's logit soft-capping, https://arxiv.org/abs/2408.00118);
* :func:`offset_bias` — ``s + b_h(pos_j - pos_i)`` for any per-head function of the offset (the
  positional encodings ``alibi`` and ``relative`` give theirs through
  :meth:`attnlab.positional.PositionalEncoding.score_mod`);
* :func:`compose` — one after another.

A score function may also be a plain function or lambda that captures learnable tensors,
FlexAttention's idiom (``lambda s, b, h, q, k: s + table[h, q - k]``): :func:`learnable_tensors`
finds what it captures (closure cells, default arguments, the globals it names, a bound
method's object, a ``functools.partial``'s arguments, a callable object's attributes), and
:func:`check_learnable` refuses one whose result depends on a tensor that requires grad but
could not be found, so a gradient is never silently lost.
"""

from __future__ import annotations

import dis
import functools
import itertools
import math
import types
from collections.abc import Callable, Iterable

import torch

from ..validate import ArgumentTypeError, number_above, positive_int

__all__ = ["ScoreMod", "alibi", "check_learnable", "compose", "learnable_tensors", "offset_bias", "softcap"]


class ScoreMod:
    """A score function with the tensors it learns.

    Args:
        fn: ``(score, b, h, q_idx, kv_idx) -> score`` (broadcasting index tensors).
        params: tensors ``fn`` depends on that may need gradients.
        name: shown in ``repr``.
    """

    def __init__(self, fn: Callable, params: Iterable[torch.Tensor] = (), name: str = "score_mod"):
        if not callable(fn):
            raise ArgumentTypeError("a score function must be callable (score, b, h, q_idx, kv_idx) -> score, got "
                                    f"{type(fn).__name__}")
        self.fn, self.params, self.name = fn, list(params), name

    def __call__(self, score, b, h, q_idx, kv_idx):
        return self.fn(score, b, h, q_idx, kv_idx)

    def __repr__(self) -> str:
        return f"{self.name}"


def compose(*mods) -> ScoreMod | None:
    """The score functions applied one after another (None ones skipped; none at all: None)."""
    present = [m for m in mods if m is not None]
    for m in present:
        if not callable(m):
            raise ArgumentTypeError(f"a score function must be callable, got {type(m).__name__}")
    if not present:
        return None
    if len(present) == 1:
        return present[0] if isinstance(present[0], ScoreMod) else ScoreMod(present[0])

    def run(score, b, h, q_idx, kv_idx):
        for m in present:
            score = m(score, b, h, q_idx, kv_idx)
        return score

    params = [p for m in present for p in (m.params if isinstance(m, ScoreMod)
                                           else getattr(m, "parameters", lambda: [])())]
    return ScoreMod(run, params, " + ".join(repr(m) for m in present))


def softcap(cap: float) -> ScoreMod:
    """Soft-capping ``c tanh(s / c)``: scores squashed smoothly into ``(-c, c)`` (Gemma 2 uses c = 50
    on attention logits). Differentiable; the identity in the limit ``c -> inf``."""
    c = number_above("cap", cap, 0)
    return ScoreMod(lambda s, b, h, q, kv: c * torch.tanh(s / c), name=f"softcap({c})")


def _at(pos: torch.Tensor | None, b, idx):
    """Position of index ``idx`` in row ``b``: ``idx`` itself, ``pos[idx]`` or ``pos[b, idx]``."""
    if pos is None:
        return idx
    pos = pos.to(idx.device)
    return pos[idx] if pos.dim() == 1 else pos[b, idx]


def offset_bias(head_bias: Callable, q_positions: torch.Tensor | None = None, kv_positions: torch.Tensor | None = None,
                *, params: Iterable[torch.Tensor] = (), name: str = "offset_bias") -> ScoreMod:
    """``s + head_bias(h, pos_j - pos_i)``: a per-head bias of the offset between a key's and a
    query's positions (``(N,)``, ``(B, N)`` per row, or None: the indices).

    Args:
        head_bias: ``(h, offsets) -> bias``, elementwise with broadcasting (``h`` an index tensor).
        params: the tensors ``head_bias`` learns (a relative bias table).
    """

    def fn(score, b, h, q_idx, kv_idx):
        off = _at(kv_positions, b, kv_idx) - _at(q_positions, b, q_idx)
        return score + head_bias(h, off).to(score.dtype)

    return ScoreMod(fn, params, name)


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """The heads' slopes ``m_h``: a geometric sequence, float64 ``(H,)``.

    For H a power of two: ``m_h = 2^(-8 h / H)``, h = 1..H (8 heads: 1/2, 1/4, ..., 1/256).
    Otherwise, as in the paper's code: the slopes of the largest power of two ``P < H``, then
    every other slope of ``2 P`` heads (the odd-numbered ones) until there are H.
    """
    h = positive_int("num_heads", num_heads)

    def power_of_two(n: int) -> list[float]:
        return [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]

    if h & (h - 1) == 0:
        return torch.tensor(power_of_two(h), dtype=torch.float64)
    p = 2 ** int(math.floor(math.log2(h)))
    return torch.tensor(power_of_two(p) + power_of_two(2 * p)[0::2][: h - p], dtype=torch.float64)


def alibi(num_heads: int, *, symmetric: bool = False, q_positions=None, kv_positions=None) -> ScoreMod:
    """ALiBi: ``s + m_h (j - i)`` with the heads' slopes :func:`alibi_slopes` (``-m_h |j - i|``
    when ``symmetric``, for attention without a causal mask)."""
    slopes = alibi_slopes(num_heads)

    def head_bias(h, off):
        m = slopes.to(off.device)[h]
        return m * (-off.abs() if symmetric else off)

    return offset_bias(head_bias, q_positions, kv_positions,
                       name=f"alibi({num_heads}{', symmetric' if symmetric else ''})")


_WALK_DEPTH = 6
"""How deep :func:`learnable_tensors` follows references from the function it is given."""

_WALK_ITEMS = 1024
"""How many items of one list, tuple, set or dict :func:`learnable_tensors` looks at."""

_ATOMS = (str, bytes, int, float, complex, bool, type, types.ModuleType)


def learnable_tensors(fn) -> list[torch.Tensor]:
    """The tensors that require grad which ``fn`` (a score function, or a score callable) can reach:
    an ``nn.Module``'s parameters and tensor attributes, a :class:`ScoreMod`'s ``params`` and its
    function, a function's closure cells, default arguments and the globals its code names
    (nested functions and lambdas included), a bound method's object, a ``functools.partial``'s
    function and arguments, an object's attributes (a callable object's, a bound method's), and the lists, tuples, sets
    and dicts among them; each tensor once, in the order found. Leaf parameters and tensors computed
    from them (``table = weight * 2`` captured after the product) alike: the gradient reaches
    whichever is captured, and autograd carries it on from there."""
    found: dict[int, torch.Tensor] = {}
    seen: dict[int, int] = {}  # id -> the smallest depth it was walked at (a shallower visit walks deeper)

    def tensor(t: torch.Tensor) -> None:
        if t.requires_grad and id(t) not in found:
            found[id(t)] = t

    def walk(obj, depth: int) -> None:
        if isinstance(obj, torch.Tensor):
            tensor(obj)
            return
        if depth > _WALK_DEPTH or seen.get(id(obj), _WALK_DEPTH + 1) <= depth or isinstance(obj, _ATOMS):
            return
        seen[id(obj)] = depth
        if isinstance(obj, torch.nn.Module):
            for p in obj.parameters():
                tensor(p)
            for name, value in vars(obj).items():
                if not name.startswith("_"):
                    walk(value, depth + 1)
            return
        if isinstance(obj, ScoreMod):
            walk(obj.params, depth + 1)
            walk(obj.fn, depth + 1)
            return
        if isinstance(obj, (list, tuple, set, frozenset, dict)):
            for item in itertools.islice(obj.values() if isinstance(obj, dict) else obj, _WALK_ITEMS):
                walk(item, depth + 1)
            return
        if isinstance(obj, types.MethodType):
            walk(obj.__self__, depth + 1)
            walk(obj.__func__, depth + 1)
            return
        if isinstance(obj, functools.partial):
            walk(obj.func, depth + 1)
            walk(obj.args, depth + 1)
            walk(obj.keywords, depth + 1)
            return
        if isinstance(obj, types.FunctionType):
            for cell in obj.__closure__ or ():
                try:
                    walk(cell.cell_contents, depth + 1)
                except ValueError:  # an empty cell (a name not yet bound)
                    pass
            walk(obj.__defaults__, depth + 1)
            walk(obj.__kwdefaults__, depth + 1)
            for name in _global_names(obj.__code__):
                if name in obj.__globals__:
                    walk(obj.__globals__[name], depth + 1)
            return
        if hasattr(obj, "__dict__"):  # a callable object, a bound method's object: their attributes
            walk(vars(obj), depth + 1)

    walk(fn, 0)
    return list(found.values())


@functools.cache
def _global_names(code: types.CodeType) -> frozenset[str]:
    """The global names a function's code and the functions defined in it load (not the
    attribute names its code also lists in ``co_names``)."""
    names = {ins.argval for ins in dis.get_instructions(code) if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return frozenset(names)


def check_learnable(score_mod, found: Iterable[torch.Tensor], dtype: torch.dtype, device) -> None:
    """Refuse ``score_mod`` if its result depends on a tensor that requires grad other than
    ``found`` (what :func:`learnable_tensors` reached): that tensor would get no gradient.

    The score function runs once on one score (index 0 everywhere) with autograd on; the graph
    of its result is walked back to its leaves, stopping at the tensors in ``found`` (the random
    generators are restored afterwards). Nothing is checked when autograd is off (no gradient is
    asked for)."""
    if not torch.is_grad_enabled():
        return
    idx = torch.zeros((1, 1, 1, 1), dtype=torch.long, device=device)
    devices = [device] if torch.device(device).type == "cuda" else []
    # a score function that draws leaves the generators as they were
    with torch.random.fork_rng(devices=devices), torch.enable_grad():
        out = score_mod(torch.zeros((1, 1, 1, 1), dtype=dtype, device=device), idx, idx, idx, idx)
    if not isinstance(out, torch.Tensor) or out.grad_fn is None:
        return
    stops = {t.grad_fn for t in found if t.grad_fn is not None}
    leaves = {id(t) for t in found if t.grad_fn is None}
    missed: list[torch.Tensor] = []
    stack: list = [out.grad_fn]
    visited: set = set()
    while stack:
        node = stack.pop()
        if node is None or node in visited or node in stops:
            continue
        visited.add(node)
        var = getattr(node, "variable", None)  # an AccumulateGrad node: a leaf that requires grad
        if isinstance(var, torch.Tensor):
            if id(var) not in leaves:
                missed.append(var)
            continue
        stack.extend(nxt for nxt, _ in node.next_functions)
    if missed:
        shapes = ", ".join(str(tuple(t.shape)) for t in missed)
        raise ValueError(f"the score function {score_mod!r} depends on learnable tensor(s) of shape {shapes} that "
                         "attnlab cannot reach, so they would get no gradient: capture them in the function's closure "
                         "or default arguments, or pass them as ScoreMod(fn, params=[...]), or make the score function "
                         "an nn.Module")
