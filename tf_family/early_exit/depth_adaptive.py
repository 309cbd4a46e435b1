"""Depth-Adaptive Transformer exits (Elbayad, Gu, Grave, Auli, "Depth-Adaptive Transformer", ICLR 2020,
arXiv:1910.10073, section 3 and 4): halting classifiers trained against oracle exits. Pure functions, written from
the paper (no official code was released).

Exits ``n = 1 .. P`` (the model's exit points, the last one the full depth). Two halting models:

- **geometric-like** (section 3.2, "halting at each exit"): a binary classifier at every exit but the last,
  ``χ_n = sigmoid(h_n)`` from the state at exit ``n``; the exit distribution is
  ``q(n) = χ_n · Π_{m<n} (1 - χ_m)`` (``χ_P = 1``). A token leaves at the first exit whose ``χ_n`` reaches the
  threshold (0.5 in the paper).
- **multinomial** (section 3.2, "multinomial"): one classifier over all exits, ``q = softmax(h)``, from the state at
  the first exit. The paper leaves at ``argmax q``; here a token leaves at the first exit whose cumulative
  probability ``Σ_{m<=n} q(m)`` reaches the threshold (0.5: the median exit), which keeps one knob for the
  quality/depth trade-off and the calibration.

Oracles (section 4), per token ``t`` with next-token target ``y_t`` and ``LL_t^n = log p_n(y_t)``:

- ``"likelihood"``: ``n*_t = argmax_n LL_t^n - λ n`` (the token-level likelihood oracle, with the paper's penalty ``λ``
  per layer; ties go to the earlier exit);
- ``"correctness"``: the first exit whose argmax is ``y_t`` (the last exit when none is).

The halting loss is the cross-entropy of ``q`` against the oracle's one-hot exit, ``-log q(n*)``: for the
geometric-like model ``-log χ_{n*} - Σ_{m<n*} log(1 - χ_m)`` (no ``χ_{n*}`` term when ``n*`` is the last exit).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

HALTING_MEASURES = ("halting", "multinomial")
ORACLES = ("likelihood", "correctness")


def oracle_exits(
    target_log_probs: torch.Tensor,
    correct: torch.Tensor,
    points: list[int],
    oracle: str = "likelihood",
    depth_penalty: float = 0.0,
) -> torch.Tensor:
    """The oracle exit index (into ``points``) of every token: ``target_log_probs`` ``(P, ...)`` is ``log p_n(y)``
    at each exit, ``correct`` ``(P, ...)`` whether each exit's argmax is ``y``; returns ``(...)`` int64."""
    if target_log_probs.shape[0] != len(points) or correct.shape != target_log_probs.shape:
        raise ValueError(
            f"target_log_probs {tuple(target_log_probs.shape)} and correct {tuple(correct.shape)} must both be "
            f"(P={len(points)}, ...), one row per exit point."
        )
    if oracle == "likelihood":
        depth = torch.tensor(points, dtype=torch.float32, device=target_log_probs.device)
        penalised = target_log_probs.float() - depth_penalty * depth.view(-1, *[1] * (target_log_probs.dim() - 1))
        return penalised.argmax(dim=0)  # the first maximum: the earlier exit on ties
    if oracle == "correctness":
        last = torch.full(correct.shape[1:], len(points) - 1, dtype=torch.long, device=correct.device)
        first = correct.to(torch.int8).argmax(dim=0)  # the first True (0 when none)
        return torch.where(correct.any(dim=0), first, last)
    raise ValueError(f"oracle must be one of {ORACLES}, got {oracle!r}.")


def geometric_exit_distribution(halting_logits: torch.Tensor) -> torch.Tensor:
    """``q(n) = χ_n Π_{m<n} (1 - χ_m)`` over the ``P`` exits from the ``P - 1`` halting logits ``(..., P - 1)``
    -> ``(..., P)`` (the last exit takes what is left)."""
    halt = torch.sigmoid(halting_logits.float())
    survive = torch.cumprod(1 - halt, dim=-1)  # (..., P - 1): still running after exit n
    before = torch.cat([torch.ones_like(survive[..., :1]), survive[..., :-1]], dim=-1)
    return torch.cat([halt * before, survive[..., -1:]], dim=-1)


def geometric_halting_loss(halting_logits: torch.Tensor, oracle: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``-log q(n*)`` of the geometric-like model, a mean over the ``valid`` tokens: ``halting_logits`` ``(..., P - 1)``,
    ``oracle`` ``(...)`` exit indices in ``[0, P)``, ``valid`` ``(...)`` bool."""
    logits = halting_logits.float()
    index = torch.arange(logits.shape[-1], device=logits.device)
    stay = index < oracle[..., None]  # exits before n*: the token went on (-log(1 - χ))
    halt = index == oracle[..., None]  # exit n* (not the last): the token left (-log χ)
    per_exit = torch.where(stay, F.softplus(logits), 0.0) + torch.where(halt, F.softplus(-logits), 0.0)
    per_token = per_exit.sum(-1)
    return (per_token * valid).sum() / valid.sum().clamp(min=1)


def multinomial_halting_loss(exit_logits: torch.Tensor, oracle: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``-log q(n*)`` with ``q = softmax(exit_logits)`` ``(..., P)``, a mean over the ``valid`` tokens."""
    per_token = F.cross_entropy(
        exit_logits.float().reshape(-1, exit_logits.shape[-1]), oracle.reshape(-1), reduction="none"
    )
    valid = valid.reshape(-1)
    return (per_token * valid).sum() / valid.sum().clamp(min=1)


def geometric_halting_confidence(halting_logit: torch.Tensor) -> torch.Tensor:
    """``χ_n = sigmoid(h_n)``: the probability of leaving at this exit, given the token got here."""
    return torch.sigmoid(halting_logit.float())


def multinomial_halting_confidence(exit_logits: torch.Tensor, index: int) -> torch.Tensor:
    """``Σ_{m<=index} q(m)`` with ``q = softmax(exit_logits)`` ``(..., P)``: the probability of having left by exit
    ``index``."""
    return torch.softmax(exit_logits.float(), dim=-1)[..., : index + 1].sum(-1)


__all__ = [
    "HALTING_MEASURES",
    "ORACLES",
    "geometric_exit_distribution",
    "geometric_halting_confidence",
    "geometric_halting_loss",
    "multinomial_halting_confidence",
    "multinomial_halting_loss",
    "oracle_exits",
]
