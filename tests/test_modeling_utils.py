"""`fused_projections` equals calling the projections one by one, and steps aside for wrapped modules;
`build_activation` and `find_first_real_token` do what their docstrings say."""

from unittest import mock

import torch
from torch import nn
from transformers.activations import ACT2FN

from tf_family.modeling.utils import FUSE_MIN_ROWS, build_activation, find_first_real_token, fused_projections


def _linears(bias=True):
    torch.manual_seed(0)
    return [nn.Linear(6, width, bias=bias) for width in (6, 6, 4)]


def test_fused_equals_separate_values_and_gradients():
    for bias, rows in ((True, 2), (False, 2), (True, FUSE_MIN_ROWS), (False, FUSE_MIN_ROWS + 1)):
        linears = _linears(bias)
        hidden = torch.randn(rows, 3, 6, requires_grad=True)
        fused = fused_projections(hidden, *linears)
        separate = [linear(hidden) for linear in linears]
        for got, want in zip(fused, separate, strict=True):
            torch.testing.assert_close(got, want)
        params = [hidden, *(p for linear in linears for p in linear.parameters())]
        weights = [torch.randn_like(t) for t in separate]
        grads = torch.autograd.grad(sum((t * w).sum() for t, w in zip(fused, weights, strict=True)), params)
        expected = torch.autograd.grad(sum((t * w).sum() for t, w in zip(separate, weights, strict=True)), params)
        for got, want in zip(grads, expected, strict=True):
            torch.testing.assert_close(got, want)


def test_few_rows_do_not_copy_the_weights():
    # a decoding step (a few rows) must not concatenate the weights: the copy costs more than the product
    linears = _linears()
    with mock.patch("torch.cat", wraps=torch.cat) as cat:
        few = fused_projections(torch.randn(FUSE_MIN_ROWS - 1, 6), *linears)
        assert cat.call_count == 0
        many = fused_projections(torch.randn(FUSE_MIN_ROWS, 6), *linears)
        assert cat.call_count == 2  # weights and biases, once each
    assert [t.shape for t in few] == [(FUSE_MIN_ROWS - 1, 6), (FUSE_MIN_ROWS - 1, 6), (FUSE_MIN_ROWS - 1, 4)]
    assert [t.shape for t in many] == [(FUSE_MIN_ROWS, 6), (FUSE_MIN_ROWS, 6), (FUSE_MIN_ROWS, 4)]


def test_wrapped_or_hooked_modules_are_called():
    class Wrapped(nn.Linear):
        def forward(self, x):
            return super().forward(x) + 1.0

    linears = _linears()
    wrapped = Wrapped(6, 6)
    wrapped.load_state_dict(linears[1].state_dict())
    hidden = torch.randn(2, 6)
    out = fused_projections(hidden, linears[0], wrapped)
    torch.testing.assert_close(out[1], linears[1](hidden) + 1.0)
    calls = []
    linears[2].register_forward_hook(lambda module, args, output: calls.append(output.shape))
    fused_projections(hidden, *linears)
    assert calls == [(2, 4)]


def test_build_activation_swaps_only_the_python_tanh_gelu():
    hidden = torch.linspace(-6, 6, 101)
    for name in ("gelu_new", "gelu_pytorch_tanh"):
        activation = build_activation(name)
        assert isinstance(activation, nn.GELU) and activation.approximate == "tanh"
        torch.testing.assert_close(activation(hidden), ACT2FN[name](hidden))
    for name in ("gelu", "relu", "silu"):
        assert type(build_activation(name)) is type(ACT2FN[name])


def test_find_first_real_token_under_left_and_right_padding():
    mask = torch.tensor([[1, 1, 1, 0], [0, 0, 1, 1], [0, 1, 0, 1]])
    assert find_first_real_token(mask, 3, "cpu").tolist() == [0, 2, 1]
    assert find_first_real_token(mask.bool(), 3, "cpu").tolist() == [0, 2, 1]
    none = find_first_real_token(None, 2, "cpu")
    assert none.tolist() == [0, 0] and none.dtype == torch.long
