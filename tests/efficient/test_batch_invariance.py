"""A sequence's outputs and input gradients do not depend on its batch: on how far it is padded
or what the other rows hold. Iterates the registry, so a new variant is checked the day it is
registered."""

import pytest
import torch

from attnlab import efficient

E, H = 32, 4

NOT_BATCH_INVARIANT = {
    "reformer": "LSH attention sorts the padded sequence by bucket and cuts it in chunks of fixed size: padding moves the chunk "
                "boundaries, so which keys a query meets depends on the padded length (Kitaev et al. 2020)",
}
"""Variants that cannot be batch-invariant, and why (their difference is measured, not bounded)."""


def _alone_and_batched(layer, length, pad_to, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, length, E, dtype=torch.float64, generator=g)
    other = torch.randn(1, pad_to, E, dtype=torch.float64, generator=g)
    fill = torch.randn(1, pad_to - length, E, dtype=torch.float64, generator=g)
    xa = x.clone().requires_grad_(True)
    torch.manual_seed(1)  # variants that draw (performer's features) draw the same
    alone = layer(xa).output
    alone.square().sum().backward()
    xb = torch.cat([x, fill], 1).clone().requires_grad_(True)
    mask = torch.ones(2, 1, 1, pad_to, dtype=torch.bool)
    mask[0, ..., length:] = False
    torch.manual_seed(1)
    batched = layer(torch.cat([xb, other]), mask=mask).output[0, :length]
    batched.square().sum().backward()
    return (float((batched - alone[0]).detach().abs().max()), float((xb.grad[0, :length] - xa.grad[0]).abs().max()))


@pytest.mark.parametrize("name", efficient.names())
def test_a_sequence_gives_the_same_outputs_and_gradients_in_any_padded_batch(name):
    torch.manual_seed(0)
    layer = efficient.create(name, embed_dim=E, num_heads=H, max_len=128).double().eval()
    worst = max(max(_alone_and_batched(layer, n, pad_to, seed)) for seed, (n, pad_to) in enumerate([(5, 6), (16, 23), (23, 96), (40, 47)]))
    if name in NOT_BATCH_INVARIANT:
        assert worst > 1e-3, f"{name} became batch-invariant: take it off NOT_BATCH_INVARIANT"
    else:
        assert worst < 1e-10, (name, worst)


def test_nystrom_landmarks_are_cut_over_each_sequence_s_own_length():
    from attnlab.efficient.nystrom import segment_means

    x = torch.arange(10.0).view(1, 1, 10, 1).expand(2, 1, 10, 1)
    valid = torch.tensor([[True] * 6 + [False] * 4, [True] * 10])
    means, ok = segment_means(x, 4, valid, slots=torch.tensor([4, 4]))
    assert means[0, 0, :, 0].tolist() == [0.5, 2.0, 3.5, 5.0]  # 6 real positions in 4 segments: 2, 1, 2, 1
    assert means[1, 0, :, 0].tolist() == [1.0, 3.5, 6.0, 8.5]
    assert ok.all()
    means, ok = segment_means(x, 4, torch.tensor([[True] * 3 + [False] * 7, [True] * 10]), slots=torch.tensor([3, 4]))
    assert ok[0].tolist() == [True, True, True, False] and means[0, 0, :3, 0].tolist() == [0.0, 1.0, 2.0]
