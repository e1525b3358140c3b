"""Nystromformer: softmax attention through a Nystrom approximation with landmarks (Xiong et al. 2021)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..validate import positive_int
from .base import Budget, EfficientStep, Sweep, register

__all__ = ["NystromAttention", "iterative_pinv", "segment_means"]


def iterative_pinv(a: torch.Tensor, iters: int = 6) -> torch.Tensor:
    """Moore-Penrose pseudo-inverse of ``a`` ``(..., m, m)`` by the iteration of Razavi et al. (2014), as in the paper.

    ``Z_0 = A^T / (max row sum x max column sum)``,
    ``Z_{j+1} = 1/4 Z_j (13 I - A Z_j (15 I - A Z_j (7 I - A Z_j)))``.
    """
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    absa = a.abs()
    z = a.transpose(-2, -1) / (absa.sum(-1).amax(-1) * absa.sum(-2).amax(-1))[..., None, None]
    for _ in range(iters):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z


def segment_means(x: torch.Tensor, m: int, valid: torch.Tensor | None,
                  slots: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Landmarks: the means of consecutive segments of ``x`` ``(B, H, L, D)``, over real
    (non-padded) positions only. Returns ``(B, H, m, D)`` and ``(B, m)`` "segment has a real
    position".

    Row b's ``c_b`` real positions (``valid`` ``(B, L)``, or all L) are cut into ``m_b =
    min(slots_b, c_b)`` segments (``slots`` ``(B,)``, default m): the real position of rank r
    goes to segment ``floor(r m_b / c_b)``; slots ``m_b .. m - 1`` stay empty. The segments
    depend on a row's own real positions only, not on how far its batch is padded.
    """
    b, h, length, d = x.shape
    if valid is None and slots is None and length % m == 0:  # equal segments, nothing padded: a plain mean
        return x.view(b, h, m, length // m, d).mean(-2), torch.ones(b, m, dtype=torch.bool, device=x.device)
    real = torch.ones(b, length, dtype=torch.bool, device=x.device) if valid is None else valid
    count = real.sum(1)  # (B,): c_b
    per_row = torch.full((b,), m, device=x.device) if slots is None else slots.clamp(max=m)
    per_row = torch.minimum(per_row, count)  # m_b
    rank = real.long().cumsum(1) - 1  # (B, L): the rank of each real position in its row
    seg = rank * per_row[:, None] // count.clamp(min=1)[:, None]  # (B, L): its segment
    w = F.one_hot(seg.clamp(0, m - 1), m).to(x.dtype) * real[:, :, None].to(x.dtype)  # (B, L, m)
    if valid is not None:  # 0 x NaN is NaN: padded positions are zeroed, not just given weight 0
        x = torch.where(valid[:, None, :, None], x, torch.zeros((), dtype=x.dtype, device=x.device))
    n_in = w.sum(1)  # (B, m)
    sums = torch.einsum("blm,bhld->bhmd", w, x)
    return sums / n_in.clamp_min(1)[:, None, :, None], n_in > 0


@register("nystrom")
class NystromAttention(EfficientStep):
    """``softmax(Q K~^T) pinv(softmax(Q~ K~^T)) softmax(Q~ K^T) V`` with ``m`` landmarks, O(N m).

    Xiong et al. 2021, "Nystromformer" (https://arxiv.org/abs/2102.03902): landmarks ``Q~, K~``
    are segment means of the queries and keys (:func:`segment_means`, taken over each row's
    own real positions: padded keys never enter a landmark and are masked in the third factor,
    and a sequence gets the same landmarks however far its batch is padded, so its output does
    not depend on its batch companions). With ``landmarks = N`` and an exact pseudo-inverse it is exact
    attention (``A pinv(A) A = A``). Not causal.

    Args:
        embed_dim, num_heads: see :class:`attnlab.efficient.EfficientStep`.
        landmarks: m (default 64; at most the sequence length is used).
        pinv: ``"iterative"`` (the paper's, ``pinv_iters`` steps) or ``"exact"`` (``torch.linalg.pinv``).
        pinv_iters: iterations of :func:`iterative_pinv`.
    """

    budget = Budget(short={"landmarks": 8}, long={"landmarks": 64},
                    sweep=Sweep("landmarks", (16, 64, 256, 1024), "landmarks"))

    capabilities = EfficientStep.capabilities.with_changes(causal=None, family="landmarks")

    def __init__(self, embed_dim: int, num_heads: int, *, landmarks: int = 64, pinv: str = "iterative",
                 pinv_iters: int = 6, **options):
        positive_int("landmarks", landmarks)
        if pinv not in ("iterative", "exact"):
            raise ValueError(f"pinv must be 'iterative' or 'exact', got {pinv!r}")
        super().__init__(embed_dim, num_heads, **options)
        self.landmarks, self.pinv, self.pinv_iters = landmarks, pinv, int(pinv_iters)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, landmarks={self.landmarks}, pinv={self.pinv!r}"

    def compute(self, q, k, v, valid):
        n, mk = q.shape[2], k.shape[2]
        m = min(self.landmarks, n, mk)
        work = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
        q, k, v = q.to(work), k.to(work), v.to(work)
        scale = q.shape[-1] ** -0.5
        # every row has its own landmarks: m_b = min(landmarks, N, its real keys), segments over its
        # own real positions (query landmarks too when queries and keys are the same positions)
        slots = None
        if valid is not None:
            slots = torch.clamp(valid.sum(1), max=m)
        ql, ql_ok = segment_means(q, m, valid if n == mk else None, slots)  # (B, H, m, D), (B, m)
        kl, kl_ok = segment_means(k, m, valid, slots)  # (B, H, m, D), (B, m)
        if valid is None and bool(kl_ok.all()):  # nothing to mask
            f1 = (q @ (kl.transpose(-2, -1) * scale)).softmax(-1)  # (B, H, N, m)
            f2 = (ql @ (kl.transpose(-2, -1) * scale)).softmax(-1)  # (B, H, m, m)
            f3 = ((ql * scale) @ k.transpose(-2, -1)).softmax(-1)  # (B, H, m, M)
        else:
            kl_mask = kl_ok[:, None, None, :]  # (B, 1, 1, m)
            f1 = (q @ kl.transpose(-2, -1) * scale).masked_fill(~kl_mask, float("-inf")).softmax(-1)
            f2 = (ql @ kl.transpose(-2, -1) * scale).masked_fill(~kl_mask, float("-inf")).softmax(-1)
            s3 = ql @ k.transpose(-2, -1) * scale
            if valid is not None:
                s3 = s3.masked_fill(~valid[:, None, None, :], float("-inf"))
            # a set with no real key: zeros (the caller zeroes its output)
            f1, f2, f3 = torch.nan_to_num(f1), torch.nan_to_num(f2), torch.nan_to_num(s3.softmax(-1))
            # empty landmark slots: an identity block, so that the pseudo-inverse of the real
            # block (and its iteration's start, set by the largest row and column sums) is what
            # the row alone would give; f1 gives those slots weight 0
            empty = ~(ql_ok & kl_ok)[:, None, :, None]  # (B, 1, m, 1)
            eye = torch.eye(m, dtype=f2.dtype, device=f2.device)
            f2 = torch.where(empty | empty.transpose(-1, -2), eye, f2)
        inv = torch.linalg.pinv(f2) if self.pinv == "exact" else iterative_pinv(f2, self.pinv_iters)
        out = f1 @ (inv @ (f3 @ v))  # right to left: never an N x N product
        return out.to(v.dtype) if out.dtype != v.dtype else out
