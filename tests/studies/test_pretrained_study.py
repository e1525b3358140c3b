"""bench pretrained: the docstring pairs, and the records of swapping attention into a trained model."""

import pytest
import torch

from attnlab.studies.pretrained import DocPair, budgets_for, docstring_pairs, run

pytest.importorskip("transformers")  # the tiny model folder is written by transformers

MODULE = '''
def area(r):
    """Return the area of a circle of radius r.

    Uses pi from the math module and squares the radius first.
    """
    return 3.14159 * r * r


def dup(x):
    """Return the area of a circle of radius r.

    The same first line again: a duplicate query, kept once.
    """
    return x


def short(x):
    """Too short."""
    return x
'''


def test_docstring_pairs_cut_the_docstring_out_of_the_code(tmp_path):
    (tmp_path / "geometry.py").write_text(MODULE)
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "test_geometry.py").write_text(MODULE.replace("circle", "square"))
    pairs = docstring_pairs(root=tmp_path)
    assert [p.name for p in pairs] == ["geometry:area"]
    p = pairs[0]
    assert p.query == "Return the area of a circle of radius r."
    assert p.document.startswith("Uses pi from the math module")
    assert "def area(r):" in p.document and "return 3.14159 * r * r" in p.document
    assert "Return the area" not in p.document  # the query's own words are not in its document


def test_a_root_that_is_not_a_folder_is_refused(tmp_path):
    with pytest.raises(ValueError, match="is not a folder"):
        docstring_pairs(root=tmp_path / "missing")


def test_the_standard_library_gives_hundreds_of_pairs():
    pairs = docstring_pairs(300)
    assert len(pairs) == 300 and len({p.query for p in pairs}) == 300


def test_budgets_are_the_sweep_points_below_n():
    assert budgets_for("local", 128) == [("window=16", {"window": 16}), ("window=64", {"window": 64})]
    assert [label for label, _ in budgets_for("local", 512)] == ["window=16", "window=64", "window=256"]
    assert budgets_for("linear", 512) == [("(none)", {})]
    assert budgets_for("dense", 512) == [("trained", {})]


def test_run_measures_fidelity_and_retrieval_against_the_trained_model(tiny_bert):
    words = "the law will never be perfect but its application should be just a cat sat on mat".split()
    gen = torch.Generator().manual_seed(0)
    texts = []
    for i in range(12):
        doc = " ".join(words[int(j)] for j in torch.randint(len(words), (70,), generator=gen))
        texts.append(DocPair(f"m:f{i}", " ".join(doc.split()[:6]), doc))
    recs = run(str(tiny_bert), ["local"], [64], pairs=10, memory=False, texts=texts, max_points=2)
    assert [(r.variant, r.budget) for r in recs] == [("dense", "trained"), ("local", "window=16")]
    dense, local = recs
    assert dense.documents == 10 and dense.cosine_mean == pytest.approx(1.0, abs=1e-6) and dense.recall_delta == 0
    assert dense.time_ratio == 1.0 and local.time_ratio > 0 and dense.step_ratio == 1.0 and local.step_ratio > 0
    assert local.cosine_mean < 1 - 1e-5 and local.cosine_min <= local.cosine_mean  # a window of 16 on 64 tokens changes it
    assert local.recall_delta == pytest.approx(local.recall_at_1 - dense.recall_at_1)
    exact = run(str(tiny_bert), ["local"], [16], pairs=10, memory=False, texts=texts, max_points=1)
    assert exact[1].budget == "window=16" and exact[1].cosine_min > 0.99999  # window >= N: exact


def test_run_refuses_bad_arguments(tiny_bert):
    with pytest.raises(ValueError, match="unknown attention variant 'fast'"):
        run(str(tiny_bert), ["fast"], [32])
    with pytest.raises(ValueError, match="lengths must be in 2 .. 64"):
        run(str(tiny_bert), ["local"], [128])
