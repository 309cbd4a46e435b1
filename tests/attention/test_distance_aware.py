"""DA-Transformer's distance-aware attention: the learnable sigmoid's rules (f(0) = 1, increasing, bounded by
1 + exp(v), stable for large arguments, one (w_h, v_h) per head); the attention is the paper's re-normalised ReLU'd
weights; every Sparse Transformer kernel (factorised and blockwise) given a `DistanceAware` equals its dense twin
(values and gradients in float64, including the gradients of w_h and v_h)."""

import math

import pytest
import torch

from tf_family.attention.blockwise import BlockwisePattern, blockwise_attention, blockwise_attention_reference
from tf_family.attention.distance_aware import (
    ROW_SUM_FLOOR,
    DistanceAware,
    distance_aware_attention,
    distance_aware_coefficients,
)
from tf_family.attention.factorized import FactorizedPattern, factorized_attention, factorized_attention_reference
from tf_family.layers.distance_aware import DistanceAwareScaling

B, H, DH = 2, 3, 8


def test_sigmoid_is_one_at_zero_increasing_and_bounded():
    x = torch.linspace(-30.0, 30.0, 601, dtype=torch.float64)
    for offset in (-3.0, 0.0, 0.7, 5.0):
        v = torch.tensor(offset, dtype=torch.float64)
        # f(x; v) with x = w |d|: w = 1 over the distances |x|, and w = -1 for the negative side
        f = torch.where(
            x >= 0,
            distance_aware_coefficients(torch.tensor(1.0, dtype=torch.float64), v, x),
            distance_aware_coefficients(torch.tensor(-1.0, dtype=torch.float64), v, x),
        )
        assert f[300] == pytest.approx(1.0)  # x = 0
        assert (f[1:] > f[:-1]).all()  # strictly increasing
        assert (f > 0).all() and (f < 1 + math.exp(offset) + 1e-9).all()
        expected = (1 + math.exp(offset)) / (1 + torch.exp(v - x))  # the paper's form, where it does not overflow
        torch.testing.assert_close(f, expected, rtol=1e-12, atol=1e-12)
    # through the public function: f(w |d|; v), at d = 0 always 1, any w
    distance = torch.arange(-5, 6, dtype=torch.float64)
    for weight in (-2.0, 0.0, 0.5):
        coefficients = distance_aware_coefficients(torch.tensor(weight), torch.tensor(0.3), distance)
        assert coefficients[5] == 1.0
        torch.testing.assert_close(coefficients, coefficients.flip(0))  # the real distance |i - j|: symmetric
        far = coefficients[5:]
        assert (far[1:] > far[:-1]).all() if weight > 0 else (far[1:] <= far[:-1]).all()
    # exp(100) overflows float32, so the paper's quotient would be inf / inf; the softplus form stays finite
    large = distance_aware_coefficients(torch.tensor(1.0), torch.tensor(100.0), torch.tensor([0.0, 0.5, 3.0]))
    torch.testing.assert_close(large, torch.tensor([1.0, math.exp(0.5), math.exp(3.0)]))


def test_each_head_has_its_own_weight_and_offset():
    scaling = DistanceAware(torch.tensor([-1.0, 0.0, 2.0]), torch.tensor([0.0, 1.0, -1.0]))
    distance = torch.arange(6)[:, None] - torch.arange(6)[None, :]
    coefficients = scaling.coefficients(distance, torch.float64)  # (H, T, T)
    assert coefficients.shape == (3, 6, 6)
    assert (coefficients.diagonal(dim1=-2, dim2=-1) == 1).all()
    assert (coefficients[0, 5, :5] < 1).all()  # w < 0: far keys weigh less (a local head)
    assert (coefficients[1] == 1).all()  # w = 0: no distance effect
    assert (coefficients[2, 5, :5] > 1).all()  # w > 0: far keys weigh more
    for head in range(3):
        expected = (1 + math.exp(scaling.offset[head])) / (
            1 + torch.exp(scaling.offset[head].double() - scaling.weight[head].double() * distance.abs())
        )
        torch.testing.assert_close(coefficients[head], expected)
    with pytest.raises(ValueError, match="offset"):
        DistanceAware(torch.zeros(3), torch.zeros(2))
    with pytest.raises(ValueError, match="weight"):
        DistanceAware(torch.zeros(3, 1), torch.zeros(3))
    layer = DistanceAwareScaling(4)
    assert layer.weight.tolist() == pytest.approx([-1.0, -1 / 3, 1 / 3, 1.0])
    assert layer.heads(1, 3).weight.tolist() == pytest.approx([-1 / 3, 1 / 3])


def test_attention_is_the_renormalised_relu_scores():
    generator = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(1, 1, 5, 4, generator=generator, dtype=torch.float64) for _ in "qkv")
    allowed = torch.ones(5, 5, dtype=torch.bool).tril()
    coefficients = torch.rand(5, 5, generator=generator, dtype=torch.float64) + 0.5
    out, probs = distance_aware_attention(query, key, value, allowed, coefficients)
    for i in range(5):
        weights = [
            max(float(query[0, 0, i] @ key[0, 0, j]) / 2, 0.0) * float(coefficients[i, j]) for j in range(i + 1)
        ]
        total = max(sum(weights), ROW_SUM_FLOOR)
        expected = sum(w / total * value[0, 0, j] for j, w in enumerate(weights))
        torch.testing.assert_close(out[0, 0, i], torch.as_tensor(expected, dtype=torch.float64))
        assert (probs[0, 0, i, i + 1 :] == 0).all()
    # a row whose scores are all <= 0 gives zeros, not NaN
    out, _ = distance_aware_attention(query, -query, value, torch.eye(5, dtype=torch.bool), coefficients)
    assert torch.isfinite(out).all() and (out == 0).all()


KERNELS = [
    (factorized_attention, factorized_attention_reference, FactorizedPattern("local", 4)),
    (factorized_attention, factorized_attention_reference, FactorizedPattern("strided", 4)),
    (factorized_attention, factorized_attention_reference, FactorizedPattern("block", 4)),
    (factorized_attention, factorized_attention_reference, FactorizedPattern("summary", 5, 1, 2)),
    (blockwise_attention, blockwise_attention_reference, BlockwisePattern(4, 0)),
    (blockwise_attention, blockwise_attention_reference, BlockwisePattern(4, 2)),
    (blockwise_attention, blockwise_attention_reference, BlockwisePattern(4, 1, causal=False)),
]


@pytest.mark.parametrize("length", [1, 7, 13])
@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: repr(k[2]))
def test_kernels_match_dense_twin(kernel, length):
    fast_kernel, reference_kernel, pattern = kernel
    generator = torch.Generator().manual_seed(0)
    tensors = [torch.randn(B, H, length, DH, generator=generator, dtype=torch.float64) for _ in "qkv"]
    tensors = [t.requires_grad_() for t in tensors]
    weight = torch.tensor([-0.8, 0.1, 0.6], dtype=torch.float64, requires_grad=True)
    offset = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64, requires_grad=True)
    scaling = DistanceAware(weight, offset)
    weights = torch.randn(B, H, length, DH, dtype=torch.float64)
    fast = fast_kernel(*tensors, pattern, scaling)
    reference = reference_kernel(*tensors, pattern, scaling)
    torch.testing.assert_close(fast, reference, rtol=1e-10, atol=1e-10)
    inputs = [*tensors, weight, offset]
    for got, expected in zip(
        torch.autograd.grad((fast * weights).sum(), inputs, allow_unused=True),
        torch.autograd.grad((reference * weights).sum(), inputs, allow_unused=True),
        strict=True,
    ):
        if expected is None or got is None:  # one position only: no distance, no gradient to w or v on either side
            assert length == 1 and (got is None or not got.any()) and (expected is None or not expected.any())
            continue
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
