"""attnlab's recurrences inside transformers' hybrid models where people train: gradient
checkpointing (reentrant and not) with and without packed documents, packed rows under a cache,
threads with served and unserved models side by side, and ``torch.compile``."""

import copy
import sys
import threading

import pytest
import torch

transformers = pytest.importorskip("transformers")

from attnlab.efficient import recurrence  # noqa: E402
from attnlab.integrations.hybrid import tiny_config, use_kernels  # noqa: E402
from attnlab.integrations.packing import PackedWithCache  # noqa: E402
from tests.helpers import assert_close_rel  # noqa: E402
from tests.integrations.test_hybrid import FAMILIES, FLOAT32, build  # noqa: E402

LENGTHS = [37, 70, 43]  # three documents in one row: a chunk of 64 crossed, and remainders


def _inputs(n=None, seed=11):
    n = sum(LENGTHS) if n is None else n
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 128, (1, n), generator=g)
    return ids, torch.randn(1, n, 128, generator=g)  # the weights of a linear read-out of the logits


def _grads(model, ids, weights, run=None, **call):
    """Parameter gradients of a linear read-out of the logits (additive over documents, unlike a
    shifted language-model loss, which would cross their boundaries); ``run``: the model's
    compiled form, if any."""
    model.zero_grad()
    ((model if run is None else run)(ids, use_cache=False, **call).logits * weights).sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _checkpointed(family, reentrant):
    model = build(family, **({"experts_implementation": "eager"} if family in ("qwen3_next", "kimi_linear") else {})).train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    return model


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
@pytest.mark.parametrize("family", FAMILIES)
def test_checkpointed_training_equals_transformers_and_packed_rows_equal_their_documents(family, reentrant):
    """Checkpointed, the served model's gradients are within 1e-4 of a float64 run, equal
    transformers' checkpointed path's within 1e-4 wherever that path is right (within 1e-4 of the
    float64 run: not the Qwen decays' parameters, see test_hybrid.py), equal its own without
    checkpointing (float32 rounding), and, on a packed row, the sum of its documents' gradients each
    run alone."""
    model = _checkpointed(family, reentrant)
    ids, weights = _inputs()
    ref = _grads(model, ids, weights)  # transformers' own path, checkpointed
    exact = copy.deepcopy(model).double()
    use_kernels(model), use_kernels(exact)
    want = _grads(exact, ids, weights.double())
    grads = _grads(model, ids, weights)
    model.gradient_checkpointing_disable()
    plain = _grads(model, ids, weights)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    assert grads.keys() == ref.keys() == plain.keys() == want.keys()
    right = 0
    for name in grads:
        assert_close_rel(grads[name], want[name], 1e-4, f"{family} checkpointed gradient of {name} against float64")
        assert_close_rel(grads[name], plain[name], FLOAT32 / 10, f"{family} checkpointed against not, gradient of {name}")
        if (ref[name] - want[name]).abs().max() <= 1e-4 * want[name].abs().max():
            right += 1
            assert_close_rel(grads[name], ref[name], 1e-4, f"{family} checkpointed gradient of {name} against transformers")
    assert right >= len(grads) - 6  # transformers' path is wrong on a few decay parameters at most
    # packed: the row's gradients are the sum of its documents' gradients, each run alone
    positions = torch.cat([torch.arange(n) for n in LENGTHS])[None]
    packed = _grads(model, ids, weights, position_ids=positions)
    alone = [_grads(model, part, w) for part, w in zip(ids.split(LENGTHS, 1), weights.split(LENGTHS, 1))]
    for name in packed:
        total = sum(a[name] for a in alone if name in a)
        assert_close_rel(packed[name], total, 1e-4, f"{family} packed checkpointed gradient of {name}")


@pytest.mark.parametrize("family", FAMILIES)
def test_a_packed_row_with_a_cache_is_refused_whatever_use_cache_says(family):
    model = build(family)
    use_kernels(model)
    ids, _ = _inputs()
    positions = torch.cat([torch.arange(n) for n in LENGTHS])[None]
    assert model.config.use_cache  # the default: a cache
    for call in ({}, {"use_cache": True}):
        with pytest.raises(PackedWithCache, match=r"a row of 3 packed documents.*use_cache=False"), torch.no_grad():
            model(ids, position_ids=positions, **call)
    with torch.no_grad():  # one sequence with a cache is served as before
        assert model(ids, position_ids=torch.arange(ids.shape[1])[None]).logits.shape == (1, ids.shape[1], 128)


def test_two_threads_serving_their_own_models_beside_an_unserved_one(monkeypatch):
    """Two served Qwen3-Next models and an unserved one of the same family, each in its own
    thread for 200 calls: every output equals that model's single-threaded output, and no call of
    the unserved model's thread reaches attnlab's recurrences (counted per thread)."""
    reached: dict[int, int] = {}
    original = recurrence.chunk_delta

    def counted(*a, **kw):
        reached[threading.get_ident()] = reached.get(threading.get_ident(), 0) + 1
        return original(*a, **kw)
    monkeypatch.setattr(recurrence, "chunk_delta", counted)
    models = [build("qwen3_next") for _ in range(3)]
    for i, m in enumerate(models):
        with torch.no_grad():
            for p in m.parameters():
                p.add_(0.01 * i)  # three different models
    use_kernels(models[0]), use_kernels(models[1])
    inputs = [torch.randint(3, 128, (1, 24), generator=torch.Generator().manual_seed(20 + i)) for i in range(4)]
    with torch.no_grad():
        alone = [[m(x, use_cache=False).logits for x in inputs] for m in models]
    reached.clear()
    wrong: list[str] = []
    idents: dict[int, int] = {}

    def run(i):
        idents[i] = threading.get_ident()
        with torch.no_grad():
            for call in range(200):
                x = call % len(inputs)
                if not torch.equal(models[i](inputs[x], use_cache=False).logits, alone[i][x]):
                    wrong.append(f"model {i}, call {call}")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong, wrong[:5]
    assert reached.get(idents[2], 0) == 0  # the unserved model: transformers' path every time
    assert reached[idents[0]] == reached[idents[1]] == 200 * 3  # three Gated DeltaNet layers a call
    modeling = sys.modules[type(models[2]).__module__]
    assert modeling.torch_chunk_gated_delta_rule.__module__ == modeling.__name__  # transformers' module is never changed


def test_compiled_served_model_equals_eager():
    """One compilation (the suite's time: its first compile takes a minute): a packed row's logits
    and every gradient (the packed row runs the served functions with offsets, the one-sequence
    path without them is the same functions)."""
    torch.manual_seed(0)
    config = tiny_config("qwen3_next", layers=1, layer_types=["linear_attention"])
    model = transformers.AutoModelForCausalLM.from_config(config).float().eval()
    use_kernels(model)
    ids, weights = _inputs(n=90)
    positions = torch.cat([torch.arange(40), torch.arange(50)])[None]
    compiled = torch.compile(model)
    ref = _grads(model, ids, weights, position_ids=positions)
    eager_packed = model(ids, position_ids=positions, use_cache=False).logits.detach()
    model.zero_grad()
    packed = compiled(ids, position_ids=positions, use_cache=False).logits
    assert_close_rel(packed.detach(), eager_packed, FLOAT32, "compiled, packed")
    (packed * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert grads.keys() == ref.keys()
    for name in ref:
        assert_close_rel(grads[name], ref[name], FLOAT32 * 10, f"compiled gradient of {name}")
