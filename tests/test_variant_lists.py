"""Every list of variants is read from the registry and the capabilities each variant declares: a
variant registered later (here a tiny subclass of an existing one, under a temporary name) is in
the arena's presets, the studies' defaults, ``attnlab list variants`` and the docs' table wherever
its capabilities allow, and no variant is planned on a task it cannot run."""

import contextlib
import json
import sys
from pathlib import Path

import pytest

from attnlab import efficient
from attnlab.arena import PRESETS, Preset, TaskSetting, Variants, plan
from attnlab.cli import app
from tests.cli.helpers import runner

TODAY_RECALL = ["dense", "local", "linear", "retnet", "gla", "deltanet", "gated_deltanet", "mamba2"]  # the study's list, kept by hand


@contextlib.contextmanager
def registered(name: str, base: type):
    """``base`` subclassed and registered as ``name`` (with a default Budget), removed after."""
    cls = type(f"Test{base.__name__}", (base,), {"__doc__": "A variant registered by a test.", "budget": efficient.Budget()})
    efficient.register(name)(cls)
    try:
        yield name
    finally:
        efficient.VARIANTS.remove(name)


@pytest.fixture
def gated():
    """Causal by ``causal=True``, decodes from a matrix state, a sequence mixer (its gates read the input)."""
    with registered("test_gated", efficient.RetentionAttention) as name:
        yield name


@pytest.fixture
def acausal():
    """No causal form (a linformer)."""
    with registered("test_acausal", efficient.LinformerAttention) as name:
        yield name


def _by_task(specs) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for s in specs:
        out.setdefault(s.task, set()).add(s.variant)
    return out


def test_a_registered_variant_is_planned_by_the_standard_and_lra_presets_where_it_fits(gated, acausal):
    got = _by_task(plan("standard", tasks=["recall", "lookup", "pos"]))
    assert gated in got["recall"] and gated in got["lookup"] and gated in got["pos"]
    assert acausal in got["pos"] and acausal not in got["recall"] and acausal not in got["lookup"]  # causal tasks: a causal form
    assert not {"linformer", "nystrom"} & (got["recall"] | got["lookup"]) and {"linformer", "nystrom"} <= got["pos"]
    lra = _by_task(plan("lra", tasks=["listops", "text"]))
    assert {gated, acausal} <= lra["text"] and {gated, acausal} <= lra["listops"]
    assert "dense_naive" in lra["text"] and "dense_naive" not in lra["listops"]  # the references: the LRA's memory baseline, not at 2K


def test_the_standard_preset_reads_the_registry_when_planned(gated):
    standard = PRESETS["standard"]
    assert list(standard.variants) == [*efficient.select(reference=False), "none"] and gated in standard.variants
    assert "dense_naive" not in standard.variants and "none" == standard.variants[-1]
    recall = standard.tasks["recall"].variants  # bound to its task: the causal ones only
    assert gated in recall and all(efficient.capabilities(v).causal is not None for v in recall if v != "none")


def test_the_quick_preset_keeps_its_curated_choice(gated):
    quick = PRESETS["quick"]
    assert list(quick.tasks["lookup"].variants) == ["dense", "local", "linear", "performer", "retnet", "none"]
    assert list(quick.tasks["text"].variants) == ["dense", "linear", "none"]
    assert gated not in {s.variant for s in plan("quick")}


def test_a_variant_without_a_causal_form_is_never_planned_on_a_causal_task(acausal):
    small = {"pairs": 2, "queries": 2, "num_keys": 8, "num_values": 8, "size": 64}
    mine = Preset({"recall": TaskSetting(small, {"steps": 1}), "pos": TaskSetting({"size": 64}, {"steps": 1, "causal": True}),
                   "digits": TaskSetting({}, {"steps": 1})}, ("dense", "linformer", "nystrom", acausal, "none"))
    got = _by_task(plan(mine))
    assert got["recall"] == {"dense", "none"}  # recall trains causally by its own defaults
    assert got["pos"] == {"dense", "none"}  # pos, made causal by the setting
    assert got["digits"] == {"dense", "linformer", "nystrom", acausal, "none"}
    nothing = Preset({"recall": TaskSetting(small, {"steps": 1}, ("linformer",))}, ("dense",))
    assert plan(nothing) == []  # the task's own choice, none of which fits: not the preset's in its place


def test_variants_is_a_sequence_read_when_asked(gated):
    derived = Variants(select={"family": "gated"})
    assert derived[-1] == "none" and gated in derived and len(derived) == len(efficient.select(family="gated")) + 1
    assert derived == (*efficient.select(family="gated"), "none") and "fitting" not in repr(derived)
    bound = Variants(("dense", "linformer", "none")).for_task("recall", TaskSetting())
    assert list(bound) == ["dense", "none"] and "fitting 'recall'" in repr(bound)
    with pytest.raises(ValueError, match="either names or select"):
        Variants()


def test_the_recall_study_takes_every_input_gated_variant_that_decodes(gated, acausal):
    from attnlab.studies.recall import BASELINES, default_variants

    got = default_variants()
    assert got[:3] == list(BASELINES) and gated in got and acausal not in got
    assert [v for v in got if v in TODAY_RECALL] == TODAY_RECALL  # the list it replaced, in its order
    assert all(efficient.capabilities(v).cache is not None and efficient.capabilities(v).causal for v in got)


class _Planned(Exception):
    pass


def test_bench_recall_defaults_to_the_studys_variants(gated, monkeypatch):
    from attnlab.studies import recall

    def fake(names, *args, **kwargs):
        raise _Planned(names)

    monkeypatch.setattr(recall, "run", fake)
    res = runner.invoke(app, ["bench", "recall", "--pairs", "2", "--embed-dims", "8", "--steps", "1"])
    assert isinstance(res.exception, _Planned) and res.exception.args[0] == recall.default_variants()


def test_bench_scaling_takes_every_variant_with_long_settings(gated, monkeypatch):
    from attnlab.studies import scaling

    assert gated in scaling.SETTINGS and scaling.SETTINGS[gated] == {} and "dense_naive" not in scaling.SETTINGS
    assert list(scaling.SETTINGS) == [n for n, b in efficient.budgets().items() if b.long is not None]

    def fake(sizes, names, **kwargs):
        raise _Planned(names)

    monkeypatch.setattr(scaling, "run", fake)
    res = runner.invoke(app, ["bench", "scaling", "--sizes", "64", "--rounds", "1", "--no-flex", "--no-memory"])
    assert isinstance(res.exception, _Planned) and res.exception.args[0] == list(scaling.SETTINGS)


def test_the_pretrained_swap_takes_the_steps_not_the_mixers(gated, acausal):
    from attnlab.studies.pretrained import default_variants

    got = default_variants()
    assert acausal in got and gated not in got and "dense" not in got and "dense_naive" not in got
    assert [v for v in got if v in efficient.select(mixer=False)] == got


def test_list_variants_shows_each_declared_capability(gated):
    rows = json.loads(runner.invoke(app, ["list", "variants", "--json"]).stdout)
    assert rows[gated]["capabilities"] == efficient.capabilities(gated).describe()
    assert rows["linformer"]["capabilities"]["causal"] is None and rows["dense"]["capabilities"]["causal"] == "mask"
    text = runner.invoke(app, ["list", "variants"]).stdout
    assert gated in text and all(col in text for col in ("family", "causal", "masks", "scores", "cache", "exact", "mixer"))


def test_the_docs_table_has_a_row_per_registered_variant(gated):
    docs = Path(__file__).resolve().parent.parent / "docs"
    sys.path.insert(0, str(docs / "_ext"))
    try:
        import variant_table
    finally:
        sys.path.remove(str(docs / "_ext"))
    rows = variant_table.markdown()[2:]
    assert [r.split(" | ")[0].strip("| `") for r in rows] == efficient.VARIANTS.in_order()
    assert "| `retnet` | gated | option | padding | - | matrix | - | yes |" in "\n".join(rows)
    assert "{variant-table}" in (docs / "guides" / "efficient.md").read_text()


def test_an_encoder_is_causal_by_mask_or_by_flag_as_declared(gated):
    from attnlab.models.encoder import EncoderConfig, EncoderLayer, causal_by_mask

    assert causal_by_mask("dense") and causal_by_mask("dense_naive") and not causal_by_mask("local") and not causal_by_mask(gated)
    with registered("test_exact", efficient.NaiveDenseAttention):
        cfg = EncoderConfig(embed_dim=8, num_heads=2, num_layers=1, attention="test_exact", causal=True, score="cosine")
        layer = EncoderLayer(cfg, None)
        assert layer.causal_mask and layer.attn.step.score_name == "cosine"
    flagged = EncoderLayer(EncoderConfig(embed_dim=8, num_heads=2, num_layers=1, attention=gated, causal=True), None)
    assert not flagged.causal_mask and flagged.attn.causal


def test_a_decoder_takes_the_causal_variants_that_take_q_k_v(gated):
    pytest.importorskip("transformers")
    from attnlab.studies.decoder import decoder_variants

    with registered("test_kernel", efficient.LinearAttention):
        got = decoder_variants()
        assert "test_kernel" in got and gated not in got and "dense" not in got and "linformer" not in got
    assert {"local", "longformer", "bigbird", "performer", "linear", "reformer"} <= set(got)


def test_the_registrys_lists_budgets_and_steps_take_a_registered_variant(gated, acausal):
    """What the tests and tables iterate (the registry's order, the budgets, the selections) and
    the step alone take a variant registered later; the references of another stay last."""
    order = efficient.VARIANTS.in_order()
    assert order[-1] == "dense_naive" and {gated, acausal} <= set(order) and order.index(gated) < order.index("dense_naive")
    assert {gated, acausal} <= set(efficient.budgets()) and gated in efficient.select(mixer=True, forms_scores=False)
    assert acausal in efficient.select(mixer=False, causal=False) and acausal not in efficient.select(mixer=True)
    step = efficient.step(acausal, embed_dim=8, num_heads=2, max_len=8)
    assert step.name == acausal and efficient.capabilities(acausal) is step.capabilities
    with pytest.raises(ValueError, match=f"the '{gated}' attention is a sequence mixer"):  # a mixer has no step alone
        efficient.step(gated, embed_dim=8, num_heads=2, causal=True)
    mixer = efficient.create(gated, embed_dim=8, num_heads=2, causal=True)  # the layer itself
    assert mixer.name == gated and efficient.capabilities(gated) is mixer.capabilities and mixer.causal


def test_a_variants_module_is_imported_and_its_step_exported_without_being_named():
    """deltaproduct was added as its file alone: the package's __init__ does not name it, yet it is
    registered and exported by its class name."""
    init = Path(efficient.__file__).read_text()
    assert "deltaproduct" not in init and "DeltaProduct" not in init
    assert efficient.DeltaProductAttention is efficient.VARIANTS.get("deltaproduct")
    assert "DeltaProductAttention" in efficient.__all__
