"""Adaptive Computation Time (Graves 2016, arXiv:1603.08983) per position, as the Universal Transformer uses it
(Dehghani et al. 2019, arXiv:1807.03819): the halting unit and the halting rule, shared by every model that ponders.

The rule is tensor2tensor's ``universal_transformer_act`` (``act_type="basic"``; ``"accumulated"`` is its variant
that sums the weighted states): at every step each position that has not halted adds its halting probability ``p``;
a position halts at the step where the sum would pass ``threshold = 1 - act_epsilon``, and that step's weight is the
*remainder* ``R = 1 - (sum so far)`` instead of ``p``, so the weights of a halted position sum to one. ``N`` counts the
steps a position took (the halting step included); the ponder cost is ``N + R`` (``rho`` in Graves 2016).

At the maximum step the two references differ: Graves 2016 halts every position still running there, with its
remainder (``halting_step(..., force_halt=True)``), so every position's weights sum to one and ``R`` (hence the ponder
cost's gradient) exists for every position; tensor2tensor's loop just stops, leaving such a position ``R = 0``, weights
summing to less than one and no ponder-cost gradient to its halting unit.

A halted position is marked in a boolean mask; tensor2tensor tests ``halting_probability < 1.0``, which is the same
test, since the sum ``h + (1 - h)`` of a halting position rounds to exactly one in float32 (the probabilities are
computed in float32 whatever the model's dtype). ``tests/layers/test_halting.py`` runs tensor2tensor's rule,
transcribed, against this one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn


@dataclass(frozen=True)
class HaltingState:
    """What ACT carries from one step to the next, per position ``(B, T)``.

    Attributes:
        halting_probability: the sum of the halting probabilities so far (``sum_n p^n``; one once halted).
        remainders: ``R``, set at the halting step (zero before it, and for positions that never halt).
        n_updates: ``N``, the steps taken (the halting step included).
        halted: True once a position has halted (or when it never runs: padding).
    """

    halting_probability: torch.Tensor
    remainders: torch.Tensor
    n_updates: torch.Tensor
    halted: torch.Tensor

    @classmethod
    def start(cls, running: torch.Tensor, dtype: torch.dtype = torch.float32) -> HaltingState:
        """The state before the first step: nothing accumulated; positions where ``running`` (``(B, T)`` bool) is
        False (padding) count as halted from the start and never take a step."""
        zeros = torch.zeros(running.shape, dtype=dtype, device=running.device)
        return cls(zeros, zeros, zeros, ~running)

    @property
    def running(self) -> torch.Tensor:
        """``(B, T)`` bool: the positions that will take the next step."""
        return ~self.halted

    @property
    def ponder_time(self) -> torch.Tensor:
        """``(B, T)``: ``N + R``, the ponder time ``rho`` whose mean is the ponder cost."""
        return self.n_updates + self.remainders


def halting_step(
    state: HaltingState, probability: torch.Tensor, threshold: float, force_halt: bool = False
) -> tuple[HaltingState, torch.Tensor]:
    """One step of the ACT rule: the new state and the ``(B, T)`` weight of this step's transformed state.

    The weight is ``p`` for a position that keeps running, its remainder ``1 - h`` at the step where it halts
    (``h + p > threshold``), and zero once halted.

    Args:
        state: the state after the previous steps.
        probability: ``(B, T)`` halting probabilities ``p`` of this step (a sigmoid's output).
        threshold: ``1 - act_epsilon``.
        force_halt: every position still running halts at this step, with its remainder ``R = 1 - h`` as the weight
            (Graves 2016, eq. 3: ``N(t) = min(max steps, first step past the threshold)``); pass it at the last
            step. Without it a position that never passes the threshold ends with ``R = 0`` and weights that sum to
            less than one (tensor2tensor's loop just stops).
    """
    was_running = state.running.to(probability.dtype)
    reached = state.halting_probability + probability * was_running
    if force_halt:
        new_halted = was_running
        still_running = torch.zeros_like(was_running)
    else:
        new_halted = (reached > threshold).to(probability.dtype) * was_running
        still_running = (reached <= threshold).to(probability.dtype) * was_running
    halting_probability = state.halting_probability + probability * still_running
    remainders = state.remainders + new_halted * (1 - halting_probability)
    weights = probability * still_running + new_halted * (1 - halting_probability)
    new_state = replace(
        state,
        halting_probability=halting_probability + new_halted * (1 - halting_probability),
        remainders=remainders,
        n_updates=state.n_updates + still_running + new_halted,
        halted=state.halted | new_halted.bool(),
    )
    return new_state, weights


def accumulate_state(
    previous: torch.Tensor, transformed: torch.Tensor, weights: torch.Tensor, accumulated: bool
) -> torch.Tensor:
    """The output state after one step: tensor2tensor's ``basic`` rule ``previous * (1 - w) + transformed * w``, or
    with ``accumulated`` the weighted sum ``previous + transformed * w`` (Graves 2016's mean-field output).
    ``previous``, ``transformed``: ``(B, T, D)``; ``weights``: ``(B, T)`` from `halting_step`."""
    weights = weights.unsqueeze(-1).to(transformed.dtype)  # (B, T, 1)
    if accumulated:
        return previous + transformed * weights
    return previous * (1 - weights) + transformed * weights


class HaltingLinear(nn.Linear):
    """The halting unit's ``W s + b``: a type of its own, so that a model's ``_init_weights`` can tell it from the
    other linear layers (whose bias it zeroes) and start its bias at ``bias_init``."""


class HaltingUnit(nn.Module):
    """The halting probability of every position: ``sigmoid(W s + b)`` ``(B, T, D) -> (B, T)``, computed in float32.

    ``b`` starts at ``bias_init`` (tensor2tensor's ``act_halting_bias_init``, 1.0): a fresh model halts after a few
    steps rather than at once. A model's ``_init_weights`` must initialise the `HaltingLinear` itself (its generic
    init of linear layers would zero the bias).
    """

    def __init__(self, hidden_size: int, bias_init: float, init_std: float):
        super().__init__()
        self.bias_init, self.init_std = bias_init, init_std
        self.linear = HaltingLinear(hidden_size, 1)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        self.linear.weight.normal_(0.0, self.init_std)
        self.linear.bias.fill_(self.bias_init)

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.linear(state).squeeze(-1).float())  # (B, T)


__all__ = ["HaltingLinear", "HaltingState", "HaltingUnit", "accumulate_state", "halting_step"]
