"""Self-pretraining: the corruption is BERT's (exact shares, only real tokens, at least one per
row), causal backbones predict the next token, the loss is the cross-entropy at exactly the
scored positions, and ``train(pretrain_steps=...)`` pretrains every token backbone and variant
within its budget, then fine-tunes from those weights."""

import itertools
import math
import types

import pytest
import torch

from attnlab import efficient
from attnlab.arena.presets import VARIANT_OPTIONS
from attnlab.models import ModelConfig, build_model
from attnlab.models.base import FIRST, IGNORE, PAD
from attnlab.models.config import AttentionSpec, PositionalSpec
from attnlab.objectives.denoising import MASK, Denoising, DenoisingModel, token_backbone
from attnlab.training import TrainConfig, load_checkpoint, train

V = 40
TINY = dict(task_options={"size": 128}, steps=4, eval_every=2, embed_dim=16, num_layers=1, num_heads=2, warmup=2, batch_size=16)


def _rows(b=400, n=60, seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(FIRST, V, (b, n), generator=g)
    lengths = torch.randint(1, n + 1, (b,), generator=g)
    tokens[torch.arange(n)[None, :] >= lengths[:, None]] = PAD
    return tokens


def test_bidirectional_corruption_follows_berts_shares_on_real_tokens_only():
    tokens = _rows()
    x, y = Denoising().corrupt(tokens, V, causal=False, generator=torch.Generator().manual_seed(1))
    real = tokens != PAD
    chosen = y != IGNORE
    assert not (chosen & ~real).any() and torch.equal(y[chosen], tokens[chosen])  # labels: the originals, at real tokens only
    assert chosen.any(1).all()  # every row restores one token at least
    assert torch.equal(x[~chosen], tokens[~chosen])  # nothing else is touched (padding stays padding)
    share = chosen.sum() / real.sum()
    assert 0.14 < share < 0.18  # 15 %, plus the rows whose draw chose none
    masked = (x[chosen] == MASK).float().mean()
    kept = (x[chosen] == tokens[chosen]).float().mean()
    assert 0.77 < masked < 0.83 and 0.08 < kept < 0.13  # 80 % MASK, 10 % kept (+ random draws equal to the original)
    noise = x[chosen & (x != MASK) & (x != tokens)]
    assert ((noise >= FIRST) & (noise < V)).all()  # random replacements are real tokens of the vocabulary


def test_causal_backbones_predict_the_next_real_token():
    tokens = torch.tensor([[5, 6, 7, PAD], [8, 9, 10, 11]])
    x, y = Denoising().corrupt(tokens, V, causal=True)
    assert torch.equal(x, tokens)
    assert y.tolist() == [[6, 7, IGNORE, IGNORE], [9, 10, 11, IGNORE]]


def test_the_loss_is_the_cross_entropy_at_exactly_the_scored_positions():
    torch.manual_seed(0)
    model = build_model(ModelConfig(kind="classification", model="transformer", num_labels=3, embed_dim=16, num_layers=1, num_heads=2,
                                    vocab_size=V, attention=AttentionSpec("dense", {}), positional=PositionalSpec("none"), max_len=64))
    den = DenoisingModel(token_backbone(model)).eval()
    tokens = _rows(4, 12)
    obj = Denoising()
    loss = obj.loss(den, {"tokens": tokens}, generator=torch.Generator().manual_seed(3))
    x, y = obj.corrupt(tokens, V, causal=False, generator=torch.Generator().manual_seed(3))
    logits = den(x).output.double()
    scored = y != IGNORE
    expected = -torch.log_softmax(logits, -1)[scored].gather(-1, y[scored][:, None]).mean()
    assert abs(float(loss.detach()) - float(expected.detach())) < 1e-5
    # the output layer is the input embedding (tied, scaled by 1 / sqrt(width)) plus a bias: the states against every embedding
    states, w = den.backbone(tokens, tokens == PAD).output, den.backbone.embed.weight
    assert torch.allclose(den(tokens).output, states @ w.T / w.shape[1] ** 0.5 + den.bias, atol=1e-5)


def test_models_without_tokens_are_refused_by_name():
    model = build_model(ModelConfig(kind="classification", model="vit", inputs="image", feature_dim=1, num_labels=10, embed_dim=16,
                                    num_layers=1, num_heads=2, options={"image_size": [8, 8]}))
    with pytest.raises(ValueError, match="self-pretraining restores tokens: .* reads image"):
        token_backbone(model)
    with pytest.raises(ValueError, match="rate must be in"):
        Denoising(0.0)


@pytest.mark.parametrize("task, extra", [
    ("pos", {}),  # tagging, bidirectional transformer
    ("pos", {"model": "window_mlp"}),
    ("pos", {"model": "mlp"}),  # causal: next token
    ("pos", {"causal": True}),
    ("retrieval", {"task_options": {"size": 64, "length": 64}}),  # pairs: each sequence alone
    ("translate", {"task_options": {"size": 64}}),  # seq2seq: the encoder
])
def test_pretraining_trains_every_token_backbone_then_fine_tunes_from_its_weights(tmp_path, task, extra):
    cfg = TrainConfig.for_task(task, **{**TINY, **extra}, pretrain_steps=40)
    seen = []
    res = train(cfg, tmp_path, on_pretrain_step=lambda s, t, loss: seen.append((s, t)))
    assert seen == [(s, 40) for s in range(1, 41)] and res.pretrain["steps"] == 40 and res.steps == cfg.steps
    assert res.pretrain["causal"] == (extra.get("model") == "mlp" or extra.get("causal", False))
    assert res.pretrain["loss_last"] < res.pretrain["loss_first"]  # it learnt something about the inputs (steps 31-40 against 1-10)
    ck = load_checkpoint(tmp_path)
    assert ck.meta["pretrain"] == res.pretrain
    from attnlab.training import evaluate

    assert evaluate(tmp_path).pretrain == res.pretrain  # eval --json reports it too


def test_pretraining_changes_the_backbone_only_and_a_resume_does_not_repeat_it(tmp_path):
    from attnlab import tasks
    from attnlab.training.config import model_config
    from attnlab.training.pretraining import pretrain

    cfg = TrainConfig.for_task("pos", **{**TINY, "steps": 1}, pretrain_steps=5)
    task = tasks.create("pos", size=128)
    model = build_model(model_config(cfg, task))
    init = {k: v.clone() for k, v in model.state_dict().items()}
    pretrain(model, task, cfg, "fp32")
    after = model.state_dict()
    assert torch.equal(after["head.weight"], init["head.weight"])  # the task's head waits for the labels
    assert not torch.equal(after["backbone.embed.weight"], init["backbone.embed.weight"])
    ran = train(cfg, tmp_path)
    calls = []
    again = train(TrainConfig.for_task("pos", **{**TINY, "steps": 3}, pretrain_steps=5), tmp_path, resume=True,
                  on_pretrain_step=lambda *a: calls.append(a))
    assert calls == [] and again.pretrain == ran.pretrain and again.steps == 3


@pytest.mark.parametrize("variant", efficient.names())
def test_pretraining_works_for_every_attention_variant(tmp_path, variant):
    opts = dict(VARIANT_OPTIONS.get(variant, {}))
    res = train(TrainConfig.for_task("pos", **{**TINY, "steps": 1}, attention=variant, attention_options=opts, pretrain_steps=3), tmp_path)
    assert res.pretrain["steps"] == 3 and math.isfinite(res.pretrain["loss_first"]) and math.isfinite(res.pretrain["loss_last"])


def test_the_time_budget_covers_both_phases(tmp_path, monkeypatch):
    from attnlab.training import loop, pretraining

    clock = itertools.count(0.0, 0.25)  # every reading of the clock is 0.25 s later: each step takes 0.25 s
    for module in (loop, pretraining):  # one clock for both phases
        monkeypatch.setattr(module, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    cfg = TrainConfig.for_task("pos", **{**TINY, "steps": 1000, "eval_every": 2}, seconds=2.0, pretrain_steps=1000, pretrain_share=0.25)
    res = train(cfg, tmp_path)
    assert res.pretrain["steps"] == 2 and res.pretrain["seconds"] == 0.5  # a quarter of the budget
    assert res.stopped_by == "budget" and res.history[-1]["seconds"] == 2.0  # the whole budget, pretraining included
    assert res.steps == 6  # the other 1.5 s fine-tune


def test_pretraining_runs_in_one_process_and_needs_tokens(tmp_path):
    with pytest.raises(ValueError, match="reads image"):
        train(TrainConfig.for_task("digits", steps=1, embed_dim=16, num_layers=1, num_heads=2, pretrain_steps=2), tmp_path)
    with pytest.raises(ValueError, match="pretrain_steps must be an int >= 0"):
        TrainConfig.for_task("pos", pretrain_steps=-1)
    with pytest.raises(ValueError, match="pretrain_share"):
        TrainConfig.for_task("pos", pretrain_share=1.0)
