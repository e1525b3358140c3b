"""``listops``: nested MAX / MIN / MED / SUM_MOD expressions over digits (after Long Range Arena).

Our own generator (LRA's is not used): an expression is a digit or ``[OP a_1 ... a_k ]`` with
2 to ``max_args`` arguments, nested to at most ``max_depth``; ``MED`` is the median (lower middle
for an even count), ``SM`` the sum modulo 10. Expressions are drawn until their token count lies
in ``[min_length, max_length]`` (each drawn within a token budget picked uniformly in that range).
The label is the value, 0 .. 9 (ten classes).
"""

from __future__ import annotations

import random

from .base import FIRST, Split, Task, pad_rows, register, split_sizes

__all__ = ["make_listops", "evaluate_listops"]

OPS = ["MAX", "MIN", "MED", "SM"]
VOCAB = ["<pad>", "<cls>", *[str(d) for d in range(10)], *[f"[{o}" for o in OPS], "]"]


def _apply(op: str, args: list[int]) -> int:
    if op == "MAX":
        return max(args)
    if op == "MIN":
        return min(args)
    if op == "MED":
        return sorted(args)[(len(args) - 1) // 2]
    return sum(args) % 10


def _expr(rng: random.Random, depth: int, max_depth: int, max_args: int, budget: int) -> list[str]:
    """A random expression of at most ``budget`` tokens."""
    if budget < 4 or depth >= max_depth or (depth > 0 and rng.random() < 0.25):
        return [str(rng.randint(0, 9))]
    k = rng.randint(2, min(max_args, budget - 2))
    out, left = ["[" + rng.choice(OPS)], budget - 2  # the operator and its "]"
    for i in range(k):
        args_after = k - i - 1
        share = max(1, min(left - args_after, 2 * left // (args_after + 1)))  # leave a token for each later argument
        sub = _expr(rng, depth + 1, max_depth, max_args, share)
        out += sub
        left -= len(sub)
    return out + ["]"]


def evaluate_listops(tokens: list[str]) -> int:
    """The value of a token list such as ``["[MAX", "2", "9", "]"]``."""
    stack: list[tuple[str, list[int]]] = []
    value = None
    for t in tokens:
        if t.startswith("["):
            stack.append((t[1:], []))
        elif t == "]":
            op, args = stack.pop()
            v = _apply(op, args)
            if stack:
                stack[-1][1].append(v)
            else:
                value = v
        else:
            if stack:
                stack[-1][1].append(int(t))
            else:
                value = int(t)
    if stack or value is None:
        raise ValueError("unbalanced listops expression")
    return value


@register("listops", train_defaults={"steps": 3000, "batch_size": 32, "lr": 5e-4, "embed_dim": 64, "num_layers": 4,
                                     "pooling": "cls", "positional": "sinusoidal"})
def make_listops(size: int = 10000, seed: int = 0, min_length: int = 16, max_length: int = 128, max_depth: int = 6,
                 max_args: int = 5) -> Task:
    """The ``listops`` task (classification, 10 classes); ``max_length`` is the length knob.

    Args:
        size: training expressions (val and test: size / 8 each, at least 64). seed: the generator's.
        min_length: the fewest tokens of an expression. max_length: the most.
        max_depth: the deepest nesting of operations. max_args: the most arguments of one operation.
    """
    if not 1 <= min_length <= max_length:
        raise ValueError(f"need 1 <= min_length <= max_length, got {min_length} and {max_length}")
    rng = random.Random(seed)
    ids = {t: i for i, t in enumerate(VOCAB)}
    splits, majority = {}, 0.0
    for name, count in split_sizes(size).items():
        rows, labels = [], []
        while len(rows) < count:
            e = _expr(rng, 0, max_depth, max_args, rng.randint(min_length, max_length))
            if min_length <= len(e) <= max_length:
                rows.append([ids[t] for t in e])
                labels.append(evaluate_listops(e))
        lab = pad_rows([labels], 0)[0]
        splits[name] = Split(pad_rows(rows, 0), lab)
        if name == "test":
            majority = float(lab.bincount(minlength=10).max()) / len(lab)
    assert FIRST == 2  # digits are ids 2..11
    return Task(
        name="listops",
        kind="classification",
        vocab_size=len(VOCAB),
        num_labels=10,
        metric="accuracy",
        splits=splits,
        options={"size": size, "seed": seed, "min_length": min_length, "max_length": max_length, "max_depth": max_depth,
                 "max_args": max_args},
        vocab=list(VOCAB),
        label_names=[str(d) for d in range(10)],
        baseline={"majority": majority},
    )
