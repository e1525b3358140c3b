"""The charts refuse what they cannot draw (moved here from the training and CLI tests: tests mirror src/)."""

import pytest
import torch


def test_charts_refuse_empty_or_mismatched_inputs(tmp_path):
    from attnlab.viz.complexity import plot_complexity, plot_cross_attention, plot_distance

    with pytest.raises(ValueError, match="no timed records"):
        plot_complexity([{"layer": "rnn", "n": 16, "seconds": None, "sequential_steps": 3}], tmp_path / "a.png")
    with pytest.raises(ValueError, match="no distance records"):
        plot_distance([], tmp_path / "b.png")
    with pytest.raises(ValueError, match=r"do not match 2 target x 3 source"):
        plot_cross_attention(torch.zeros(3, 2), ["a", "b", "c"], ["x", "y"], tmp_path / "c.png")
    assert plot_cross_attention(torch.rand(2, 3), ["a", "b", "c"], ["x", "y"], tmp_path / "d.png").stat().st_size > 0


def test_chart_of_no_records_is_an_error(tmp_path):
    from attnlab.viz import plot_attention_benchmark

    with pytest.raises(ValueError, match="no benchmark records"):
        plot_attention_benchmark([], tmp_path / "x.png")
