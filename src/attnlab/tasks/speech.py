"""Audio tasks: spoken words as sequences of frames (one vector per 10 ms, :mod:`attnlab.audio`).

* ``speech`` — spoken-word recognition on audio synthesised here: ``espeak-ng`` (Debian's
  package) speaks a small vocabulary with a random voice (5 accents x 12 voice variants), speed
  (110-220 words per minute) and pitch, placed at a random offset in a 1-second clip, with white
  noise at a random signal-to-noise ratio (5-20 dB). Nothing is downloaded. The clips are
  cached as WAV files (``$ATTNLAB_CACHE`` or ``~/.cache/attnlab``, one folder per setting; a
  ``manifest.json`` written last marks a complete cache, so an interrupted generation is redone).
* ``wav_folder`` — the user's own recordings: a folder with one subfolder per label, holding
  audio files (``.wav``, ``.flac``, ``.ogg``).

Features: 40 log-mel bands (or MFCCs), normalised per utterance; ``tokens`` ``(S, T, F)`` with
``mask`` ``(S, T)``; one label per clip (classification).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import torch

from .base import Split, Task, register, split_sizes

__all__ = ["WORDS", "cache_dir", "speech", "wav_folder"]

WORDS = ("yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go")
"""The default vocabulary of ``speech`` (the ten command words of Speech Commands)."""

_ACCENTS = ("en", "en-us", "en-gb-scotland", "en-029", "en-gb-x-rp")
_VARIANTS = ("", "+m1", "+m2", "+m3", "+m4", "+m5", "+m6", "+m7", "+f1", "+f2", "+f3", "+f4")
_CLIP_SECONDS = 1.0
_VERSION = 1


def cache_dir() -> Path:
    """Where generated data are cached: ``$ATTNLAB_CACHE``, else ``$XDG_CACHE_HOME/attnlab``, else
    ``~/.cache/attnlab``."""
    if os.environ.get("ATTNLAB_CACHE"):
        return Path(os.environ["ATTNLAB_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "attnlab"


def _stack(feats: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    t = max(f.shape[0] for f in feats)
    x = torch.zeros(len(feats), t, feats[0].shape[1])
    mask = torch.zeros(len(feats), t, dtype=torch.bool)
    for i, f in enumerate(feats):
        x[i, : f.shape[0]], mask[i, : f.shape[0]] = f, True
    return x, mask


def _features_of(paths: list[Path], kind: str) -> list[torch.Tensor]:
    from ..audio import features, load_wav, normalize

    return [normalize(features(load_wav(p), kind=kind)) for p in paths]


def _generate(folder: Path, plan: list[dict], on_clip=None) -> None:
    from ..audio import SAMPLE_RATE, save_wav, synthesize

    folder.mkdir(parents=True, exist_ok=True)
    length = round(_CLIP_SECONDS * SAMPLE_RATE)
    for i, clip in enumerate(plan):
        path = folder / clip["file"]
        if not path.exists():
            rng = np.random.default_rng(clip["noise_seed"])
            y = synthesize(clip["word"], voice=clip["voice"], speed=clip["speed"], pitch=clip["pitch"])
            y = y[:length]
            start = int(clip["offset"] * max(0, length - len(y)))
            out = np.zeros(length, dtype=np.float32)
            out[start : start + len(y)] = y
            rms = float(np.sqrt(np.mean(y**2))) or 1e-3
            out += rng.normal(0.0, rms / 10 ** (clip["snr_db"] / 20), length).astype(np.float32)
            save_wav(path, out / max(1.0, float(np.abs(out).max())))
        if on_clip is not None:
            on_clip(i + 1, len(plan))


_SPEECH_DEFAULTS = {"model": "conformer", "attention": "local", "positional": "rope",
                    "attention_options": {"window": 16}, "steps": 1500, "batch_size": 32, "lr": 2e-3, "embed_dim": 64,
                    "num_layers": 2, "eval_every": 150}
"""Training defaults of the audio tasks: a Conformer with truncated (local) attention."""


@register("speech", train_defaults=_SPEECH_DEFAULTS, baseline_model=None)
def speech(
    size: int = 800, seed: int = 0, words: str = ",".join(WORDS), features: str = "logmel", cache: str = "",
    heldout_voices: bool = False,
) -> Task:
    """Spoken-word recognition on locally synthesised, noisy clips (see the module docstring).

    Args:
        size: training clips (validation and test: ``size / 8``, at least 64 each).
        seed: voices, speeds, pitches, offsets and noise of every clip.
        words: comma-separated vocabulary. features: ``"logmel"`` or ``"mfcc"``.
        cache: the cache folder (default :func:`cache_dir`).
        heldout_voices: the test clips use voices no training or validation clip uses (the
            accent ``en-gb-x-rp`` and the variants ``+m7``, ``+f4``): unseen speakers.
    """
    vocab = [w.strip() for w in words.split(",") if w.strip()]
    if len(vocab) < 2 or len(set(vocab)) != len(vocab) or not all(w.replace("'", "").isalpha() for w in vocab):
        raise ValueError(f"words must be at least two distinct comma-separated words (letters only), got {words!r}")
    if features not in ("logmel", "mfcc"):
        raise ValueError(f"features must be 'logmel' or 'mfcc', got {features!r}")
    sizes = split_sizes(size)
    rng = np.random.default_rng(seed)
    plan: dict[str, list[dict]] = {}
    held_accents, held_variants = {"en-gb-x-rp"}, {"+m7", "+f4"}
    seen = [a + v for a in _ACCENTS for v in _VARIANTS if a not in held_accents and v not in held_variants]
    unseen = [a + v for a in _ACCENTS for v in _VARIANTS if a in held_accents or v in held_variants]
    for name, count in sizes.items():
        plan[name] = []
        for i in range(count):
            w = i % len(vocab)  # balanced classes
            if heldout_voices:  # disjoint speakers: the test voices appear only in the test split
                pool = unseen if name == "test" else seen
                voice = pool[rng.integers(len(pool))]
            else:
                voice = _ACCENTS[rng.integers(len(_ACCENTS))] + _VARIANTS[rng.integers(len(_VARIANTS))]
            plan[name].append({
                "file": f"{name}-{i:05d}-{vocab[w]}.wav", "word": vocab[w], "label": w,
                "voice": voice,
                "speed": int(rng.integers(110, 221)), "pitch": int(rng.integers(20, 81)), "offset": float(rng.random()),
                "snr_db": float(rng.uniform(5, 20)), "noise_seed": int(rng.integers(2**31)),
            })
    key = hashlib.sha256(json.dumps({"v": _VERSION, "plan": plan}, sort_keys=True).encode()).hexdigest()[:16]
    folder = (Path(cache) if cache else cache_dir()) / f"speech-{key}"
    manifest = folder / "manifest.json"
    if not manifest.exists():
        _generate(folder, [c for cs in plan.values() for c in cs])
        tmp = manifest.with_name("manifest.json.tmp")
        tmp.write_text(json.dumps({"words": vocab, "plan": plan}))
        os.replace(tmp, manifest)
    splits = {}
    for name, clips in plan.items():
        x, mask = _stack(_features_of([folder / c["file"] for c in clips], features))
        splits[name] = Split(x, torch.tensor([c["label"] for c in clips]), mask)
    return Task("speech", "classification", 0, len(vocab), "accuracy", splits,
                {"size": size, "seed": seed, "words": words, "features": features, "cache": cache,
                 "heldout_voices": heldout_voices},
                label_names=vocab, baseline={"majority": 1.0 / len(vocab)}, inputs="features",
                feature_dim=int(x.shape[2]), artifacts={"cache_folder": str(folder)})


_AUDIO = (".wav", ".flac", ".ogg")


def _audio_files(root: Path) -> list[Path]:
    """The clips ``wav_folder`` reads in ``root``: the audio files of its label folders."""
    return [f for d in root.iterdir() if d.is_dir() for f in d.iterdir() if f.suffix.lower() in _AUDIO]


@register("wav_folder", train_defaults=_SPEECH_DEFAULTS, baseline_model=None, files={"path": _audio_files})
def wav_folder(path: str = "", seed: int = 0, features: str = "logmel") -> Task:
    """The user's recordings: ``path/<label>/<clip>.wav`` (see the module docstring); the clips
    are shuffled with ``seed`` and cut 80 / 10 / 10 into train / val / test.

    Args:
        path: the folder of label folders (``attnlab train wav_folder --data FOLDER``).
        seed: the shuffle of the clips. features: ``"logmel"`` or ``"mfcc"``.
    """
    if not path:
        raise ValueError("wav_folder needs path= a folder with one subfolder per label (--data DIR)")
    root = Path(path)
    if not root.is_dir():
        raise ValueError(f"{root} is not a folder")
    labels = sorted(d.name for d in root.iterdir() if d.is_dir()
                    and any(f.suffix.lower() in _AUDIO for f in d.iterdir()))
    if len(labels) < 2:
        raise ValueError(f"{root} needs at least two subfolders (one per label) holding {', '.join(_AUDIO)} "
                         f"files; found {labels}")
    files = [(f, k) for k, lab in enumerate(labels) for f in sorted((root / lab).iterdir())
             if f.suffix.lower() in _AUDIO]
    if len(files) < 3:
        raise ValueError(f"{root} holds {len(files)} audio files; at least 3 are needed (train, val, test)")
    order = torch.randperm(len(files), generator=torch.Generator().manual_seed(seed)).tolist()
    n_held = max(1, len(files) // 10)
    parts = {"test": order[:n_held], "val": order[n_held : 2 * n_held], "train": order[2 * n_held :]}
    feats = _features_of([f for f, _ in files], features)
    splits = {}
    for name in ("train", "val", "test"):
        idx = parts[name]
        x, mask = _stack([feats[i] for i in idx])
        splits[name] = Split(x, torch.tensor([files[i][1] for i in idx]), mask)
    test_y = splits["test"].labels
    majority = max(float((test_y == c).float().mean()) for c in range(len(labels)))
    return Task("wav_folder", "classification", 0, len(labels), "accuracy", splits,
                {"path": path, "seed": seed, "features": features}, label_names=labels, baseline={"majority": majority},
                inputs="features", feature_dim=int(feats[0].shape[1]))
