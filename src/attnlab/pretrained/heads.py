"""What the heads of a pretrained model attend to (``attnlab attention``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .model import Pretrained

__all__ = ["AttentionMap", "Link", "attention_map", "find_links", "token_positions"]


@dataclass
class AttentionMap:
    """Every block's weights on one text: ``tokens`` (N word pieces, ``[CLS]`` and ``[SEP]``
    included) and ``weights`` ``(L, H, N, N)``, row i = where token i attends."""

    tokens: list[str]
    weights: torch.Tensor

    def strongest(self, layer: int, head: int) -> list[tuple[int, float]]:
        """For each token, the token it attends to most and that weight, in one head."""
        w = self.weights[layer, head]
        vals, idx = w.max(-1)
        return [(int(j), float(v)) for j, v in zip(idx, vals)]


@dataclass
class Link:
    """One head's weight from a source token to a target token (0-based layer, head and positions)."""

    layer: int
    head: int
    source: int
    target: int
    weight: float


@torch.no_grad()
def attention_map(model: Pretrained, text: str, *, truncate: bool = False) -> AttentionMap:
    """Run ``text`` through ``model`` and keep every block's weights (an efficient variant raises
    ``ValueError``: it builds none)."""
    batch = model.encode(text, truncate=truncate)
    out = model(batch, return_weights=True)
    return AttentionMap(batch.tokens[0], torch.stack([w[0] for w in out.weights]).float().cpu())


def token_positions(tokens: list[str], word: str) -> list[int]:
    """The positions of ``word`` among the word pieces: exact (case-insensitive) matches, else
    the first piece of a word split into pieces. Raises ``ValueError`` listing the tokens."""
    w = word.strip().lower()
    if not w:
        raise ValueError("an empty word to find")
    low = [t.lower() for t in tokens]
    hits = [i for i, t in enumerate(low) if t == w]
    if not hits:  # a word the tokenizer split: "attending" -> "attend", "##ing"
        for i, t in enumerate(low):
            piece, j = t, i + 1
            while j < len(low) and low[j].startswith("##") and len(piece) < len(w):
                piece += low[j][2:]
                j += 1
            if piece == w:
                hits.append(i)
    if not hits:
        raise ValueError(f"{word!r} is not among the tokens: {' '.join(tokens)}")
    return hits


def find_links(amap: AttentionMap, source: str, target: str, top: int = 5) -> list[Link]:
    """The ``top`` heads with the largest weight from ``source`` to ``target`` (words of the text;
    over all their occurrences), largest first."""
    src, dst = token_positions(amap.tokens, source), token_positions(amap.tokens, target)
    w = amap.weights[:, :, src][:, :, :, dst]  # (L, H, S, T)
    best, arg = w.flatten(2).max(-1)  # (L, H)
    order = best.flatten().argsort(descending=True)[: max(1, top)]
    heads = amap.weights.shape[1]
    links = []
    for flat in order.tolist():
        layer, head = divmod(flat, heads)
        s, t = divmod(int(arg[layer, head]), len(dst))
        links.append(Link(layer, head, src[s], dst[t], float(best[layer, head])))
    return links
