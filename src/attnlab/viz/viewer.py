"""The interactive attention viewer: one self-contained HTML file (``attnlab view``).

The page (``viewer.html`` beside this module; no network, no CDN) draws on canvases, so it stays
responsive at 512 tokens:

* **model view** — one thumbnail per layer and head (the ``N x N`` weights as a heat map);
* **head view** — lines from each token (left) to the tokens it attends to (right), thickness
  and opacity = weight; hovering a token isolates its lines, clicking selects several tokens,
  whose attention is summed; a head, the mean of the heads, or the attention *rollout*
  (Abnar & Zuidema 2020, https://arxiv.org/abs/2005.00928) up to the chosen layer;
* **steps** — ``attnlab explain``'s steps for the chosen head and token, recomputed in the
  page from the embedded q, k, v: scores ``q_i . k_j / sqrt(D)``, softmax, output ``sum_j a_ij v_j``.

Data travels as base64: for every layer, head and query, the ``topk`` largest weights (float16)
with their key indices (uint16); q, k, v as float16.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

__all__ = ["ViewerData", "checkpoint_view", "pretrained_view", "rollout", "viewer_data", "write_viewer"]

TEMPLATE = Path(__file__).with_name("viewer.html")
MARK = "/*ATTNLAB_DATA*/null"


@dataclass
class ViewerData:
    """What the page shows, before packing: tokens ``N``, weights ``(L, H, N, N)``, optionally
    q / k / v ``(L, H, N, D)`` (after any rotation: the vectors the scores are made of) and
    ``scale`` (the score is ``scale * q . k``)."""

    tokens: list[str]
    weights: torch.Tensor
    q: torch.Tensor | None = None
    k: torch.Tensor | None = None
    v: torch.Tensor | None = None
    scale: float | None = None
    title: str = "attention"
    note: str = ""


def rollout(weights: torch.Tensor) -> torch.Tensor:
    """Attention rollout (Abnar & Zuidema 2020): ``R_l = norm(0.5 mean_h A_l + 0.5 I) R_{l-1}``,
    rows renormalised to 1, for every layer: ``(L, H, N, N)`` -> ``(L, N, N)``."""
    if weights.dim() != 4 or weights.shape[-1] != weights.shape[-2]:
        raise ValueError(f"weights must have shape (L, H, N, N), got {tuple(weights.shape)}")
    w = weights.double().mean(1)  # (L, N, N)
    eye = torch.eye(w.shape[-1], dtype=w.dtype, device=w.device)
    out, r = [], eye
    for a in w:
        a = 0.5 * a + 0.5 * eye
        a = a / a.sum(-1, keepdim=True)
        r = a @ r
        out.append(r)
    return torch.stack(out).to(weights.dtype)


def _b64(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a).tobytes()).decode("ascii")


def _topk(w: torch.Tensor, k: int) -> dict:
    """The ``k`` largest entries of each row of ``(..., N, N)``: key indices (uint16) and weights (float16)."""
    vals, idx = w.float().topk(k, dim=-1)  # sorted, largest first
    return {"index": _b64(idx.numpy().astype("<u2")), "weight": _b64(vals.numpy().astype("<f2"))}


def viewer_data(d: ViewerData, *, topk: int = 32) -> dict:
    """Pack :class:`ViewerData` for the page (the JSON it embeds)."""
    w = d.weights.detach().cpu()
    if w.dim() != 4 or w.shape[-1] != w.shape[-2] or w.shape[-1] != len(d.tokens):
        raise ValueError(f"weights must have shape (L, H, N, N) with N = {len(d.tokens)} tokens, got {tuple(w.shape)}")
    n = w.shape[-1]
    if n > 65535:
        raise ValueError(f"the viewer takes at most 65,535 tokens, got {n}")
    k = max(1, min(int(topk), n))
    layers, heads = w.shape[0], w.shape[1]
    out = {
        "title": d.title,
        "note": d.note,
        "tokens": list(d.tokens),
        "layers": layers,
        "heads": heads,
        "n": n,
        "topk": k,
        "attention": _topk(w, k),
        "rollout": _topk(rollout(w), k),
        "steps": None,
    }
    if d.q is not None:
        q, kk, v = (t.detach().cpu().float() for t in (d.q, d.k, d.v))
        if q.shape[:3] != (layers, heads, n) or kk.shape != q.shape or v.shape[:3] != q.shape[:3]:
            raise ValueError(f"q, k, v must have shape (L, H, N, D) = ({layers}, {heads}, {n}, D), got "
                             f"{tuple(q.shape)}")
        out["steps"] = {
            "head_dim": q.shape[-1],
            "scale": float(d.scale),
            "qkv": _b64(torch.stack([q, kk, v]).numpy().astype("<f2")),  # (3, L, H, N, D)
        }
    return out


def write_viewer(path: str | Path, d: ViewerData, *, topk: int = 32) -> Path:
    """Write the page for ``d`` to ``path`` (atomically) and return the path."""
    # every "<" escaped (still JSON): no text can end the data's <script> element or open a comment in it
    data = json.dumps(viewer_data(d, topk=topk), separators=(",", ":")).replace("<", "\\u003c")
    page = TEMPLATE.read_text(encoding="utf-8")
    if MARK not in page:
        raise RuntimeError(f"{TEMPLATE} lacks the data mark {MARK!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(page.replace(MARK, data, 1), encoding="utf-8")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _from_captured(records, tokens: list[str], title: str, note: str = "") -> ViewerData:
    from .trace import stack_captured

    s = stack_captured(records)
    if s["weights"].shape[-1] != len(tokens):
        raise ValueError(f"the model attended over {s['weights'].shape[-1]} positions, but the text has "
                         f"{len(tokens)} tokens")
    why = "" if s["scale"] is not None else f"steps panel off: {s['why']}"
    keep = s["scale"] is not None
    return ViewerData(
        tokens, s["weights"], s["q"] if keep else None, s["k"] if keep else None, s["v"] if keep else None, s["scale"],
        title=title, note="; ".join(x for x in (note, why) if x),
    )


def pretrained_view(model, text: str, *, truncate: bool = False) -> ViewerData:
    """:class:`ViewerData` of a :class:`attnlab.pretrained.Pretrained` model on ``text`` (its word pieces)."""
    from .trace import capture

    batch = model.encode(text, truncate=truncate)
    with capture(model) as records, torch.no_grad():
        model(batch)
    return _from_captured(records, batch.tokens[0], f"{model.name}: {text[:80]}")


def _byte_label(b: int) -> str:
    """A byte as a viewer token: its character when printable ASCII (a space as ``␣``), else ``\\xNN``."""
    if b == 0x20:
        return "␣"
    return chr(b) if 0x20 < b < 0x7F else f"\\x{b:02x}"


def checkpoint_view(path: str | Path, text: str) -> ViewerData:
    """:class:`ViewerData` of an attnlab checkpoint of a token model on ``text``, tokenised as its
    task does: the UTF-8 bytes for a byte-level model (the ``docs`` language model), the
    checkpoint's own tokenizer for user data, or split on whitespace into the words of its
    built-in task's vocabulary (raises ``ValueError`` naming the words it lacks)."""
    from .. import tasks as task_registry
    from ..models.base import CLS
    from ..tasks.jsonl import FIELDS, encode_inputs, token_strings
    from ..training.checkpoint import load_checkpoint
    from .trace import capture

    ck = load_checkpoint(path)
    art = ck.meta.get("task_artifacts") or {}
    if not text.split():
        raise ValueError("the text is empty: give some words to attend over")
    # a byte-level model (the docs language model): its tokens are the text's UTF-8 bytes
    if art.get("codec") == "bytes":
        from ..tasks.docs import encode_bytes

        ids = encode_bytes(text)
        limit = ck.context or len(ids)
        if len(ids) > limit:
            raise ValueError(f"the text is {len(ids)} bytes, over the {limit} the model was trained on: shorten it")
        tokens = [_byte_label(b) for b in text.encode("utf-8")]
    elif "tokenizer" in art:
        kind = art["kind"]
        if kind == "seq2seq":
            raise ValueError("the viewer shows encoders of one token sequence; this checkpoint is a seq2seq model")
        record = {"tokens": text.split()} if kind == "tagging" else {FIELDS[kind][0]: text}
        ids = encode_inputs(kind, art, [record])[0]
        tokens = token_strings(art["tokenizer"], ids)
    else:
        task = task_registry.create(ck.config.task, **ck.config.task_options)
        if task.inputs != "tokens" or task.kind in ("pair", "seq2seq") or not task.vocab:
            raise ValueError(f"the viewer shows encoders of one token sequence; task {task.name!r} has {task.inputs} "
                             f"inputs ({task.kind})")
        index = {w: i for i, w in enumerate(task.vocab)}
        words = text.split()
        unknown = [w for w in words if w not in index]
        if unknown or not words:
            sample = ", ".join(task.vocab[2:14])
            raise ValueError(f"words not in task {task.name!r}'s vocabulary: {', '.join(unknown) or '(none given)'}; "
                             f"it has e.g. {sample}")
        ids = [index[w] for w in words]
        if int(task.split("train").tokens[0, 0]) == CLS:  # the task's sequences start with its <cls> token
            ids = [CLS] + ids
        tokens = [task.vocab[i] for i in ids]
    model = ck.model.eval()
    if getattr(model, "pooling", None) == "cls":  # the model puts its summary token in front: it is shown too
        tokens = ["<cls>", *tokens]
    with capture(model) as records, torch.no_grad():
        model(torch.tensor([ids], dtype=torch.long, device=next(model.parameters()).device))
    return _from_captured(records, tokens, f"{ck.config.task} checkpoint {Path(path).name}: {text[:80]}",
                          f"model {ck.config.model}")
