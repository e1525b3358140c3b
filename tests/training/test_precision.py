"""Mixed precision: ``auto`` resolves from the CPU's flags, every attention path runs under bf16
autocast within bfloat16's error of float32 with float32 weights and gradients, runs store their
precision and evaluate in it, and the utilisation figures are what they claim."""

import math
import warnings

import pytest
import torch

from attnlab import efficient, profiling
from attnlab.arena.presets import VARIANT_OPTIONS
from attnlab.models import Encoder, ModelConfig, build_model
from attnlab.models.config import AttentionSpec, PositionalSpec
from attnlab.profiling import count_flops, measure_peak, peak_flops
from attnlab.training import ConfigMismatchError, TrainConfig, evaluate, load_checkpoint, train
from attnlab.training import precision as P
from tests.helpers import assert_close_rel

TINY = dict(task_options={"size": 128}, steps=6, eval_every=3, embed_dim=16, num_layers=1, num_heads=2, warmup=2, batch_size=16)

BF16_TOL = 0.05
"""Relative error of a bf16-autocast forward against float32: a few of bfloat16's 2^-8 roundings
through two blocks."""


@pytest.mark.parametrize("flags, expected", [({"avx512_bf16"}, "bf16"), ({"amx_bf16", "avx2"}, "bf16"), ({"avx512f", "avx2"}, "fp32"),
                                             (set(), "fp32")])
def test_auto_is_bf16_exactly_where_the_cpu_has_native_bfloat16(monkeypatch, flags, expected):
    monkeypatch.setattr(P, "_cpu_flags", lambda: frozenset(flags))
    assert P.resolve("auto", "cpu") == expected
    assert P.resolve("fp32", "cpu") == "fp32" and P.resolve("bf16", "cpu") == "bf16"  # asked for: given, native or not


def test_bad_precisions_are_refused_with_the_choices():
    with pytest.raises(ValueError, match="fp32, bf16, auto"):
        P.resolve("fp16")
    with pytest.raises(ValueError, match="precision must be one of fp32, bf16, auto"):
        TrainConfig.for_task("pos", precision="half")


def test_autocast_runs_matrix_products_in_bf16_and_nothing_in_fp32():
    lin = torch.nn.Linear(8, 8)
    x = torch.randn(2, 8)
    with P.autocast("fp32"):
        assert lin(x).dtype == torch.float32
    with P.autocast("bf16"):
        assert lin(x).dtype == torch.bfloat16


def _variant_cases():
    for name in efficient.names():
        for causal in (False, True):
            yield name, causal


@pytest.mark.parametrize("name, causal", list(_variant_cases()))
def test_every_variant_under_bf16_autocast_stays_within_bfloat16_error_with_float32_gradients(name, causal):
    opts = dict(VARIANT_OPTIONS.get(name, {}))
    if name == "reformer":
        opts["seed"] = 0  # the same hash rotations in both runs
    if name == "linformer":
        opts["max_len"] = 96
    torch.manual_seed(0)
    try:
        enc = Encoder(32, 4, 2, attention=name, attention_options=opts, causal=causal)
    except ValueError as e:
        assert "causal" in str(e)  # a variant with no causal form says so
        return
    x = torch.randn(2, 96, 32)
    pad = torch.zeros(2, 96, dtype=torch.bool)
    pad[1, 70:] = True
    mask = ~pad[:, None, None, :]
    ref = enc(x, mask=mask).output
    ref.pow(2).mean().backward()
    params = [p for p in enc.parameters() if p.grad is not None]  # reformer's shared QK leaves the key projection unused
    ref_grads = [p.grad.clone() for p in params]
    enc.zero_grad()
    with P.autocast("bf16"):
        out = enc(x, mask=mask).output
    out.float().pow(2).mean().backward()
    tol = 0.3 if name == "reformer" else BF16_TOL  # a bf16 rounding may move a key to another hash bucket
    assert_close_rel(out.float()[~pad], ref[~pad], tol, f"{name} causal={causal}")
    for p in params:
        assert p.dtype == torch.float32 and p.grad.dtype == torch.float32 and torch.isfinite(p.grad).all()
    grad = torch.cat([p.grad.flatten() for p in params])
    ref_grad = torch.cat([g.flatten() for g in ref_grads])
    cos = torch.nn.functional.cosine_similarity(grad.double(), ref_grad.double(), dim=0)
    assert cos > (0.9 if name == "reformer" else 0.99), f"{name}: gradient direction off, cosine {cos:.4f}"


@pytest.mark.parametrize("positional", ["rope", "alibi", "sinusoidal"])
def test_cached_decoding_under_bf16_follows_the_full_forward(positional):
    torch.manual_seed(0)
    cfg = ModelConfig(kind="lm", model="lm", num_labels=40, embed_dim=32, num_layers=2, num_heads=4, vocab_size=40,
                      attention=AttentionSpec("dense", {}), positional=PositionalSpec(positional), max_len=64, causal=True)
    lm = build_model(cfg).eval()
    tokens = torch.randint(2, 40, (2, 30))
    with torch.no_grad(), P.autocast("bf16"):
        full = lm(tokens).output.float()
        cache = lm.new_cache()
        steps = [lm(tokens[:, :10], cache=cache).output.float()]
        steps += [lm(tokens[:, i : i + 1], cache=cache).output.float() for i in range(10, 30)]
    assert_close_rel(torch.cat(steps, dim=1), full, BF16_TOL, f"cache bf16 {positional}")


def test_a_bf16_run_keeps_float32_weights_stores_its_precision_and_evaluates_in_it(tmp_path):
    cfg = TrainConfig.for_task("pos", **TINY, precision="bf16")
    res = train(cfg, tmp_path)
    assert res.precision == "bf16"
    ck = load_checkpoint(tmp_path)
    assert ck.config.precision == "bf16" and ck.meta["precision"] == "bf16"
    assert all(p.dtype == torch.float32 for p in ck.model.parameters())
    # over the higher of the two peaks: where bfloat16 is emulated, the float32 part of the step outruns it
    assert math.isclose(res.peak_fraction, res.flop_rate / max(peak_flops("bf16"), peak_flops("fp32"))) and 0 < res.peak_fraction < 1
    again = evaluate(tmp_path)
    assert again.precision == "bf16" and again.value == res.value  # the test score is reproduced in the run's precision
    with pytest.raises(ConfigMismatchError, match="precision"):
        train(TrainConfig.for_task("pos", **{**TINY, "steps": 8}, precision="fp32"), tmp_path, resume=True)


@pytest.mark.parametrize("flags, warned", [(set(), True), ({"avx512_bf16"}, False)])
def test_explicit_bf16_warns_once_where_bfloat16_is_emulated(tmp_path, monkeypatch, flags, warned):
    monkeypatch.setattr(P, "_cpu_flags", lambda: frozenset(flags))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(TrainConfig.for_task("pos", **{**TINY, "steps": 2, "eval_every": 2}, precision="bf16"), tmp_path)
    emulated = [w for w in caught if issubclass(w.category, P.EmulatedBF16Warning)]
    assert len(emulated) == warned
    if warned:
        assert "--precision auto picks fp32" in str(emulated[0].message)


def test_flops_are_counted_as_two_per_multiply_add_cpu_flash_attention_included():
    a, b = torch.randn(6, 7), torch.randn(7, 5)
    assert count_flops(lambda: a @ b) == 2 * 6 * 7 * 5
    q, k, v = (torch.randn(2, 3, 16, 8) for _ in range(3))
    # q k^T and the weights times v: 2 x (2 * B * H * N * M * D)
    assert count_flops(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)) == 2 * (2 * 2 * 3 * 16 * 16 * 8)


def test_the_peak_is_measured_once_per_process_under_either_name_of_a_precision():
    first = measure_peak("float32")
    assert first.flops > 1e8 and measure_peak("fp32") is first and measure_peak(torch.float32) is first  # cached: one measurement
    assert peak_flops("fp32") == first.flops == 2 * first.size**3 / first.seconds
    assert 2 <= first.repeats <= 5 and 128 <= first.size <= profiling.PEAK_MAX_SIZE
    assert f"{first.size}^3" in first.describe() and "float32" in first.describe()
    with pytest.raises(ValueError, match=r"float32 \(fp32\) or bfloat16 \(bf16\)"):
        peak_flops("float16")


@pytest.mark.parametrize("target, max_size, size", [(0.0, 2048, 128), (1e9, 256, 256)])
def test_the_peak_grows_its_product_until_one_takes_the_target_time_or_reaches_the_largest_side(monkeypatch, target, max_size, size):
    """What bounds the measurement on any CPU: a product slower than the target stops the growth
    (a target of 0 s: the first, 128^3), the side never passes the largest, and the repetitions
    stop at five (or at the budget, after two)."""
    monkeypatch.setattr(profiling, "PEAK_TARGET", target)
    monkeypatch.setattr(profiling, "PEAK_MAX_SIZE", max_size)
    profiling._measure_peak.cache_clear()
    try:
        got = measure_peak("bfloat16")
    finally:
        profiling._measure_peak.cache_clear()
    assert got.size == size and got.dtype == "bfloat16" and 2 <= got.repeats <= 5


def test_a_runs_utilisation_is_its_flops_over_its_step_time_and_the_peak(tmp_path):
    res = train(TrainConfig.for_task("pos", **TINY), tmp_path)
    assert res.flops_per_step > 0
    assert math.isclose(res.flop_rate, res.flops_per_step * res.steps_run / res.step_seconds)
    assert math.isclose(res.peak_fraction, res.flop_rate / peak_flops("float32" if res.precision == "fp32" else "bfloat16"))
    assert 0 < res.peak_fraction < 1  # a small model's step (norms, softmax, the optimizer) cannot beat a large matrix product


@pytest.mark.parametrize("options", [{"model_options": {"dropout": 0.1}},
                                     {"attention": "performer", "attention_options": {"redraw_interval": 2, "num_features": 8}}])
def test_counting_flops_leaves_the_run_bitwise_unchanged(tmp_path, monkeypatch, options):
    """The count is taken during the run's first step (PyTorch's FlopCounterMode around it): the
    weights, dropout's random state and Performer's redraw counter are those of a run that counts
    nothing, bit for bit; a resumed run does not count again (the count is in the checkpoint)."""
    import contextlib

    from attnlab.training import loop

    cfg = TrainConfig.for_task("pos", **TINY, **options)
    a = train(cfg, tmp_path / "a")
    assert a.flops_per_step > 0 and load_checkpoint(tmp_path / "a").meta["flops_per_step"] == a.flops_per_step

    class Nothing(contextlib.nullcontext):
        def __enter__(self):
            return self

        def get_total_flops(self):
            return 0

    monkeypatch.setattr(loop, "flop_counter", Nothing)
    b = train(cfg, tmp_path / "b")
    assert b.flops_per_step == 0 and b.flop_rate is None
    sa, sb = (load_checkpoint(p, weights="last").model.state_dict() for p in (tmp_path / "a", tmp_path / "b"))
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    counted = []
    monkeypatch.setattr(loop, "flop_counter", lambda: counted.append(1) or Nothing())
    longer = train(TrainConfig.for_task("pos", **{**TINY, "steps": 9}, **options), tmp_path / "a", resume=True)
    assert longer.flops_per_step == a.flops_per_step and counted == []  # read back from the checkpoint, not counted again


def test_predict_runs_in_the_runs_precision(tmp_path, monkeypatch):
    from attnlab.training import inference, predict
    from tests.tasks.test_jsonl import tagging_rows, write

    data = write(tmp_path / "t.jsonl", tagging_rows(60))
    cfg = TrainConfig.for_task("jsonl", task_options={"path": str(data)}, steps=4, eval_every=2, embed_dim=16, num_layers=1, num_heads=2,
                               precision="bf16")
    train(cfg, tmp_path / "run")
    seen = []
    real = inference.autocast
    monkeypatch.setattr(inference, "autocast", lambda precision, device: seen.append(precision) or real(precision, device))
    rows = predict(tmp_path / "run", [{"tokens": ["I", "saw", "a", "saw"]}])
    assert seen == ["bf16"] and len(rows[0]["prediction"]) == 4


def test_reformer_hashes_in_float32_under_bf16_autocast():
    """The bucket of a position is its float32 projection's argmax, autocast or not: a bfloat16
    projection (what autocast would run) moves the near-ties to other buckets."""
    from attnlab.efficient.reformer import lsh_buckets

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 512, 32, generator=g).bfloat16().float()
    rotations = torch.randn(2, 32, 16, generator=g)
    plain = lsh_buckets(x, rotations)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(lsh_buckets(x, rotations), plain)
        assert torch.equal(lsh_buckets(x.bfloat16(), rotations), plain)  # a bfloat16 input is widened first
    proj = torch.einsum("bhnd,rdk->bhrnk", x.bfloat16(), rotations.bfloat16()).float()
    rounded = torch.cat([proj, -proj], dim=-1).argmax(-1)
    assert (rounded != plain).any()  # the bfloat16 product would have moved some: the check above can fail
