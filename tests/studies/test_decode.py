"""The decoding study and ``attnlab bench decode``: every implementation measured side by side,
cached tokens equal to uncached ones, a bounded cache's bytes constant over the stream, the
perplexity methods where they must agree, and the report read back from its file."""

import json

import pytest
import torch
from typer.testing import CliRunner

from attnlab.cli import app
from attnlab.studies import decode


def test_speed_measures_every_implementation_and_the_cache_changes_no_token():
    recs = decode.speed((16, 40), new_tokens=4, embed_dim=32, num_layers=1, num_heads=2, min_repeats=1)
    impls = {(r.context, r.implementation) for r in recs}
    assert impls == {(c, i) for c in (16, 40) for i in decode.IMPLEMENTATIONS}
    for r in recs:
        assert r.seconds > 0 and r.prefill_seconds > 0 and r.tokens_per_second == pytest.approx(4 / r.seconds)
        assert r.same_tokens is (True if r.implementation == "attnlab cached" else None)
    recs = decode.speed((16, 40), new_tokens=3, embed_dim=32, num_layers=1, num_heads=2, min_repeats=1, uncached_up_to=16)
    assert not any(r.implementation == "attnlab uncached" and r.context == 40 for r in recs)
    with pytest.raises(ValueError, match="new_tokens"):
        decode.speed((16,), new_tokens=1)


def test_gpt2_pair_has_one_shape():
    ours, hf = decode.gpt2_pair(32, 2, 4, 50, 64)
    assert hf.config.n_embd == 32 and hf.config.n_layer == 2 and hf.config.vocab_size == 50
    assert ours.vocab_size == 50 and len(ours.backbone.encoder.layers) == 2


def test_streaming_memory_is_constant_for_the_bounded_cache():
    recs = decode.streaming_memory((100, 300, 600), sinks=2, window=30, full_up_to=300, embed_dim=16, num_layers=1, num_heads=2)
    bounded = [r.cache_bytes for r in recs if r.cache == "sinks+window"]
    full = [r.cache_bytes for r in recs if r.cache == "full"]
    assert len(bounded) == 3 and len(set(bounded)) == 1
    assert len(full) == 2 and full[1] > full[0]


def test_streaming_perplexity_methods_agree_within_the_context():
    """A stream no longer than the context: every cache holds it all, so the four methods give
    one perplexity (the recomputed window too)."""
    from attnlab.models import ModelConfig, build_model
    from attnlab.models.config import AttentionSpec, PositionalSpec

    torch.manual_seed(0)
    m = build_model(ModelConfig(kind="lm", model="lm", num_labels=30, embed_dim=16, vocab_size=30, num_layers=1, num_heads=2,
                                attention=AttentionSpec("dense", {}), positional=PositionalSpec("rope"))).double()
    text = torch.randint(2, 30, (200,))
    recs = decode.streaming_perplexity(m, text, context=20, factor=1, sinks=2, streams=2)
    ppl = [r.perplexity for r in recs]
    assert max(ppl) - min(ppl) < 1e-9 and len(recs) == 4
    longer = decode.streaming_perplexity(m, text, context=10, factor=4, sinks=2, streams=1)
    assert len({round(r.perplexity, 9) for r in longer}) > 1  # beyond the context the methods differ
    with pytest.raises(ValueError, match="need more"):
        decode.streaming_perplexity(m, text, context=100, factor=8)


def test_cli_bench_decode_writes_and_reads_back(tmp_path):
    out = tmp_path / "d.json"
    args = ["bench", "decode", "--contexts", "16", "--new-tokens", "3", "--embed-dim", "16", "--num-layers", "1", "--num-heads", "2",
            "--stream-lengths", "50,100", "-o", str(out)]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    data = json.loads(out.read_text())
    assert len(data["speed"]) == 3 and len(data["memory"]) == 4 and data["perplexity"] == []
    again = CliRunner().invoke(app, ["bench", "decode", "--from", str(out), "--plot", str(tmp_path / "d.png")])
    assert again.exit_code == 0 and "vs uncached" in again.output and (tmp_path / "d.png").stat().st_size > 5000
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    r = CliRunner().invoke(app, ["bench", "decode", "--from", str(bad)])
    assert r.exit_code == 1 and "bench decode -o" in r.output  # files: run time
    r = CliRunner().invoke(app, ["bench", "decode", "--checkpoint", str(tmp_path / "none")])
    assert r.exit_code == 1


def test_plot_decode_refuses_nothing(tmp_path):
    from attnlab.viz.decode import plot_decode

    with pytest.raises(ValueError, match="nothing to plot"):
        plot_decode({"speed": [], "memory": []}, tmp_path / "x.png")
