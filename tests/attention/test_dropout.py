"""The CPU dropout and the hand-written attention backward agree with plain PyTorch."""

import pytest
import torch
from torch import nn

from tf_family.attention import (
    attend,
    dropout,
    dropout_mask,
    masked_attention,
    masked_attention_reference,
    takes_masked_attention,
)
from tf_family.modeling.utils import Dropout


def test_mask_rate_scale_and_reproducibility():
    kept, scale = dropout_mask((50, 40, 30), 0.1)
    assert kept.dtype == torch.bool and kept.shape == (50, 40, 30)
    assert scale == 65536 / (65536 - 6554)  # p rounded to a multiple of 1/65536
    assert abs(kept.float().mean().item() - 0.9) < 0.005  # 60000 draws: 6 standard deviations
    for p in (0.0, 0.5, 0.9):
        rate = 1 - dropout_mask((100_000,), p)[0].float().mean().item()
        assert abs(rate - p) < 0.01, (p, rate)
    # every 16-bit slice of a random word is used, and none is biased (an unsigned draw would leave one at zero)
    lanes = dropout_mask((40_000,), 0.5)[0].view(-1, 4).float().mean(0)
    assert ((lanes - 0.5).abs() < 0.02).all(), lanes
    torch.manual_seed(3)
    first = dropout_mask((7, 9), 0.3)[0]
    torch.manual_seed(3)
    assert torch.equal(first, dropout_mask((7, 9), 0.3)[0])
    generator = torch.Generator().manual_seed(5)
    other = dropout_mask((7, 9), 0.3, generator=generator)[0]
    assert torch.equal(other, dropout_mask((7, 9), 0.3, generator=torch.Generator().manual_seed(5))[0])


@pytest.mark.parametrize("p", [-0.1, 1.0, "0.1"])
def test_bad_probability_is_named(p):
    with pytest.raises(ValueError, match="dropout probability p"):
        dropout_mask((3,), p)
    with pytest.raises(ValueError, match="dropout probability p"):
        Dropout(p)


def test_dropout_keeps_the_expectation_and_masks_the_gradient():
    x = torch.ones(200_000, requires_grad=True)
    y = dropout(x, 0.25)
    kept = y != 0
    assert abs(kept.float().mean().item() - 0.75) < 0.01
    assert abs(y.mean().item() - 1.0) < 0.01  # kept values are scaled up
    (y * 2).sum().backward()
    torch.testing.assert_close(x.grad, 2 * y.detach())  # d/dx (2 * mask * scale * x) = 2 * mask * scale
    assert dropout(x, 0.25, training=False) is x and dropout(x, 0.0) is x


def test_module_is_a_drop_in_for_nn_dropout():
    module = Dropout(0.2)
    assert isinstance(module, nn.Dropout) and module.p == 0.2 and module.state_dict() == {}
    x = torch.randn(4, 1000)
    assert (module(x) == 0).any()
    module.eval()
    assert torch.equal(module(x), x)


def _attention_inputs(seed=0):
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(2, 3, 5, 4, generator=generator, dtype=torch.float64)
    key, value = (torch.randn(2, 3, 7, 4, generator=generator, dtype=torch.float64) for _ in range(2))
    bias = torch.zeros(2, 1, 5, 7, dtype=torch.float64)
    bias[0, :, :, 5:] = float("-inf")  # masked keys
    bias[1, :, 2, :6] = float("-inf")  # a row with one key left
    bias[1, :, 3] = torch.linspace(-1, 1, 7)  # a finite bias
    return [t.requires_grad_(True) for t in (query, key, value)], bias


@pytest.mark.parametrize("p", [0.0, 0.4])
def test_masked_attention_matches_its_twin(p):
    tensors, bias = _attention_inputs()
    kept, scale = dropout_mask((2, 3, 5, 7), p) if p else (None, 1.0)
    weights = torch.randn(2, 3, 5, 4, dtype=torch.float64)
    fast = masked_attention(*tensors, bias, kept, scale)
    reference = masked_attention_reference(*tensors, bias, kept, scale)
    torch.testing.assert_close(fast, reference, rtol=1e-12, atol=1e-12)
    grads = torch.autograd.grad((fast * weights).sum(), tensors)
    expected = torch.autograd.grad((reference * weights).sum(), tensors)
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    torch.autograd.gradcheck(lambda q, k, v: masked_attention(q, k, v, bias, kept, scale), tensors)


def test_masked_attention_rejects_mismatched_inputs():
    (query, key, value), bias = _attention_inputs()
    with pytest.raises(ValueError, match="leading dims"):
        masked_attention(query[:1], key, value, bias)
    with pytest.raises(ValueError, match="kept must be a bool tensor of shape"):
        masked_attention(query, key, value, bias, torch.zeros(2, 3, 5, 6, dtype=torch.bool))
    with pytest.raises(ValueError, match="kept must be a bool tensor"):
        masked_attention(query, key, value, bias, torch.zeros(2, 3, 5, 7))


def test_attend_takes_our_function_for_cpu_training():
    (query, key, value), bias = _attention_inputs()
    allowed = bias == 0
    allowed[1, :, 3] = True  # every row keeps a key
    assert takes_masked_attention(query, key, value, 0.1) and takes_masked_attention(query, key, value, 0.0)
    with torch.no_grad():  # eval: PyTorch's fused attention
        assert takes_masked_attention(query, key, value, 0.1) and not takes_masked_attention(query, key, value, 0.0)
    assert not takes_masked_attention(query.half(), key.half(), value.half(), 0.1)
    weights = torch.randn(2, 3, 5, 4, dtype=torch.float64)
    for mask in (allowed, torch.ones_like(allowed)):  # a mask with nothing masked skips the bias
        ours = attend(query, key, value, mask, dropout_p=1e-7)[0]  # rounds to no dropped entry
        sdpa = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask)
        torch.testing.assert_close(ours, sdpa)
        for got, want in zip(
            torch.autograd.grad((ours * weights).sum(), (query, key, value)),
            torch.autograd.grad((sdpa * weights).sum(), (query, key, value)),
            strict=True,
        ):
            torch.testing.assert_close(got, want)
