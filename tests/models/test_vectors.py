"""Images as vector sets: patches, ViT, pixel attention, the CNN baseline."""

import pytest
import torch

from attnlab.models.vectors import CNNBackbone, PixelAttentionBackbone, VectorClassifier, ViTBackbone, patchify


def test_patchify_is_the_conv2d_patch_order():
    x = torch.randn(2, 3, 8, 12, dtype=torch.float64)
    p = patchify(x, 4)
    want = torch.nn.functional.unfold(x, kernel_size=4, stride=4).transpose(1, 2)  # (B, L, C*4*4)
    torch.testing.assert_close(p, want)
    with pytest.raises(ValueError, match="not divisible"):
        patchify(x, 5)


def test_vit_patch_embedding_equals_a_strided_convolution():
    vit = ViTBackbone(3, 16, (8, 8), patch_size=4, num_heads=2, num_layers=1).double()
    conv = torch.nn.Conv2d(3, 16, 4, stride=4).double()
    with torch.no_grad():
        conv.weight.copy_(vit.embed.weight.view(16, 3, 4, 4))
        conv.bias.copy_(vit.embed.bias)
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    toks = vit.tokens(x)
    assert toks.shape == (2, 1 + 4, 16)
    torch.testing.assert_close(toks[:, 1:], conv(x).flatten(2).transpose(1, 2))
    torch.testing.assert_close(toks[:, 0], vit.cls[0].expand(2, 16))


def test_pixels_attend_over_every_pixel_and_weights_are_returned():
    model = VectorClassifier(PixelAttentionBackbone(1, 16, (4, 4), num_heads=2, num_layers=2), 10)
    res = model(torch.randn(3, 1, 4, 4), return_weights=True)
    logits, weights = res.output, res.weights
    assert logits.shape == (3, 10)
    assert len(weights) == 2 and weights[0].shape == (3, 2, 17, 17)
    torch.testing.assert_close(weights[0].sum(-1), torch.ones(3, 2, 17))
    with pytest.raises(ValueError, match="patch_size is 1"):
        PixelAttentionBackbone(1, 16, (4, 4), patch_size=2)


def test_cnn_receptive_field_is_local_and_attention_is_global():
    """One block of each: a 3x3 convolution sees +-1 pixel; one attention layer sees all."""
    x = torch.randn(1, 1, 8, 8, requires_grad=True)
    conv = CNNBackbone(1, 8, (8, 8), num_layers=1).net[0]
    (g,) = torch.autograd.grad(conv(x)[0, :, 4, 4].sum(), x)
    assert set(map(tuple, g[0, 0].nonzero().tolist())) == {(i, j) for i in (3, 4, 5) for j in (3, 4, 5)}
    vit = PixelAttentionBackbone(1, 8, (8, 8), num_heads=2, num_layers=1, positional="none")
    probe = torch.randn(8, generator=torch.Generator().manual_seed(0))  # not .sum(): a LayerNorm output sums to 0
    (g,) = torch.autograd.grad(vit.encoder(vit.tokens(x)).output[0, 1 + 4 * 8 + 4] @ probe, x)
    assert int((g != 0).sum()) == 64


def test_bad_images_raise():
    vit = ViTBackbone(1, 16, (8, 8), patch_size=2)
    with pytest.raises(ValueError, match=r"expected images \(B, 1, 8, 8\)"):
        vit(torch.randn(2, 8, 8))
    with pytest.raises(ValueError, match="not divisible by patch_size 3"):
        ViTBackbone(1, 16, (8, 8), patch_size=3)
    with pytest.raises(ValueError, match="image_size"):
        CNNBackbone(1, 16, 8)
