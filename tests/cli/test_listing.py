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
