"""Fidelity against speed without retraining: every efficient attention swapped into a trained model.

The question researchers ask of the efficient variants — "can I drop this into my trained
model?" — measured on a real one: a pretrained BERT-family encoder (all-MiniLM-L6-v2 by
default) is loaded once as trained (``dense``) and once per (variant, budget) with every
block's softmax attention replaced (:func:`attnlab.pretrained.load` with ``attention=``), the
trained projections kept and nothing retrained. On real text from every machine — the Python
standard library's docstrings — at sequence length N (128 and 512 word pieces):

* **fidelity**: the cosine similarity of each document's sentence embedding under the swapped
  model to the one under the trained model (mean and minimum over the documents);
* **retrieval**: query = a docstring's first line, document = the rest of the docstring and the
  code it documents, cut to N tokens; recall@1 of the query among all the documents by cosine
  of the embeddings (queries and documents both through the swapped model), and its change
  against the trained model;
* **speed and memory**: one forward pass over a batch of documents at exactly N tokens, timed
  round-robin with the trained model in one process; time and peak tensor memory relative to it;
  and the attention step alone (the first block's, on the trained model's q, k, v of that batch),
  relative to the trained model's (PyTorch's fused kernel).

Only documents with at least N tokens are used at length N, so that every one is N long.
"""

from __future__ import annotations

import ast
import random
import sysconfig
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from .. import efficient
from ..profiling import measure_calls
from .records import StudyRecord

__all__ = ["DocPair", "PretrainedRecord", "SwapRecord", "budgets_for", "default_variants", "docstring_pairs", "run"]

QUERY_TOKENS = 64
"""Queries (a docstring's first line) are cut to this many tokens."""


@dataclass(frozen=True)
class DocPair:
    """A retrieval pair: ``query`` (a docstring's first line) and ``document`` (the rest of the
    docstring, then the code it documents without the docstring); ``name`` = ``module:qualname``."""

    name: str
    query: str
    document: str


def _pairs_in(path: Path, root: Path) -> Iterable[DocPair]:
    try:
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (SyntaxError, UnicodeDecodeError, OSError):
        return
    module = ".".join(path.relative_to(root).with_suffix("").parts)
    lines = source.splitlines(keepends=True)

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                yield child, name
                yield from walk(child, name + ".")

    for node, name in walk(tree, ""):
        doc = ast.get_docstring(node)
        if not doc:
            continue
        first, _, body = doc.partition("\n")
        first, body = first.strip(), body.strip()
        if len(first.split()) < 4 or len(body.split()) < 10:
            continue
        expr = node.body[0]  # the docstring's own statement: cut it out of the code
        code = "".join(lines[node.lineno - 1 : expr.lineno - 1] + lines[expr.end_lineno : node.end_lineno])
        yield DocPair(f"{module}:{name}", first, body + "\n\n" + code)


def docstring_pairs(count: int | None = None, *, seed: int = 0, root: str | Path | None = None) -> list[DocPair]:
    """Retrieval pairs from the standard library's source (``sysconfig``'s ``stdlib`` folder,
    tests and site-packages left out): one per documented function or class whose docstring has
    a first line of >= 4 words and a body of >= 10, first lines unique. Shuffled with ``seed``;
    the first ``count`` (all with None)."""
    root = Path(sysconfig.get_paths()["stdlib"] if root is None else root)
    if not root.is_dir():
        raise ValueError(f"{root} is not a folder")
    skip = {"test", "tests", "site-packages", "idlelib", "lib2to3", "__pycache__"}
    seen, pairs = set(), []
    for path in sorted(root.rglob("*.py")):
        if skip & set(path.relative_to(root).parts):
            continue
        for p in _pairs_in(path, root):
            if p.query not in seen:
                seen.add(p.query)
                pairs.append(p)
    random.Random(seed).shuffle(pairs)
    return pairs if count is None else pairs[:count]


@dataclass
class SwapRecord(StudyRecord):
    """What every row of ``bench pretrained`` names: the trained ``model``, the attention
    ``variant`` swapped in with its ``options`` (``budget``: their label) and the length ``n``."""

    model: str
    variant: str
    options: dict
    budget: str
    n: int


@dataclass
class PretrainedRecord(SwapRecord):
    """One (variant, budget, N) of ``model``. ``cosine_mean`` / ``cosine_min``: the documents' embeddings
    against the trained model's; ``recall_at_1`` and ``recall_delta`` (against the trained
    model's); ``time_ratio`` / ``memory_ratio``: one forward pass relative to the trained model
    (None where not measured), ``seconds`` its median time over ``batch`` documents;
    ``step_ratio``: the attention step alone relative to the trained model's."""

    documents: int
    batch: int
    cosine_mean: float
    cosine_min: float
    recall_at_1: float
    recall_delta: float
    seconds: float | None = None
    time_ratio: float | None = None
    memory_ratio: float | None = None
    step_ratio: float | None = None


def default_variants() -> list[str]:
    """The variants swapped into the trained model by default, from their declared capabilities:
    every step that takes the model's q, k and v alone (not those that read the layer's input for
    gates: theirs would be untrained), but the references of another (``dense_naive``) and dense
    (the trained model itself), in the order of registration."""
    return [v for v in efficient.select(mixer=False, reference=False) if v != "dense"]


def budgets_for(variant: str, n: int, max_points: int = 3) -> list[tuple[str, dict]]:
    """The budgets measured for ``variant`` at length ``n``: the points of its
    :attr:`attnlab.efficient.Budget.sweep` below ``n`` (where it approximates; the largest
    ``max_points``; its smallest point where none is below ``n``), as ``(label, options)``.
    ``dense``: the trained model itself. A point can change nothing at a short ``n`` (bigbird's
    random blocks where its window already covers every block)."""
    if variant == "dense":
        return [("trained", {})]
    b = efficient.budget(variant)
    if b.sweep is None:
        return [("default", dict(b.long or {}))]
    if b.sweep.option is None:
        return [("(none)", b.sweep_options(0, n=n, seed=0))]
    values = [v for v in b.sweep.values if v < n][-max_points:] or [min(b.sweep.values)]
    return [(f"{b.sweep.option}={v}", b.sweep_options(v, n=n, seed=0)) for v in values]


def _recall_at_1(queries: torch.Tensor, docs: torch.Tensor) -> float:
    sims = F.normalize(queries, dim=-1) @ F.normalize(docs, dim=-1).T
    return float((sims.argmax(-1) == torch.arange(len(queries), device=sims.device)).double().mean())


def run(
    model: str = "all-MiniLM-L6-v2",
    variants: Iterable[str] | None = None,
    lengths: Iterable[int] = (128, 512),
    *,
    pairs: int = 200,
    timing_batch: int = 8,
    memory: bool = True,
    max_points: int = 3,
    on_record: Callable[[PretrainedRecord], None] | None = None,
    texts: list[DocPair] | None = None,
    device: str | torch.device = "cpu",
) -> list[PretrainedRecord]:
    """Measure every (variant, budget) of :func:`budgets_for` at every length (see the module docstring).

    Args:
        model: a name or folder for :func:`attnlab.pretrained.load`.
        variants: efficient variants (default: :func:`default_variants`).
        pairs: retrieval pairs per length (fewer where fewer documents are that long).
        timing_batch: documents per timed forward pass.
        memory: also measure peak tensor memory.
        texts: the pairs to use (default :func:`docstring_pairs`).
        device: where every model runs (timed between synchronisations on a GPU, memory from its
            allocator on CUDA: :func:`attnlab.profiling.measure_calls`).
    """
    from ..pretrained import load

    variants = default_variants() if variants is None else list(variants)
    for v in variants:
        if v not in efficient.names():
            raise ValueError(f"unknown attention variant {v!r}; expected some of {efficient.names()}")
    lengths = [int(n) for n in lengths]
    trained = load(model, device=device)
    for n in lengths:
        if not 2 <= n <= trained.max_length:
            raise ValueError(f"lengths must be in 2 .. {trained.max_length} (the model's positions), got {n}")
    pool = docstring_pairs() if texts is None else list(texts)
    counts = [len(e.ids) for e in trained.tokenizer.encode_batch([p.document for p in pool])]
    query_tokens = min(QUERY_TOKENS, trained.max_length)
    out = []

    def embed(m, texts, limit):
        return m.embed(texts, batch_size=timing_batch, truncate=True, max_length=limit)

    for n in lengths:
        chosen = [p for p, c in zip(pool, counts) if c >= n][:pairs]
        if len(chosen) < 2:
            raise ValueError(f"fewer than 2 documents have {n} tokens")
        queries, docs = [p.query for p in chosen], [p.document for p in chosen]
        ref_docs = embed(trained, docs, n)
        ref_recall = _recall_at_1(embed(trained, queries, query_tokens), ref_docs)
        timing = trained.encode(docs[:timing_batch], truncate=True, max_length=n)
        dev = next(trained.parameters()).device
        timing = type(timing)(timing.ids.to(dev), timing.token_type_ids.to(dev), timing.padding.to(dev), timing.tokens)
        configs = [("dense", "trained", {})] + [(v, label, opts) for v in variants
                                                for label, opts in budgets_for(v, n, max_points)]
        models, recs = {}, {}
        for i, (v, label, opts) in enumerate(configs):
            m = trained if v == "dense" else load(model, attention=v, attention_options=opts, device=device)
            d = ref_docs if v == "dense" else embed(m, docs, n)
            cos = F.cosine_similarity(d, ref_docs, dim=-1)
            recall = ref_recall if v == "dense" else _recall_at_1(embed(m, queries, query_tokens), d)
            recs[i] = PretrainedRecord(str(model), v, opts, label, n, len(chosen), timing_batch, float(cos.mean()),
                                       float(cos.min()), recall, recall - ref_recall)
            models[i] = m
        calls = {i: (lambda m=m: m(timing)) for i, m in models.items()}  # noqa: B023  (called in this iteration)
        with torch.no_grad():
            measured = measure_calls(calls, memory=memory, device=dev)
            x = trained.model.embeddings(timing.ids, timing.token_type_ids)
            q, k, v, _ = trained.model.encoder.layers[0].attn.project(x)  # (B, H, N, D): the first block's heads
            keys = timing.padding[:, None, None, :]
            steps = measure_calls(  # the lambdas are called in this iteration
                {i: (lambda m=m: m.model.encoder.layers[0].attn.step(q, k, v, mask=keys))  # noqa: B023
                 for i, m in models.items()}, memory=False, device=dev)
        base_t, base_m = measured[0][0], measured[0][1]
        for i, rec in recs.items():
            t, peak, _ = measured[i]
            rec.seconds, rec.time_ratio = t, t / base_t
            rec.memory_ratio = peak / base_m if peak is not None and base_m else None
            rec.step_ratio = steps[i][0] / steps[0][0]
            out.append(rec)
            if on_record is not None:
                on_record(rec)
        del models, calls
    return out
