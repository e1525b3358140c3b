"""A trained decoder with every attention variant swapped in, through transformers: perplexity against speed.

The decoder half of ``attnlab bench pretrained`` (:mod:`attnlab.studies.pretrained` is the
encoder half). The model is any folder of a ``transformers`` causal language model in the
Hugging Face layout (``config.json``, the weights, ``tokenizer.json``), loaded once per row with
``attn_implementation`` set by :mod:`attnlab.integrations.transformers` — the trained weights
kept, nothing retrained — or the name ``docs-llama``: no decoder small enough for this machine
ships in a registry package, so a small Llama (4 layers of width 128, 4 query and 2 key/value
heads, rope, one token per byte) is trained here on first use on the first 90 % of Python's
documentation topics (:func:`attnlab.tasks.docs.docs_text`, the ``docs`` task's split), through
``attn_implementation="attnlab"`` itself, and cached (:func:`decoder_folder`).

On the held-out text (the last 5 %, never trained on), cut into windows of N tokens:

* **perplexity** per token of each row, and its ratio to the trained model's;
* **speed**: one forward pass over ``timing_batch`` windows, timed round-robin with every other
  row in one process, relative to the model under transformers' own ``sdpa``.

The rows: ``sdpa`` (the model as transformers runs it), ``attnlab`` (the exact backend: the same
perplexity, and its speed against sdpa), for a hybrid model (Qwen3-Next, Qwen3.5, Kimi Linear,
Mamba-2, Falcon-H1) ``kernels`` (the exact backend with its linear-attention layers through
attnlab's recurrences, :func:`attnlab.integrations.hybrid.use_kernels`), then every variant with a
causal form at its budgets (:func:`attnlab.studies.pretrained.budgets_for`).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from .. import efficient
from ..profiling import measure_calls
from ..validate import int_at_least, number_above, positive_int
from .pretrained import SwapRecord

__all__ = ["DECODERS", "DecoderRecord", "TRAINING", "byte_tokenizer", "decoder_folder", "decoder_variants",
           "heldout_windows", "is_decoder", "is_hybrid", "run", "train_decoder"]

DECODERS = {
    "docs-llama": "a 0.8M-parameter Llama trained here on Python's documentation topics (a few minutes, cached)"}
"""Decoders known by name: trained on first use, then read from the cache."""

TRAINING = dict(steps=800, length=512, batch=8, lr=2e-3, warmup=50, seed=0)
"""How ``docs-llama`` is trained: AdamW steps, window length, windows per step, peak learning rate."""


def byte_tokenizer():
    """A ``tokenizers`` tokenizer with one token per UTF-8 byte (the 256 byte-level symbols, no merges)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def _splits(tok) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The docs text's tokens in three contiguous parts: 90 % train, 5 % validation, 5 % test."""
    from ..tasks.docs import docs_text

    ids = torch.tensor(tok.encode(docs_text().decode("utf-8")).ids)
    a, b = int(len(ids) * 0.9), int(len(ids) * 0.95)
    return ids[:a], ids[a:b], ids[b:]


def _windows(ids: torch.Tensor, n: int, count: int | None = None) -> torch.Tensor:
    w = ids[: len(ids) // n * n].reshape(-1, n)
    return w if count is None else w[:count]


@torch.no_grad()
def _perplexity(model, windows: torch.Tensor, batch: int = 8) -> float:
    """exp(mean next-token cross-entropy) over every predicted token of ``windows`` ``(W, N)`` (moved to the model's
    device)."""
    total, count = 0.0, 0
    device = next(model.parameters()).device
    for i in range(0, len(windows), batch):
        x = windows[i : i + batch].to(device)
        logits = model(input_ids=x, use_cache=False).logits[:, :-1].double()
        total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum").item()
        count += x[:, 1:].numel()
    return math.exp(total / count)


def train_decoder(folder: str | Path, *, on_step: Callable[[int, float], None] | None = None, **overrides) -> dict:
    """Train ``docs-llama`` (:data:`TRAINING`, any of it overridden) and write it to ``folder``
    in the Hugging Face layout (written whole into a temporary folder, then renamed: a killed run
    leaves nothing half-written). ``on_step(step, loss)`` after every step. Returns what
    ``training.json`` holds: the settings, the seconds and the validation perplexity."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    import attnlab.integrations.transformers  # noqa: F401  (attn_implementation="attnlab")

    unknown = sorted(set(overrides) - set(TRAINING))
    if unknown:
        raise ValueError(f"unknown training setting(s) {', '.join(unknown)}; expected some of {', '.join(TRAINING)}")
    spec = {**TRAINING, **overrides}
    for key in ("steps", "batch", "warmup"):
        positive_int(key, spec[key])
    int_at_least("length", spec["length"], 2)
    number_above("lr", spec["lr"], 0)
    tok = byte_tokenizer()
    train, val, _ = _splits(tok)
    n = spec["length"]
    config = LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=n,
                         tie_word_embeddings=True, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec["seed"])
        model = AutoModelForCausalLM.from_config(config, attn_implementation="attnlab")  # a LlamaForCausalLM
        opt = torch.optim.AdamW(model.parameters(), lr=spec["lr"], weight_decay=0.01)
        steps, warm = spec["steps"], spec["warmup"]
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps))))
        start = time.perf_counter()
        model.train()
        for step in range(steps):
            at = torch.randint(0, len(train) - n, (spec["batch"],))
            x = torch.stack([train[s : s + n] for s in at.tolist()])
            loss = model(input_ids=x, labels=x).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            if on_step is not None:
                on_step(step + 1, loss.item())
    model.eval()
    info = {**spec, "seconds": round(time.perf_counter() - start, 1),
            "validation_perplexity": _perplexity(model, _windows(val, n)),
            "data": "pydoc_data.topics, first 90 % (the docs task's training split), one token per byte"}
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
    try:
        model.save_pretrained(tmp)
        tok.save(str(tmp / "tokenizer.json"))
        (tmp / "training.json").write_text(json.dumps(info, indent=1))
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return info


def decoder_folder(name_or_path: str | Path, *, on_step: Callable[[int, float], None] | None = None) -> Path:
    """The folder of a decoder: a path (Hugging Face layout), or a name of :data:`DECODERS`,
    trained into the cache (``$ATTNLAB_CACHE`` or ``~/.cache/attnlab``) the first time."""
    from ..tasks.speech import cache_dir

    text = str(name_or_path)
    if text in DECODERS:
        folder = cache_dir() / "models" / f"{text}-v1"
        if not (folder / "training.json").exists():
            train_decoder(folder, on_step=on_step)
        return folder
    path = Path(text).expanduser()
    if not (path / "config.json").exists():
        raise ValueError(f"{text!r} is neither a decoder folder (config.json, weights, tokenizer.json) nor a known "
                         f"name ({', '.join(DECODERS)})")
    return path


def is_decoder(name_or_path: str | Path) -> bool:
    """Whether the model is a decoder: a name of :data:`DECODERS`, or a folder whose ``config.json``
    names a causal language model (an architecture ending in ``ForCausalLM`` or ``LMHeadModel``)."""
    text = str(name_or_path)
    if text in DECODERS:
        return True
    try:
        archs = json.loads((Path(text).expanduser() / "config.json").read_text()).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return False
    return any(str(a).endswith(("ForCausalLM", "LMHeadModel")) for a in archs)


def is_hybrid(folder: str | Path) -> bool:
    """Whether a decoder folder's model has linear-attention layers attnlab's kernels serve (its
    ``model_type`` is one of :data:`attnlab.integrations.hybrid.MODEL_TYPES`)."""
    from ..integrations.hybrid import MODEL_TYPES

    try:
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return config.get("model_type") in MODEL_TYPES


def decoder_variants() -> list[str]:
    """The variants a causal language model can take, from their declared capabilities: a causal
    form, not a reference of another, and q, k, v from the model (an ``attnlab:<variant>``
    implementation of :mod:`attnlab.integrations.transformers`; the exact layer is the ``attnlab``
    row itself), sorted by name."""
    from ..integrations.transformers import NAME, implementation

    out = []
    for v in sorted(efficient.select(causal=True, reference=False)):
        try:
            if implementation(v) != NAME:
                out.append(v)
        except ValueError:  # a sequence mixer computes gates from the layer's input: it cannot take the model's q, k, v
            continue
    return out


def heldout_windows(folder: Path, n: int, count: int) -> torch.Tensor:
    """``(W, n)`` token windows of held-out text: the docs text's test part for ``docs-llama``
    (one token per byte), the standard library's docstrings' documents through the folder's
    ``tokenizer.json`` for another model."""
    from tokenizers import Tokenizer

    if not (folder / "tokenizer.json").is_file():
        raise ValueError(f"{folder} has no tokenizer.json: the held-out text is cut into tokens by the "
                         "model's own tokenizer")
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    if (folder / "training.json").exists():
        return _windows(_splits(tok)[2], n, count)
    from .pretrained import docstring_pairs

    ids = torch.tensor([i for p in docstring_pairs(count * 4) for i in tok.encode(p.document).ids])
    return _windows(ids, n, count)


@dataclass
class DecoderRecord(SwapRecord):
    """One row: ``variant`` (``sdpa``: transformers' own attention; ``attnlab``: the exact
    backend) at ``budget`` on ``windows`` held-out windows of ``n`` tokens: ``perplexity`` and
    ``ratio`` (to the trained model's under sdpa); ``seconds`` per forward pass over ``batch``
    windows and ``time_ratio`` (to sdpa's)."""

    windows: int
    batch: int
    perplexity: float
    ratio: float
    seconds: float | None = None
    time_ratio: float | None = None


def run(model: str = "docs-llama", variants: Iterable[str] | None = None, lengths: Iterable[int] = (512,), *,
        windows: int = 32, timing_batch: int = 4, max_points: int = 3,
        on_record: Callable[[DecoderRecord], None] | None = None, on_step: Callable[[int, float], None] | None = None,
        device: str | torch.device = "cpu") -> list[DecoderRecord]:
    """Measure the rows of the module docstring at every length.

    Args:
        model: a decoder folder or a name of :data:`DECODERS` (trained first if not cached).
        variants: default :func:`decoder_variants`.
        windows: held-out windows per length. timing_batch: windows per timed forward pass.
        on_step: ``(step, loss)`` while a named decoder is trained (on the CPU, whatever ``device``:
            the cached model is the same on every machine).
        device: where every row runs (timed between synchronisations on a GPU).
    """
    from transformers.utils import logging as hf_logging

    known = decoder_variants()
    variants = known if variants is None else list(variants)
    for v in variants:
        if v not in efficient.names():
            raise ValueError(f"unknown attention variant {v!r}; expected some of {', '.join(known)}")
        if v not in known:
            raise ValueError(f"the {v!r} attention cannot serve a causal language model; expected some of "
                             f"{', '.join(known)}")
    positive_int("windows", windows)
    positive_int("timing_batch", timing_batch)
    lengths = [int(x) for x in lengths]
    if str(model) in DECODERS and any(not 2 <= n <= TRAINING["length"] for n in lengths):  # before training it
        raise ValueError(f"lengths must be in 2 .. {TRAINING['length']} (the model's positions), got {lengths}")
    folder = decoder_folder(model, on_step=on_step)
    config = json.loads((folder / "config.json").read_text())
    longest = config.get("max_position_embeddings") or config.get("n_positions")
    out = []
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # one "loading weights" bar per row would bury the study's own
    try:
        for n in lengths:
            out += _length(folder, str(model), n, longest, variants, windows=windows, timing_batch=timing_batch,
                           max_points=max_points, on_record=on_record, device=torch.device(device))
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return out


def _length(folder, model, n, longest, variants, *, windows, timing_batch, max_points, on_record,
            device: str | torch.device = "cpu") -> list[DecoderRecord]:
    """The rows at length ``n``: each loaded, its perplexity measured, then all timed round-robin."""
    from transformers import AutoModelForCausalLM

    from ..integrations.transformers import implementation, use_kernels
    from .pretrained import budgets_for

    if not 2 <= n <= (longest or n):
        raise ValueError(f"lengths must be in 2 .. {longest} (the model's positions), got {n}")
    data = heldout_windows(folder, n, windows)
    if len(data) < 1:
        raise ValueError(f"no held-out window of {n} tokens")
    rows = [("sdpa", "trained", {}, "sdpa"), ("attnlab", "exact", {}, "attnlab")]
    if is_hybrid(folder):
        rows.append(("kernels", "exact", {}, "attnlab"))
    rows += [(v, label, opts, implementation(v)) for v in variants for label, opts in budgets_for(v, n, max_points)]
    models, recs = {}, {}
    for i, (v, label, opts, impl) in enumerate(rows):
        m = AutoModelForCausalLM.from_pretrained(str(folder), attn_implementation=impl).to(device).eval()
        if models:  # one set of weights for every row: the first model's tensors
            m.load_state_dict(models[0].state_dict(), assign=True)
        if v == "kernels":
            use_kernels(m)
        m.config.attnlab_options = opts or None
        ppl = _perplexity(m, data)
        recs[i] = DecoderRecord(model, v, opts, label, n, len(data), timing_batch, ppl,
                                ppl / (recs[0].perplexity if recs else ppl))
        models[i] = m
    x = data[:timing_batch].to(device)
    with torch.no_grad():
        measured = measure_calls({i: (lambda m=m: m(input_ids=x, use_cache=False)) for i, m in models.items()},
                                 memory=False, device=device)
    out = []
    for i, rec in recs.items():
        rec.seconds = measured[i][0]
        rec.time_ratio = rec.seconds / measured[0][0]
        out.append(rec)
        if on_record is not None:
            on_record(rec)
    return out
