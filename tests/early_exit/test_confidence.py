"""CALM's confidence measures, threshold decay, exit schedule and loss weights against hand-computed cases."""

import math

import pytest
import torch

from tf_family.early_exit import (
    anytime_loss_weights,
    class_balanced_meta_loss,
    decayed_threshold,
    distillation_kl,
    exit_points,
    meta_confidence,
    restricted_softmax_confidence,
    softmax_diff_confidence,
    softmax_max_confidence,
    state_confidence,
)


def test_softmax_measures_by_hand():
    # probabilities 0.5, 0.3, 0.2 from their logs
    logits = torch.tensor([[math.log(0.5), math.log(0.3), math.log(0.2)], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(softmax_diff_confidence(logits), torch.tensor([0.2, 0.0]))
    torch.testing.assert_close(softmax_max_confidence(logits), torch.tensor([0.5, 1 / 3]))


def test_state_confidence_is_per_row():
    previous = torch.tensor([[1.0, 0.0], [10.0, 0.0]])
    hidden = torch.tensor([[1.0, 1.0], [0.0, 3.0]])
    torch.testing.assert_close(state_confidence(previous, hidden), torch.tensor([1 / math.sqrt(2), 0.0]))
    # a row's value does not depend on the other rows (the official whole-array norm does)
    alone = state_confidence(previous[:1], hidden[:1])
    torch.testing.assert_close(alone, state_confidence(previous, hidden)[:1])


def test_meta_confidence():
    torch.testing.assert_close(meta_confidence(torch.tensor([[0.0, math.log(3.0)]])), torch.tensor([0.75]))
    with pytest.raises(ValueError, match="2 classes"):
        meta_confidence(torch.zeros(1, 3))


def test_restricted_softmax_equals_softmax_diff_of_the_kept_rows():
    generator = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(4, 8, generator=generator), torch.randn(20, 8, generator=generator)
    kept = torch.tensor([3, 7, 11])
    expected = softmax_diff_confidence((hidden @ weight.t())[:, kept])
    torch.testing.assert_close(restricted_softmax_confidence(hidden, weight[kept]), expected)
    with pytest.raises(ValueError, match="at least 2"):
        restricted_softmax_confidence(hidden, weight[:1])


def test_decayed_threshold_by_hand():
    # λ' = 0.9 λ + 0.1 λ exp(-τ t / N): λ = 0.8, τ = 4, N = 10, t = 5 -> 0.72 + 0.08 e^-2
    assert decayed_threshold(0.8, 5, 10, 4.0) == pytest.approx(0.72 + 0.08 * math.exp(-2.0))
    assert decayed_threshold(0.8, 0, 10, 4.0) == pytest.approx(0.8)
    assert decayed_threshold(0.8, 7, 10, 0.0) == 0.8
    values = decayed_threshold(0.5, torch.tensor([0, 10]), 10, 1.0)
    torch.testing.assert_close(values, torch.tensor([0.5, 0.45 + 0.05 * math.exp(-1.0)]))
    with pytest.raises(ValueError, match="max_length"):
        decayed_threshold(0.5, 1, 0, 1.0)


def test_exit_points():
    assert exit_points(8, 2, 2) == [2, 4, 6, 8]
    assert exit_points(8, 1, 3) == [1, 4, 7, 8]
    assert exit_points(4, 4, 1) == [4]
    with pytest.raises(ValueError, match="first_exit"):
        exit_points(4, 0, 1)


def test_anytime_loss_weights_by_hand():
    torch.testing.assert_close(anytime_loss_weights(3, "geometric"), torch.tensor([1, 2, 4], dtype=torch.float64) / 7)
    torch.testing.assert_close(anytime_loss_weights(4, "uniform"), torch.full((4,), 0.25, dtype=torch.float64))
    torch.testing.assert_close(anytime_loss_weights(3, "linear"), torch.tensor([1, 2, 3], dtype=torch.float64) / 6)
    # the official integer codes: -1 geometric, 0 uniform, k: arange(1, k E + 1, k)
    torch.testing.assert_close(anytime_loss_weights(3, -1), anytime_loss_weights(3, "geometric"))
    torch.testing.assert_close(anytime_loss_weights(3, 0), anytime_loss_weights(3, "uniform"))
    torch.testing.assert_close(anytime_loss_weights(3, 2), torch.tensor([1, 3, 5], dtype=torch.float64) / 9)
    with pytest.raises(ValueError, match="aggregation"):
        anytime_loss_weights(3, "cubic")


def test_class_balanced_meta_loss_by_hand():
    logits = torch.tensor([[0.0, 0.0], [0.0, math.log(3.0)], [0.0, math.log(3.0)], [0.0, math.log(3.0)]])
    labels = torch.tensor([0, 1, 1, 1])
    # class 0: one example, -log 0.5; class 1: three examples, each -log 0.75; classes weigh equally
    expected = 0.5 * (math.log(2.0) + math.log(4 / 3))
    assert class_balanced_meta_loss(logits, labels).item() == pytest.approx(expected, rel=1e-6)
    only_ones = class_balanced_meta_loss(logits, labels, valid=labels == 1)
    assert only_ones.item() == pytest.approx(math.log(4 / 3), rel=1e-6)


def test_distillation_kl_by_hand():
    final = torch.tensor([[0.0, 0.0], [0.0, math.log(3.0)]], requires_grad=True)  # p = (1/2, 1/2), (1/4, 3/4)
    exit_logits = torch.tensor([[0.0, math.log(3.0)], [0.0, math.log(3.0)]], requires_grad=True)
    kl = distillation_kl(exit_logits, final)
    # KL(p || q) = sum p log(p / q): (1/2) log(2) + (1/2) log(2/3) = (1/2) log(4/3); then equal distributions
    torch.testing.assert_close(kl, torch.tensor([0.5 * math.log(4 / 3), 0.0]), rtol=1e-6, atol=1e-7)
    kl.sum().backward()
    assert final.grad is None and exit_logits.grad.abs().sum() > 0  # the final layer is the (detached) target
    with pytest.raises(ValueError, match="same shape"):
        distillation_kl(torch.zeros(2, 3), torch.zeros(2, 4))
