"""attnlab list: every registered name with a whole first sentence of its docstring."""

import json

import pytest

from attnlab.cli import app
from attnlab.cli.listing import KINDS
from tests.cli.helpers import runner


@pytest.mark.parametrize("kind", list(KINDS))
def test_list_summaries_are_whole_sentences(kind):
    """A summary is never cut inside a parenthesis or a code span (issue 40: "(Zaheer et al" at the "al. ")."""
    rows = json.loads(runner.invoke(app, ["list", kind, "--json"]).stdout)
    for name, row in rows.items():
        text = row["summary"]
        assert text, name
        assert text.count("(") == text.count(")") and text.count("[") == text.count("]"), (name, text)
        assert not text.endswith((" ", " et al", " q", " q_m")), (name, text)


def test_list_variants_keeps_the_citation_and_stops_at_the_sentence_end():
    rows = json.loads(runner.invoke(app, ["list", "variants", "--json"]).stdout)
    assert rows["bigbird"]["summary"] == ("A sliding window, global tokens and random key blocks "
                                          "(Zaheer et al. 2020, https://arxiv.org/abs/2007.14062)")
    assert rows["dense"]["summary"].startswith("Exact attention on heads: attnlab.attend with this step's score")
    scores = json.loads(runner.invoke(app, ["list", "scores", "--json"]).stdout)
    assert scores["dot"]["summary"] == "Dot-product score q . k (module form of dot)"


def test_a_summary_ends_at_the_first_sentence_end():
    from attnlab.cli.listing import _summary

    class Thing:
        """One thing (Foo et al. 2020), e.g. this. Another sentence
        on two lines.

        A second paragraph."""

    assert _summary(Thing) == "One thing (Foo et al. 2020), e.g. this"


def test_a_variants_options_say_what_each_is_with_its_real_default():
    """Issue 58: gated_deltanet's embed_dim, num_heads and causal shared one sentence about rope and grouped heads, and
    conv_size's default read "-" where the variant's own (4) applies."""
    from attnlab.efficient import chunking

    rows = json.loads(runner.invoke(app, ["list", "variants", "gated_deltanet", "--json"]).stdout)
    helps = {o: rows[o]["help"] for o in ("embed_dim", "num_heads", "causal")}
    assert len(set(helps.values())) == 3 and not any("rope" in h for h in helps.values()), helps
    assert helps["embed_dim"].startswith("E, the width") and helps["num_heads"].startswith("H, each with its own state")
    assert "both directions" in helps["causal"]
    assert rows["conv_size"]["default"] == 4 and rows["segment"]["default"] == chunking.SEGMENT
    gla = json.loads(runner.invoke(app, ["list", "variants", "gla", "--json"]).stdout)
    kda = json.loads(runner.invoke(app, ["list", "variants", "kda", "--json"]).stdout)
    assert gla["conv_size"]["default"] == 0 and kda["segment"]["default"] == 512
    linear = json.loads(runner.invoke(app, ["list", "variants", "linear", "--json"]).stdout)  # a pointer to a base's entry: the base's
    assert linear["causal"]["help"] == "each query attends only to keys at or before its position."


def test_list_tasks_points_at_no_module_docstring():
    """Issue 58: a command-line user cannot read "(see the module docstring)"; the summary says what the task is without it."""
    rows = json.loads(runner.invoke(app, ["list", "tasks", "--json"]).stdout)
    assert not [n for n, row in rows.items() if "docstring" in row["summary"]]
    assert rows["retrieval"]["summary"].startswith("The retrieval task: size training pairs of two length-byte windows; validation")
    assert rows["digits"]["summary"] == "scikit-learn's 8x8 digits as (1, 8, 8) images"
