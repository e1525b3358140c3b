"""Every variant carries its own budget (short, long, the approximation sweep), and the
arena's, the scaling benchmark's and the approximation table's settings are views of it."""

import pytest
import torch

from attnlab import efficient
from attnlab.efficient import Budget, Sweep

E, H = 16, 4
CATALOGUE = efficient.VARIANTS.in_order()  # the order of registration: dense first, the reference dense_naive last


def no_sweep(name: str) -> bool:
    """What its declaration says has no budget axis: exact attention itself, and a step that reads the layer's input (the
    gated recurrences and fox: another model, not an estimate of softmax attention)."""
    caps = efficient.capabilities(name)
    return caps.family == "exact" or caps.mixer


def build(name, options):
    torch.manual_seed(0)
    return efficient.create(name, embed_dim=E, num_heads=H, **options)


def runs(module, n):
    x = torch.randn(2, n, E, generator=torch.Generator().manual_seed(n))
    out = module(x).output
    assert out.shape == (2, n, E) and torch.isfinite(out).all()


def test_budgets_cover_every_variant_in_catalogue_order():
    assert list(efficient.budgets()) == CATALOGUE and CATALOGUE[0] == "dense" and CATALOGUE[-1] == "dense_naive"
    assert sorted(efficient.budgets()) == efficient.names()


@pytest.mark.parametrize("name", efficient.names())
def test_every_variant_has_budget_metadata_whose_options_construct_it(name):
    cls = efficient.VARIANTS.get(name)
    assert isinstance(vars(cls).get("budget"), Budget), f"{cls.__name__} defines no budget of its own"
    b = efficient.budget(name)
    assert b is cls.budget
    # short: the arena's models pass their own max_len (the longest sequence, 130 there)
    runs(build(name, {**b.short, **({"max_len": 32} if b.max_len else {})}), 32)
    if b.long is None:
        assert name == "dense_naive"  # its N x N weights are what the scaling benchmark's lengths cannot hold
        with pytest.raises(ValueError, match="no settings for long"):
            b.long_options(32)
    else:
        runs(build(name, b.long_options(32)), 32)
    assert (b.sweep is None) == no_sweep(name)  # the exact layers are no point of the approximation table, nor are the
    # recurrences (another model, not an estimate of softmax attention)
    if b.sweep is None:
        return
    assert isinstance(b.sweep, Sweep) and b.sweep.values
    for value in b.sweep.values:
        options = b.sweep_options(min(value, 64), n=64, seed=1)
        assert ("seed" in options) == b.sweep.seeded
        if b.sweep.option is not None:
            assert options[b.sweep.option] == min(value, 64)
        build(name, options)


def test_budget_options_add_max_len_and_seed_only_where_needed():
    lin = efficient.budget("linformer")
    assert lin.long_options(4096) == {"k": 256, "max_len": 4096}
    assert lin.sweep_options(128, n=1024, seed=2) == {"max_len": 1024, "k": 128}
    assert efficient.budget("bigbird").sweep_options(4, n=1024, seed=2) == {"window": 64, "global_tokens": 2, "random_blocks": 4, "seed": 2}
    assert efficient.budget("linear").sweep_options(0, n=64, seed=0) == {}
    assert efficient.budget("dense").sweep_options(0, n=64, seed=0) == {}
    with pytest.raises(TypeError):
        efficient.budget("local").short["window"] = 8  # read-only: the one source cannot drift


def test_the_three_tables_are_views_of_the_budgets():
    from attnlab.arena.presets import VARIANT_OPTIONS
    from attnlab.studies.approximation import BUDGETS
    from attnlab.studies.scaling import SETTINGS

    budgets = efficient.budgets()
    assert VARIANT_OPTIONS == {n: dict(b.short) for n, b in budgets.items()} and list(VARIANT_OPTIONS) == CATALOGUE
    assert SETTINGS == {n: dict(b.long) for n, b in budgets.items() if b.long is not None} and list(SETTINGS) == CATALOGUE[:-1]
    assert list(BUDGETS) == [n for n in CATALOGUE[1:-1] if not no_sweep(n)]
    assert all(BUDGETS[n] == (budgets[n].sweep.label, list(budgets[n].sweep.values)) for n in BUDGETS)
    assert VARIANT_OPTIONS["local"] == {"window": 4} and SETTINGS["local"] == {"window": 256}
    assert BUDGETS["reformer"] == ("hash rounds (16 buckets, chunk 64)", [1, 2, 4, 8])


def test_a_variant_without_a_budget_is_named(monkeypatch):
    monkeypatch.setattr(efficient.LocalAttention, "budget", None)
    with pytest.raises(TypeError, match="'local' attention has no budget"):
        efficient.budget("local")
