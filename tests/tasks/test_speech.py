"""Audio tasks: locally synthesised spoken words (cached WAVs) and the user's folder of clips."""

import json
import os

import numpy as np
import pytest
import torch

from attnlab import audio, tasks


@pytest.mark.slow
def test_speech_clips_are_cached_balanced_and_deterministic(tmp_path):
    task = tasks.create("speech", size=40, words="yes,no", cache=str(tmp_path))
    (folder,) = [p for p in tmp_path.iterdir() if p.name.startswith("speech-")]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["words"] == ["yes", "no"] and len(list(folder.glob("*.wav"))) == 40 + 64 + 64
    tr = task.split("train")
    assert tr.tokens.shape == (40, 101, 40) and bool(tr.mask.all())  # 1 s clips: 101 frames of 40 log-mel bands
    assert torch.bincount(tr.labels).tolist() == [20, 20]
    clip = manifest["plan"]["train"][0]
    y = audio.load_wav(folder / clip["file"])
    assert len(y) == 16000 and float(np.abs(y).max()) > 0.05
    stamp = os.path.getmtime(folder / clip["file"])
    again = tasks.create("speech", size=40, words="yes,no", cache=str(tmp_path))  # from the cache: nothing rewritten
    assert os.path.getmtime(folder / clip["file"]) == stamp
    assert torch.equal(again.split("test").tokens, task.split("test").tokens)
    other = tasks.create("speech", size=40, words="yes,no", seed=1, cache=str(tmp_path))
    assert not torch.equal(other.split("train").tokens, tr.tokens)


def test_an_interrupted_cache_is_completed(tmp_path):
    tasks.create("speech", size=8, words="up,down", cache=str(tmp_path))
    (folder,) = list(tmp_path.iterdir())
    (folder / "manifest.json").unlink()
    victim = sorted(folder.glob("*.wav"))[3]
    victim.unlink()
    task = tasks.create("speech", size=8, words="up,down", cache=str(tmp_path))
    assert victim.exists() and (folder / "manifest.json").exists() and len(task.split("train")) == 8


def test_speech_refuses_bad_options():
    with pytest.raises(ValueError, match="two distinct"):
        tasks.create("speech", words="yes")
    with pytest.raises(ValueError, match="features"):
        tasks.create("speech", features="raw")


def _tone_folder(root, freqs=(("low", 300), ("high", 2500)), count=12):
    rng = np.random.default_rng(0)
    for label, f in freqs:
        (root / label).mkdir(parents=True)
        for i in range(count):
            n = int(rng.integers(4000, 9000))
            t = np.arange(n) / 16000
            y = 0.3 * np.sin(2 * np.pi * f * (1 + 0.05 * rng.random()) * t) + rng.normal(0, 0.05, n)
            audio.save_wav(root / label / f"{i}.wav", y.astype(np.float32))


def test_wav_folder_reads_labels_from_subfolders_and_a_model_learns_them(tmp_path):
    from attnlab.training import TrainConfig, train

    _tone_folder(tmp_path / "data")
    task = tasks.create("wav_folder", path=str(tmp_path / "data"))
    assert task.label_names == ["high", "low"] and sum(len(s) for s in task.splits.values()) == 24
    tr = task.split("train")
    assert tr.tokens.shape[2] == 40 and not bool(tr.mask.all())  # clips of different lengths are padded
    res = train(TrainConfig.for_task("wav_folder", task_options={"path": str(tmp_path / "data")}, model="conformer", steps=60,
                                     eval_every=20, attention="local", model_options={"attention_options": {"window": 8}}),
                tmp_path / "run")
    assert res.value == 1.0


def test_wav_folder_errors(tmp_path):
    with pytest.raises(ValueError, match="needs path="):
        tasks.create("wav_folder")
    (tmp_path / "only").mkdir()
    audio.save_wav(tmp_path / "only" / "a.wav", np.zeros(800, dtype=np.float32))
    with pytest.raises(ValueError, match="at least two subfolders"):
        tasks.create("wav_folder", path=str(tmp_path))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "b.wav").write_text("not audio")
    (tmp_path / "other" / "c.wav").write_text("not audio")
    with pytest.raises(ValueError, match="cannot read audio file .*b.wav"):
        tasks.create("wav_folder", path=str(tmp_path))


@pytest.mark.slow
def test_heldout_voices_keep_test_speakers_out_of_training(tmp_path):
    tasks.create("speech", size=40, words="yes,no", cache=str(tmp_path), heldout_voices=True)
    (folder,) = list(tmp_path.iterdir())
    plan = json.loads((folder / "manifest.json").read_text())["plan"]
    train_voices = {c["voice"] for c in plan["train"] + plan["val"]}
    test_voices = {c["voice"] for c in plan["test"]}
    assert train_voices and test_voices and not (train_voices & test_voices)
    assert all(v.startswith("en-gb-x-rp") or v.endswith(("+m7", "+f4")) for v in test_voices)
