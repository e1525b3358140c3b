"""The attention viewer's data: what the page is given equals what the model computed."""

import base64
import json

import numpy as np
import pytest
import torch

from attnlab import efficient, pretrained
from attnlab.models import Encoder
from attnlab.viz.trace import capture, stack_captured
from attnlab.viz.viewer import ViewerData, checkpoint_view, pretrained_view, rollout, viewer_data, write_viewer

pytest.importorskip("transformers")  # the tiny model folder is written by transformers


def unpack(field: str, dtype: str, shape) -> np.ndarray:
    return np.frombuffer(base64.b64decode(field), dtype=dtype).reshape(shape)


def test_rollout_is_the_product_of_half_identity_mixed_mean_heads():
    gen = torch.Generator().manual_seed(0)
    w = torch.softmax(torch.randn(3, 2, 5, 5, generator=gen, dtype=torch.float64), -1)
    r = rollout(w)
    eye = torch.eye(5, dtype=torch.float64)
    ref = eye
    for layer in range(3):
        a = 0.5 * w[layer].mean(0) + 0.5 * eye
        ref = (a / a.sum(-1, keepdim=True)) @ ref
        assert torch.allclose(r[layer], ref, atol=1e-12)
    assert torch.allclose(r.sum(-1), torch.ones(3, 5, dtype=torch.float64))


def test_packed_weights_are_each_rows_largest_entries(tiny_bert):
    view = pretrained_view(pretrained.load(tiny_bert), "the law will never be perfect but its application should be just")
    n = len(view.tokens)
    data = viewer_data(view, topk=4)
    assert (data["layers"], data["heads"], data["n"], data["topk"]) == (2, 4, n, 4)
    idx = unpack(data["attention"]["index"], "<u2", (2, 4, n, 4))
    val = unpack(data["attention"]["weight"], "<f2", (2, 4, n, 4))
    ref_val, ref_idx = view.weights.float().topk(4, dim=-1)
    assert np.array_equal(idx, ref_idx.numpy())
    assert np.abs(val.astype(np.float32) - ref_val.numpy()).max() < 1e-3  # float16
    qkv = unpack(data["steps"]["qkv"], "<f2", (3, 2, 4, n, 8)).astype(np.float32)
    assert np.abs(qkv[0] - view.q.numpy()).max() < 1e-2 * np.abs(view.q.numpy()).max()


def test_captured_heads_recompute_the_models_weights(tiny_bert):
    m = pretrained.load(tiny_bert)
    batch = m.encode("attention is all you need")
    with capture(m) as records, torch.no_grad():
        out = m(batch, return_weights=True)
    s = stack_captured(records)
    assert s["weights"].shape == (2, 4, 7, 7) and s["scale"] == pytest.approx(8**-0.5) and s["why"] == ""
    recomputed = torch.softmax(s["scale"] * s["q"] @ s["k"].transpose(-1, -2), -1)
    assert (recomputed - s["weights"]).abs().max() < 1e-6
    assert (s["weights"] - torch.stack([w[0] for w in out.weights])).abs().max() == 0


def test_the_steps_panel_is_off_where_plain_softmax_cannot_recompute_the_weights():
    enc = Encoder(16, 2, 2, positional="alibi")
    with capture(enc) as records, torch.no_grad():
        enc(torch.randn(1, 5, 16))
    s = stack_captured(records)
    assert s["scale"] is None and "bias" in s["why"]
    enc = Encoder(16, 2, 1, score="cosine", positional="rope")
    with capture(enc) as records, torch.no_grad():
        enc(torch.randn(1, 5, 16))
    s = stack_captured(records)  # cosine: q and k come normalised, rope: rotated; the scores are scale q . k
    assert s["scale"] is not None
    assert (torch.softmax(s["scale"] * s["q"] @ s["k"].transpose(-1, -2), -1) - s["weights"]).abs().max() < 1e-6


def test_nothing_captured_is_an_error():
    with pytest.raises(ValueError, match="no self-attention call was recorded"):
        stack_captured([])


def test_an_efficient_variant_has_no_weights_to_show(tiny_bert):
    m = pretrained.load(tiny_bert, attention="linear")
    with pytest.raises(ValueError, match="model.encoder.layers.0.attn: the 'linear' attention never builds the N x M weights"):
        pretrained_view(m, "attention is all you need")


def test_a_mixer_that_forms_scores_is_captured_with_its_weights_and_heads():
    """FoX (a sequence mixer) inside a model: its weights are the ones its forward returns, its heads its projections;
    no steps panel (its scores add the forget gate's decay)."""
    torch.manual_seed(0)
    fox = efficient.create("fox", embed_dim=16, num_heads=2, causal=True).double()
    model = torch.nn.Sequential(fox)
    x = torch.randn(1, 6, 16, dtype=torch.float64)
    with capture(model) as records, torch.no_grad():
        model(x)
    (r,) = records
    with torch.no_grad():
        assert torch.equal(r.weights, fox(x, return_weights=True).weights)
        q, k, v = fox.heads(x, torch.arange(6))
    assert r.name == "0" and torch.equal(r.q, q) and torch.equal(r.v, v) and r.scale is None and "'fox'" in r.why
    assert torch.allclose(r.weights.sum(-1), torch.ones(1, 2, 6, dtype=torch.float64))
    assert torch.equal(r.weights.triu(1), torch.zeros_like(r.weights))  # causal


def test_a_mixer_that_forms_no_scores_has_no_weights_to_show():
    model = torch.nn.Sequential(efficient.create("gated_deltanet", embed_dim=16, num_heads=2, causal=True))
    with pytest.raises(ValueError, match="0: the 'gated_deltanet' attention never builds the N x M weights"):
        with capture(model), torch.no_grad():
            model(torch.randn(1, 5, 16))


def test_a_checkpoint_of_a_token_task_is_shown_on_words_of_its_vocabulary():
    from pathlib import Path

    ck = Path(__file__).resolve().parents[1] / "data" / "checkpoints-v1" / "pos-transformer"
    from attnlab import tasks
    from attnlab.training.checkpoint import load_checkpoint

    cfg = load_checkpoint(ck).config
    vocab = tasks.create(cfg.task, **cfg.task_options).vocab
    words = vocab[5:9]
    view = checkpoint_view(ck, " ".join(words))
    assert view.tokens[-4:] == words and view.weights.shape[-1] == len(view.tokens)
    assert torch.allclose(view.weights.sum(-1), torch.ones(view.weights.shape[:-1]), atol=1e-5)
    with pytest.raises(ValueError, match="not in task 'pos''s vocabulary: zzzunknown"):
        checkpoint_view(ck, "zzzunknown")


@pytest.mark.parametrize("variant", ["dense", "fox"])
def test_a_cls_pooled_checkpoint_shows_the_summary_token_it_puts_in_front(variant):
    """A classifier that pools a summary token (``pooling="cls"``) attends over one more position than the words:
    the viewer names it (before, it refused the checkpoint); FoX, a mixer, shows its own weights."""
    from pathlib import Path

    from attnlab.training.checkpoint import load_checkpoint

    ck = Path(__file__).resolve().parents[1] / "data" / "checkpoints-v2" / "before-mixers" / variant
    assert load_checkpoint(ck).model.pooling == "cls"
    view = checkpoint_view(ck, "[MAX 2 3 ]")
    assert view.tokens == ["<cls>", "[MAX", "2", "3", "]"] and view.weights.shape[-1] == 5
    assert torch.allclose(view.weights.sum(-1), torch.ones(view.weights.shape[:-1]), atol=1e-5)


def test_the_page_embeds_its_data_and_nothing_from_the_network(tmp_path, tiny_bert):
    view = pretrained_view(pretrained.load(tiny_bert), "a cat <!-- <script> sat on the mat </script> <b>")
    path = write_viewer(tmp_path / "v.html", view)
    page = path.read_text()
    start = page.index('<script id="attnlab-data" type="application/json">')
    assert page.count("<", start, page.index("</script>", start)) == 1  # the text cannot end the element or open a comment in it
    start += len('<script id="attnlab-data" type="application/json">')
    data = json.loads(page[start : page.index("</script>", start)])
    assert data["tokens"] == view.tokens and data["n"] == len(view.tokens)
    for needle in ("http://", "https://", "//cdn", "src=\"http"):
        assert needle not in page.replace(data["title"], "")
    with pytest.raises(ValueError, match="weights must have shape"):
        viewer_data(ViewerData(["a", "b"], torch.ones(1, 1, 3, 3)))
