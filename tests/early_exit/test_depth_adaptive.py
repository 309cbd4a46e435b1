"""Depth-Adaptive Transformer exits (Elbayad et al. 2020): the oracles, the exit distributions and the halting
losses, each rule against a hand computation."""

import math

import pytest
import torch

from tf_family.early_exit import (
    geometric_exit_distribution,
    geometric_halting_loss,
    multinomial_halting_confidence,
    multinomial_halting_loss,
    oracle_exits,
)

POINTS = [1, 2, 4]


def test_likelihood_oracle_takes_the_best_exit_and_pays_the_depth_penalty():
    # 2 tokens; log p(y) at exits after 1, 2 and 4 layers
    log_probs = torch.tensor([[-3.0, -1.0], [-1.0, -0.9], [-0.5, -0.9]])
    correct = torch.zeros(3, 2, dtype=torch.bool)
    assert oracle_exits(log_probs, correct, POINTS).tolist() == [2, 1]  # the tie (-0.9) goes to the earlier exit
    # λ = 0.3 nats per layer: token 0 scores -3.3, -1.6, -1.7 -> exit 1 (2 layers); token 1: -1.3, -1.5, -2.1 -> 0
    assert oracle_exits(log_probs, correct, POINTS, depth_penalty=0.3).tolist() == [1, 0]


def test_correctness_oracle_takes_the_first_right_exit_or_the_last():
    correct = torch.tensor([[False, False, True], [True, False, False], [True, False, False]])  # (P, tokens)
    log_probs = torch.zeros(3, 3)
    assert oracle_exits(log_probs, correct, POINTS, oracle="correctness").tolist() == [1, 2, 0]
    with pytest.raises(ValueError, match="oracle must be one of"):
        oracle_exits(log_probs, correct, POINTS, oracle="sequence")
    with pytest.raises(ValueError, match="one row per exit point"):
        oracle_exits(log_probs[:2], correct[:2], POINTS)


def test_geometric_distribution_and_loss_are_the_papers():
    logits = torch.tensor([[0.3, -1.2]])  # χ_1, χ_2 logits; χ_3 = 1
    chi = torch.sigmoid(logits[0])
    q = geometric_exit_distribution(logits)[0]
    expected = torch.stack([chi[0], (1 - chi[0]) * chi[1], (1 - chi[0]) * (1 - chi[1])])
    torch.testing.assert_close(q, expected)
    assert math.isclose(float(q.sum()), 1.0, rel_tol=1e-6)
    valid = torch.tensor([True])
    for n_star in range(3):
        loss = geometric_halting_loss(logits, torch.tensor([n_star]), valid)
        torch.testing.assert_close(loss, -q[n_star].log())
    # invalid tokens do not count; the mean is over the valid ones
    two = torch.cat([logits, torch.tensor([[5.0, 5.0]])])
    loss = geometric_halting_loss(two, torch.tensor([1, 0]), torch.tensor([True, False]))
    torch.testing.assert_close(loss, -q[1].log())


def test_multinomial_loss_and_cumulative_confidence():
    logits = torch.tensor([[[0.5, 1.0, -2.0]]])  # (B, T, P)
    q = torch.softmax(logits[0, 0], -1)
    loss = multinomial_halting_loss(logits, torch.tensor([[1]]), torch.tensor([[True]]))
    torch.testing.assert_close(loss, -q[1].log())
    for index in range(3):
        torch.testing.assert_close(multinomial_halting_confidence(logits, index)[0, 0], q[: index + 1].sum())


def test_every_confidence_measure_has_a_default_calibration_grid():
    from tf_family.early_exit import CONFIDENCE_MEASURES
    from tf_family.training.early_exit import DEFAULT_GRIDS

    assert set(DEFAULT_GRIDS) == set(CONFIDENCE_MEASURES)
    for grid in DEFAULT_GRIDS.values():
        assert list(grid) == sorted(grid, reverse=True)  # fixed-sequence testing walks a descending grid
