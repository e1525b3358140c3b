"""The encoder-decoder: causal decoder, padding-blind encoder, greedy = beam of one."""

import pytest
import torch

from attnlab.models.base import BACKBONES
from attnlab.models.seq2seq import BOS, EOS, Seq2Seq
from attnlab.tasks.translate import LEXICON, translate_sentence


def model(seed=0):
    torch.manual_seed(seed)
    enc = BACKBONES.get("transformer")(20, 16, num_heads=2, num_layers=1, positional="sinusoidal", max_len=32)
    return Seq2Seq(enc, 12, num_heads=2, num_layers=2, max_len=12).double().eval()


def test_decoder_is_causal_and_ignores_source_padding():
    m = model()
    src = torch.randint(2, 20, (1, 6))
    tgt = torch.randint(3, 12, (1, 7))
    tgt[0, 0] = BOS
    a = m(src, tgt).output
    b_tgt = tgt.clone()
    b_tgt[0, 4:] = torch.randint(3, 12, (3,))
    b = m(src, b_tgt).output
    torch.testing.assert_close(a[:, :4], b[:, :4], rtol=0, atol=0)  # later target tokens change nothing before them
    padded = torch.cat([src, torch.zeros(1, 3, dtype=torch.long)], 1)
    torch.testing.assert_close(m(padded, tgt).output, a, rtol=0, atol=1e-12)


def test_greedy_is_the_stepwise_argmax_and_equals_a_beam_of_one():
    m = model(1)
    src = torch.randint(2, 20, (3, 5))
    greedy = m.greedy(src)
    for b in range(3):
        seq = [BOS]
        for _ in range(m.max_len):
            nxt = int(m(src[b : b + 1], torch.tensor([seq])).output[0, -1].argmax())
            if nxt == EOS:
                break
            seq.append(nxt)
        assert greedy[b] == [t for t in seq[1:] if t != 0][: len(greedy[b])]
        assert greedy[b] == seq[1 : 1 + len(greedy[b])]
    assert m.beam(src, beam_size=1) == greedy
    wide = m.beam(src, beam_size=4)
    assert len(wide) == 3 and all(EOS not in row for row in wide)
    with pytest.raises(ValueError, match="beam_size"):
        m.beam(src, beam_size=0)


def test_translation_rules():
    t = LEXICON
    src = "the big old dog sees a cat near every tree".split()
    assert translate_sentence(src) == [t["dog"], t["old"], t["big"], t["the"], t["tree"], t["every"], t["near"], t["cat"], t["a"],
                                       t["sees"]]


def test_a_target_longer_than_max_len_is_refused():
    m = model()
    with pytest.raises(ValueError, match="exceeds the decoder's max_len 12"):
        m(torch.randint(2, 20, (1, 4)), torch.ones(1, 14, dtype=torch.long))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cached_decoding_gives_the_same_greedy_and_beams(seed):
    """The decoder's KV cache (and the source keys computed once) changes no decision: greedy
    and beam search find the same sequences as rerunning every prefix."""
    m = model(seed)
    with torch.no_grad():  # never-ending targets: no EOS (nor padding), so all 12 steps run
        m.out.bias[EOS] = m.out.bias[0] = -1e9
    src = torch.randint(2, 20, (4, 7), generator=torch.Generator().manual_seed(seed))
    src[1, 5:] = 0  # a padded source
    assert m.greedy(src) == m.greedy(src, cache=False)
    assert all(len(s) == 12 for s in m.greedy(src))
    assert m.beam(src, beam_size=3) == m.beam(src, beam_size=3, cache=False)


def test_cached_decode_logits_equal_the_full_target():
    m = model(3)
    src = torch.randint(2, 20, (2, 6))
    tgt = torch.randint(3, 12, (2, 9))
    tgt[:, 0] = BOS
    tgt[1, 6:] = 0  # a finished row: padding
    memory, mmask = m.encode(src)
    with torch.no_grad():
        full = m.decode(tgt, memory, mmask).output
        cache = m.new_cache()
        steps = torch.cat([m.decode(tgt[:, i : i + 1], memory, mmask, cache=cache).output for i in range(9)], 1)
    real = tgt != 0
    assert (steps - full)[real].abs().max() < 1e-12
