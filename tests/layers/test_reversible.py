"""`reversible_stack`: the recomputing backward gives plain backpropagation's gradients, dropout included, and
leaves the global RNG where the forward left it."""

import torch
from torch import nn

from tf_family.layers import reversible_stack


def _blocks(seed=0):
    torch.manual_seed(seed)
    layers = [(nn.Sequential(nn.Linear(6, 6), nn.Dropout(0.3), nn.Tanh()), nn.Sequential(nn.Linear(6, 6), nn.ReLU()))
              for _ in range(3)]  # fmt: skip
    return layers, [p for f, g in layers for p in (*f.parameters(), *g.parameters())]


def test_reversible_stack_matches_plain_backprop():
    layers, parameters = _blocks()
    x = torch.randn(4, 6, dtype=torch.float64)
    for module in (m for pair in layers for m in pair):
        module.double()
    inputs = [x.clone().requires_grad_(True), x.clone().requires_grad_(True)]

    torch.manual_seed(1)
    first, second = inputs
    for f, g in layers:
        first = first + f(second)
        second = second + g(first)
    (first.sum() + 2 * second.pow(2).sum()).backward()
    expected = [p.grad.clone() for p in parameters] + [t.grad.clone() for t in inputs]
    for tensor in (*parameters, *inputs):
        tensor.grad = None

    torch.manual_seed(1)
    first, second = reversible_stack(*inputs, layers, parameters)
    after_forward = torch.random.get_rng_state()
    (first.sum() + 2 * second.pow(2).sum()).backward()
    assert torch.equal(torch.random.get_rng_state(), after_forward)
    got = [p.grad for p in parameters] + [t.grad for t in inputs]
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
