"""Sound as a vector set: a waveform becomes one vector per 25 ms window, every 10 ms.

:func:`load_wav` reads (soundfile: WAV, FLAC, OGG) and resamples (librosa); :func:`features`
computes log-mel energies (or MFCCs) with ``n_fft = win_length = 25 ms`` and ``hop = 10 ms``:
100 vectors per second, 6000 for a one-minute recording; :func:`normalize` standardises each
band over an utterance (cepstral mean and variance normalisation). :func:`synthesize` speaks a
word with Debian's ``espeak-ng`` (the ``speech`` task's data).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import torch

from ..extras import require

__all__ = ["HOP_SECONDS", "SAMPLE_RATE", "WINDOW_SECONDS", "features", "frames_per_second", "load_wav", "normalize",
           "save_wav", "synthesize"]

SAMPLE_RATE = 16_000
WINDOW_SECONDS = 0.025
HOP_SECONDS = 0.010


class MissingToolError(RuntimeError):
    """A program attnlab calls (``espeak-ng``) is not installed, or failed."""


def frames_per_second() -> float:
    """Feature vectors per second of audio (1 / hop = 100)."""
    return 1.0 / HOP_SECONDS


def load_wav(path: str | Path, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Mono float32 samples of an audio file, resampled to ``sample_rate``; a clear ``ValueError``
    names a file that cannot be read."""
    librosa = require("librosa", "audio", "reading audio")
    soundfile = require("soundfile", "audio", "reading audio")

    try:
        data, sr = soundfile.read(str(path), dtype="float32", always_2d=True)
    except (soundfile.LibsndfileError, RuntimeError, OSError) as e:
        raise ValueError(f"cannot read audio file {path}: {e}") from None
    y = data.mean(axis=1)
    if y.size == 0:
        raise ValueError(f"audio file {path} holds no samples")
    if sr != sample_rate:
        y = librosa.resample(y, orig_sr=sr, target_sr=sample_rate)
    return np.ascontiguousarray(y, dtype=np.float32)


def save_wav(path: str | Path, samples: np.ndarray, sample_rate: int = SAMPLE_RATE) -> None:
    """Write 16-bit PCM WAV atomically (a temporary file renamed into place)."""
    soundfile = require("soundfile", "audio", "writing audio")

    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    soundfile.write(str(tmp), np.clip(samples, -1.0, 1.0), sample_rate, subtype="PCM_16", format="WAV")
    os.replace(tmp, path)


def features(samples: np.ndarray, sample_rate: int = SAMPLE_RATE, *, kind: str = "logmel", n_mels: int = 40,
             n_mfcc: int = 13) -> torch.Tensor:
    """``(T, F)`` features of a waveform: 25 ms windows (Hann), 10 ms hop.

    Args:
        kind: ``"logmel"`` (``log(mel power + 1e-6)``, F = ``n_mels``) or ``"mfcc"`` (F = ``n_mfcc``).
    """
    librosa = require("librosa", "audio", "audio features")

    if kind not in ("logmel", "mfcc"):
        raise ValueError(f"kind must be 'logmel' or 'mfcc', got {kind!r}")
    win = round(WINDOW_SECONDS * sample_rate)
    hop = round(HOP_SECONDS * sample_rate)
    mel = librosa.feature.melspectrogram(y=samples, sr=sample_rate, n_fft=win, win_length=win, hop_length=hop,
                                         n_mels=n_mels)
    if kind == "mfcc":
        out = librosa.feature.mfcc(S=librosa.power_to_db(mel), n_mfcc=n_mfcc)
    else:
        out = np.log(mel + 1e-6)
    return torch.from_numpy(out.T.astype(np.float32).copy())


def normalize(feats: torch.Tensor) -> torch.Tensor:
    """Per-utterance mean and variance normalisation of each feature band ``(T, F)``."""
    return (feats - feats.mean(0)) / feats.std(0, unbiased=False).clamp_min(1e-5)


def synthesize(text: str, *, voice: str = "en", speed: int = 160, pitch: int = 50,
               sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """``text`` spoken by ``espeak-ng`` (voice, words per minute, pitch 0-99), resampled to ``sample_rate``.

    Raises:
        MissingToolError: espeak-ng is not installed (Debian: ``apt install espeak-ng``) or failed.
    """
    exe = shutil.which("espeak-ng")
    if exe is None:
        raise MissingToolError("espeak-ng is not installed: the speech task synthesises its words with it (Debian: apt "
                               "install espeak-ng)")
    with tempfile.TemporaryDirectory() as tmp:
        wav = os.path.join(tmp, "w.wav")
        proc = subprocess.run([exe, "-v", voice, "-s", str(speed), "-p", str(pitch), "-w", wav, text],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0 or not os.path.exists(wav):
            raise MissingToolError(f"espeak-ng failed for voice {voice!r}: {proc.stderr.strip() or proc.returncode}")
        return load_wav(wav, sample_rate)
