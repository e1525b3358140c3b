"""Truncated against full self-attention on long audio (``attnlab bench audio``).

A ``seconds``-long waveform (white noise: cost does not depend on content) goes through the
front end (:func:`attnlab.audio.features`: 25 ms windows, 10 ms hop, 100 frames per second, so
6000 frames for a minute), then one batch element through a Conformer and a Transformer
encoder with full (``dense``) and truncated (``local``, +-``window`` frames) attention. Each is
timed forward + backward (median of round-robin repetitions after a warm-up) and its peak
tensor memory read from the profiler (:func:`attnlab.studies.attention.peak_bytes`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..profiling import measure_calls
from .records import StudyRecord, timed

__all__ = ["AudioRecord", "run"]


@timed(note=False)
class AudioRecord(StudyRecord):
    """One model: ``frames`` input vectors, median ``seconds`` fwd+bwd, ``peak_bytes``."""

    model: str
    attention: str
    frames: int


def run(
    seconds: float = 60.0, *, window: int = 16, embed_dim: int = 144, num_heads: int = 4, num_layers: int = 2,
    min_repeats: int = 3, memory: bool = True, models: tuple[str, ...] = ("conformer", "audio_transformer"),
    device: str | torch.device = "cpu", on_record: Callable[[AudioRecord], None] | None = None,
) -> list[AudioRecord]:
    """Measure each model with dense and with local attention on ``seconds`` of audio, on
    ``device`` (the features computed and the weights drawn on the CPU, then moved)."""
    import numpy as np

    from ..audio import features, normalize
    from ..models.base import BACKBONES

    if not seconds > 0:
        raise ValueError(f"seconds must be positive, got {seconds!r}")
    rng = np.random.default_rng(0)
    wave = rng.normal(0, 0.1, int(seconds * 16_000)).astype(np.float32)
    device = torch.device(device)
    x = normalize(features(wave))[None].to(device)  # (1, T, 40)
    frames = x.shape[1]
    built = {}
    for m in models:
        for att in ("dense", "local"):
            torch.manual_seed(0)
            opts = {"attention_options": {"window": window}} if att == "local" else {}
            built[(m, att)] = BACKBONES.get(m)(x.shape[2], embed_dim, num_heads=num_heads, num_layers=num_layers,
                                               attention=att, positional="rope", max_len=frames + 1, **opts).to(device)

    def call_of(model):
        def call():
            model.zero_grad(set_to_none=True)
            model(x).output.sum().backward()

        return call

    measured = measure_calls({k: call_of(v) for k, v in built.items()}, min_repeats, memory=memory, device=device)
    records = []
    for (m, att), (secs, peak, reps) in measured.items():
        rec = AudioRecord(m, att if att == "dense" else f"local (+-{window})", frames, secs, peak, reps)
        records.append(rec)
        if on_record is not None:
            on_record(rec)
    return records
