"""One mask convention for every variant (the user-data issue's finding 4): a bare 2-D bool tensor
is an (N, M) mask of (query, key) pairs for every attention, never key padding by another name."""

import pytest
import torch

from attnlab import efficient, masks

E, H = 16, 2


def layer(name):
    torch.manual_seed(0)
    opts = {"max_len": 4} if efficient.budget(name).max_len else {}
    m = efficient.create(name, embed_dim=E, num_heads=H, **opts).double().eval()
    step = getattr(m, "step", m)  # the step a MultiHeadAttention holds (a mixer has none)
    if hasattr(step, "seed"):  # the random features and hashes drawn the same at every call
        step.seed = 0
    return m


@pytest.mark.parametrize("name", efficient.names())
def test_a_bare_2d_tensor_is_an_n_by_m_mask_for_every_variant_or_refused_with_the_same_hint(name):
    m = layer(name)
    torch.manual_seed(1)
    real = torch.tensor([[True, True, True, False]] * 2 + [[True, True, False, False]] * 2)  # (4, 4): B = N = M
    x = torch.randn(4, 4, E, dtype=torch.float64)
    hint = r"a \(B, M\) = \(\d, 4\) key-padding tensor goes through attnlab\.masks\.valid_keys\(flags\)"
    if efficient.capabilities(name).masks == "any":  # read as (N, M): query i may see the keys of row i
        assert torch.equal(m(x, mask=real).output, m(x, mask=real[None, None]).output)
        assert not torch.equal(m(x, mask=real).output, m(x, mask=masks.valid_keys(real)).output)
    else:  # a key-padding step cannot apply an (N, M) mask, and never reads it as padding
        with pytest.raises(ValueError, match=hint):
            m(x, mask=real)
    with pytest.raises(ValueError, match=hint):  # B = 2 != N = 4: no (B, H, N, M) broadcast, for every variant alike
        m(x[:2], mask=real[:2])
    flags = real[:2]
    ok = m(x[:2], mask=masks.valid_keys(flags)).output  # key padding, said so: taken by every variant
    assert torch.equal(ok, m(x[:2], mask=flags[:, None, None, :]).output)
