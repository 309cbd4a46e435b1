"""Compression functions and auxiliary losses of the Compressive Transformer: hand-computed cases, slow twins."""

import pytest
import torch

from tf_family.memory import (
    attention_reconstruction_loss,
    autoencoding_loss,
    compress_memory,
    content_attention,
    conv_compress,
    conv_transpose_decompress,
    dilated_conv_compress,
    dilated_conv_layers,
    max_pool_compress,
    mean_pool_compress,
    most_used_compress,
)
from tf_family.memory import compression as C

ALL = torch.ones(1, 4, dtype=torch.bool)
STATES = torch.tensor([[[1.0, 5.0], [3.0, 2.0], [-1.0, -4.0], [0.0, -6.0]]])  # (1, 4, 2)


def column(*values):
    return torch.tensor(values, dtype=torch.float32).view(1, -1, 1)  # (1, N, 1)


def test_max_pool_hand_computed():
    out, mask = max_pool_compress(STATES, ALL, 2)
    assert out.tolist() == [[[3.0, 5.0], [0.0, -4.0]]] and mask.tolist() == [[True, True]]
    out, mask = max_pool_compress(STATES, torch.tensor([[True, False, False, False]]), 2)
    assert out.tolist() == [[[1.0, 5.0], [0.0, 0.0]]] and mask.tolist() == [[True, False]]


def test_mean_pool_hand_computed():
    out, mask = mean_pool_compress(STATES, ALL, 2)
    assert out.tolist() == [[[2.0, 3.5], [-0.5, -5.0]]]
    out, mask = mean_pool_compress(STATES, torch.tensor([[False, True, False, False]]), 2)
    assert out.tolist() == [[[3.0, 2.0], [0.0, 0.0]]] and mask.tolist() == [[True, False]]
    out, _ = mean_pool_compress(STATES, ALL, 4)
    assert out.tolist() == [[[0.75, -0.75]]]


def test_conv_hand_computed():
    weight = torch.tensor([[[2.0, 3.0]]])  # (D_out=1, D=1, c=2): 2 * first + 3 * second
    out, mask = conv_compress(column(1, 2, 3, 4), torch.ones(1, 4, dtype=torch.bool), 2, weight, torch.tensor([1.0]))
    assert out.flatten().tolist() == [2 * 1 + 3 * 2 + 1, 2 * 3 + 3 * 4 + 1]
    out, _ = conv_compress(column(1, 2, 3, 4), torch.tensor([[True, False, True, True]]), 2, weight, None)
    assert out.flatten().tolist() == [2.0, 18.0]  # the masked state enters as zero


def test_dilated_conv_hand_computed():
    ones = [torch.tensor([[[1.0, 1.0]]])] * 2  # each layer: x[t - dilation] + x[t]
    assert [dilated_conv_layers(c) for c in (1, 2, 3, 4, 5, 8)] == [0, 1, 2, 2, 3, 3]
    # rate 4: layer 1 gives [1, 3, 5, 7]; layer 2 at the last state: 7 + 3 = 10 (the sum of the group)
    out, _ = dilated_conv_compress(column(1, 2, 3, 4), torch.ones(1, 4, dtype=torch.bool), 4, ones, [None, None])
    assert out.flatten().tolist() == [10.0]
    # the ReLU between layers: layer 1 gives [1, -4, -3, 3] -> [1, 0, 0, 3]; layer 2: 3 + 0
    out, _ = dilated_conv_compress(column(1, -5, 2, 1), torch.ones(1, 4, dtype=torch.bool), 4, ones, [None, None])
    assert out.flatten().tolist() == [3.0]
    # rate 3, zero padding inside each group: layer 1 [1, 3, 5], layer 2: 5 + 1; second group [4, 9, 11] -> 11 + 4
    out, _ = dilated_conv_compress(
        column(1, 2, 3, 4, 5, 6), torch.ones(1, 6, dtype=torch.bool), 3, ones, [torch.zeros(1)] * 2
    )
    assert out.flatten().tolist() == [6.0, 15.0]
    # rate 2: one layer, biases count: 2*x0 + x1 + 0.5
    out, _ = dilated_conv_compress(
        column(1, 2), torch.ones(1, 2, dtype=torch.bool), 2, [torch.tensor([[[2.0, 1.0]]])], [torch.tensor([0.5])]
    )
    assert out.flatten().tolist() == [4.5]


def test_most_used_hand_computed():
    states = column(10, 20, 30, 40, 50, 60)
    usage = torch.tensor([[0.1, 0.5, 0.2, 0.5, 0.9, 0.0]])
    out, mask = most_used_compress(states, torch.ones(1, 6, dtype=torch.bool), 2, usage)
    assert out.flatten().tolist() == [20.0, 40.0, 50.0] and mask.all()  # usage 0.9, 0.5, 0.5, in memory order
    masked = torch.tensor([[True, True, True, True, False, True]])
    out, mask = most_used_compress(states, masked, 2, usage)
    assert out.flatten().tolist() == [20.0, 30.0, 40.0]  # the masked state is never chosen over a real one
    out, mask = most_used_compress(states, torch.tensor([[False, False, True, False, False, False]]), 3, usage)
    assert out.flatten().tolist() == [10.0, 30.0] and mask.tolist() == [[False, True]]


def test_decompress_hand_computed():
    weight = torch.tensor([[[2.0, 3.0]]])  # (D=1, D_out=1, c=2)
    out = conv_transpose_decompress(column(5, 1), 2, weight, torch.tensor([1.0]))
    assert out.flatten().tolist() == [11.0, 16.0, 3.0, 4.0]


def _random(batch=3, groups=3, rate=3, width=4, seed=0):
    generator = torch.Generator().manual_seed(seed)
    states = torch.randn(batch, groups * rate, width, generator=generator, dtype=torch.float64)
    mask = torch.rand(batch, groups * rate, generator=generator) > 0.3
    mask[0, :rate] = False  # a group with no real state
    return states.requires_grad_(), mask, generator


@pytest.mark.parametrize("rate", [1, 2, 3, 4])
def test_efficient_functions_equal_their_slow_twins_values_and_gradients(rate):
    states, mask, generator = _random(rate=rate)
    width = states.shape[-1]
    weight = torch.randn(width, width, rate, generator=generator, dtype=torch.float64, requires_grad=True)
    dilated = [
        torch.randn(width, width, 2, generator=generator, dtype=torch.float64, requires_grad=True)
        for _ in range(dilated_conv_layers(rate))
    ]
    biases = [torch.randn(width, generator=generator, dtype=torch.float64) for _ in dilated]
    usage = torch.rand(mask.shape, generator=generator, dtype=torch.float64)
    pairs = [
        (lambda: max_pool_compress(states, mask, rate), lambda: C.max_pool_compress_reference(states, mask, rate)),
        (lambda: mean_pool_compress(states, mask, rate), lambda: C.mean_pool_compress_reference(states, mask, rate)),
        (
            lambda: conv_compress(states, mask, rate, weight, biases[0] if biases else None),
            lambda: C.conv_compress_reference(states, mask, rate, weight, biases[0] if biases else None),
        ),
        (
            lambda: dilated_conv_compress(states, mask, rate, dilated, biases),
            lambda: C.dilated_conv_compress_reference(states, mask, rate, dilated, biases),
        ),
        (
            lambda: most_used_compress(states, mask, rate, usage),
            lambda: C.most_used_compress_reference(states, mask, rate, usage),
        ),
    ]
    for fast, slow in pairs:
        grads = []
        for function in (fast, slow):
            out, out_mask = function()
            leaves = [states, weight, *dilated]
            grads.append(torch.autograd.grad(out.pow(2).sum(), leaves, allow_unused=True))
            if function is fast:
                expected = (out, out_mask)
            else:
                torch.testing.assert_close(expected[0], out)
                assert torch.equal(expected[1], out_mask)
        for fast_grad, slow_grad in zip(*grads, strict=True):
            if slow_grad is None:
                assert fast_grad is None or not fast_grad.any()
            else:
                torch.testing.assert_close(fast_grad, slow_grad)
    compressed = torch.randn(2, 3, width, generator=generator, dtype=torch.float64)
    decoder = torch.randn(width, width, rate, generator=generator, dtype=torch.float64)
    torch.testing.assert_close(
        conv_transpose_decompress(compressed, rate, decoder, biases[0] if biases else None),
        C.conv_transpose_decompress_reference(compressed, rate, decoder, biases[0] if biases else None),
    )


def test_rate_one_pooling_is_the_identity_and_dispatch():
    states, mask, _ = _random(rate=1)
    for kind in ("max_pool", "mean_pool"):
        out, out_mask = compress_memory(kind, states, mask, 1)
        torch.testing.assert_close(out, states.masked_fill(~mask[..., None], 0.0))
        assert torch.equal(out_mask, mask)
    out, _ = compress_memory("most_used", states, mask, 1, usage=torch.rand(mask.shape))
    torch.testing.assert_close(out[mask], states[mask])


def test_bad_arguments_name_the_problem():
    states = torch.randn(1, 5, 2)
    mask = torch.ones(1, 5, dtype=torch.bool)
    with pytest.raises(ValueError, match="not a multiple of rate=2"):
        mean_pool_compress(states, mask, 2)
    with pytest.raises(ValueError, match="rate must be an int >= 1"):
        max_pool_compress(states, mask, 0)
    with pytest.raises(ValueError, match="mask must have shape"):
        max_pool_compress(states, mask[:, :4], 5)
    with pytest.raises(ValueError, match="needs usage"):
        compress_memory("most_used", states, mask, 5)
    with pytest.raises(ValueError, match="Unknown compression 'zip'"):
        compress_memory("zip", states, mask, 5)
    with pytest.raises(ValueError, match="needs 2 dilated layers"):
        dilated_conv_compress(states[:, :4], mask[:, :4], 4, [torch.randn(2, 2, 2)], [None])
    with pytest.raises(ValueError, match="weight must have shape"):
        conv_compress(states, mask, 5, torch.randn(2, 2, 3), None)


def test_content_attention_and_reconstruction_loss_hand_computed():
    query = torch.ones(1, 1, 1, 1)  # (B, H, T, Dh)
    zeros = torch.zeros(1, 1, 2, 1)
    values = torch.tensor([2.0, 4.0]).view(1, 1, 2, 1)
    both = torch.ones(1, 2, dtype=torch.bool)
    # equal keys: uniform attention, the mean of the values
    assert content_attention(query, zeros, values, both).item() == 3.0
    assert content_attention(query, zeros, values, torch.tensor([[False, True]])).item() == 4.0
    assert content_attention(query, zeros, values, torch.tensor([[False, False]])).item() == 0.0
    old = (zeros, values, both)
    compressed = (torch.zeros(1, 1, 1, 1), torch.ones(1, 1, 1, 1), torch.ones(1, 1, dtype=torch.bool))
    assert attention_reconstruction_loss(query, old, compressed).item() == pytest.approx((3.0 - 1.0) ** 2)
    assert attention_reconstruction_loss(query, old, old).item() == 0.0
    # a row without any real old state does not count
    nothing = (zeros, values, torch.zeros(1, 2, dtype=torch.bool))
    assert attention_reconstruction_loss(query, nothing, compressed).item() == 0.0


def test_reconstruction_loss_zero_for_identity_compression_positive_otherwise():
    generator = torch.Generator().manual_seed(0)
    query, keys, values = (torch.randn(2, 2, 3, 4, generator=generator) for _ in range(3))
    mask = torch.ones(2, 3, dtype=torch.bool)
    old = (keys, values, mask)
    # rate 1: pooling is the identity, so the compressed memory attends exactly like the old one
    pooled = mean_pool_compress(keys.transpose(1, 2).reshape(2, 3, 8), mask, 1)[0].view(2, 3, 2, 4).transpose(1, 2)
    assert attention_reconstruction_loss(query, old, (pooled, values, mask)).item() == 0.0
    keys4, values4 = torch.randn(2, 2, 4, 4, generator=generator), torch.randn(2, 2, 4, 4, generator=generator)
    mask4 = torch.ones(2, 4, dtype=torch.bool)
    pooled_k = mean_pool_compress(keys4.transpose(1, 2).reshape(2, 4, 8), mask4, 2)[0].view(2, 2, 2, 4)
    pooled_v = mean_pool_compress(values4.transpose(1, 2).reshape(2, 4, 8), mask4, 2)[0].view(2, 2, 2, 4)
    loss = attention_reconstruction_loss(
        query, (keys4, values4, mask4), (pooled_k.transpose(1, 2), pooled_v.transpose(1, 2), mask4[:, :2])
    )
    assert loss.item() > 1e-3


def test_autoencoding_loss_hand_computed():
    original = column(1, 2, 7)
    reconstructed = column(2, 2, 0)
    assert autoencoding_loss(original, reconstructed, torch.tensor([[True, True, False]])).item() == 0.5
    assert autoencoding_loss(original, reconstructed, torch.zeros(1, 3, dtype=torch.bool)).item() == 0.0
