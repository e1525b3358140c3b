"""The audio front end: 25 ms windows every 10 ms, log-mel / MFCC, espeak-ng synthesis."""

import numpy as np
import pytest
import torch

from attnlab import audio


def _tone(freq, seconds=1.0, sr=16_000):
    t = np.arange(int(seconds * sr)) / sr
    return (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def test_hundred_frames_per_second_and_the_band_follows_the_pitch():
    low, high = audio.features(_tone(500)), audio.features(_tone(4000))
    assert low.shape == (101, 40) and high.shape == (101, 40)  # 1 + 16000 // 160 (centred windows)
    assert audio.features(_tone(440, seconds=60.0)).shape[0] == 6001
    assert int(low[50].argmax()) < int(high[50].argmax())
    assert audio.features(_tone(500), kind="mfcc").shape == (101, 13)
    with pytest.raises(ValueError, match="logmel"):
        audio.features(_tone(500), kind="spectrogram")


def test_normalize_standardises_each_band():
    f = audio.normalize(audio.features(_tone(700) + np.random.default_rng(0).normal(0, 0.01, 16000).astype(np.float32)))
    torch.testing.assert_close(f.mean(0), torch.zeros(40), atol=1e-4, rtol=0)
    torch.testing.assert_close(f.std(0, unbiased=False), torch.ones(40), atol=1e-3, rtol=0)


def test_wav_round_trip_and_bad_files(tmp_path):
    y = _tone(300, 0.5)
    audio.save_wav(tmp_path / "a.wav", y)
    back = audio.load_wav(tmp_path / "a.wav")
    assert back.shape == y.shape and float(np.abs(back - y).max()) < 1e-3  # 16-bit PCM
    (tmp_path / "bad.wav").write_text("not audio")
    with pytest.raises(ValueError, match="cannot read audio file .*bad.wav"):
        audio.load_wav(tmp_path / "bad.wav")


def test_synthesize_speaks_and_missing_espeak_is_a_clear_error(monkeypatch):
    y = audio.synthesize("yes", voice="en+f2", speed=180, pitch=60)
    assert 0.15 * 16000 < len(y) < 1.5 * 16000 and float(np.abs(y).max()) > 0.05
    assert not np.allclose(y[: len(y) // 2], 0)
    monkeypatch.setattr(audio.shutil, "which", lambda name: None)
    with pytest.raises(audio.MissingToolError, match="apt install espeak-ng"):
        audio.synthesize("yes")


def test_cli_says_so_when_espeak_is_missing(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from attnlab.cli import app

    monkeypatch.setattr(audio.shutil, "which", lambda name: None)
    res = CliRunner().invoke(app, ["train", "speech", "--size", "8", "--task-option", f"cache={tmp_path}", "--out", str(tmp_path / "run")])
    assert res.exit_code == 1 and "apt install espeak-ng" in " ".join(res.output.split())  # a missing tool: run time


def test_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    from attnlab.tasks.speech import cache_dir

    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"
    monkeypatch.delenv("ATTNLAB_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cache_dir() == tmp_path / "x" / "attnlab"
    assert audio.frames_per_second() == pytest.approx(100.0)
