"""Learn-then-Test calibration of an early-exit threshold (Angelopoulos et al. 2021; CALM section 3.2).

For a grid of thresholds ``λ_1 > λ_2 > … > λ_k`` (most to least conservative) and per-example losses in [0, 1]
(token disagreement or 1 - ROUGE-L against the full model's output; a risk difference rescaled with
`rescale_risks`), each null hypothesis ``H_j: R(λ_j) > δ`` gets a valid p-value; fixed-sequence testing rejects
them in order while ``p_j <= ε`` and returns the last rejected threshold. Then
``P(R(λ_returned) <= δ) >= 1 - ε`` over the draw of the calibration set.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

P_VALUE_METHODS = ("hoeffding", "hoeffding_bentkus")


def _check(risk: float, n: int, delta: float) -> None:
    if n < 1:
        raise ValueError(f"n (calibration examples) must be >= 1, got {n}.")
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta (the tolerated risk) must be in (0, 1), got {delta}.")
    if not 0.0 <= risk <= 1.0:
        raise ValueError(f"the empirical risk must be in [0, 1] (rescale the losses first), got {risk}.")


def hoeffding_p_value(risk: float, n: int, delta: float) -> float:
    """Hoeffding's p-value of ``H: R > δ`` from the mean ``risk`` of ``n`` losses in [0, 1]:
    ``exp(-2 n (δ - R̂)_+^2)``."""
    _check(risk, n, delta)
    return math.exp(-2.0 * n * max(delta - risk, 0.0) ** 2)


def binomial_cdf(k: int, n: int, p: float) -> float:
    """``P[Bin(n, p) <= k]``, summed in log space (exact for any ``n``; no scipy)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    log_p, log_q = math.log(p), math.log1p(-p)
    terms = [
        math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * log_p + (n - i) * log_q
        for i in range(k + 1)
    ]
    top = max(terms)
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in terms))


def _kl_bernoulli(a: float, b: float) -> float:
    """``h(a, b) = a log(a/b) + (1 - a) log((1 - a)/(1 - b))`` (0 log 0 = 0)."""
    value = 0.0
    if a > 0:
        value += a * math.log(a / b)
    if a < 1:
        value += (1 - a) * math.log((1 - a) / (1 - b))
    return value


def hoeffding_bentkus_p_value(risk: float, n: int, delta: float) -> float:
    """The Hoeffding–Bentkus p-value of ``H: R > δ`` (Bates et al. 2021, used by LTT):
    ``min(exp(-n h(min(R̂, δ), δ)), e P[Bin(n, δ) <= ceil(n R̂)])``, capped at 1."""
    _check(risk, n, delta)
    hoeffding = math.exp(-n * _kl_bernoulli(min(risk, delta), delta))
    # a tiny tolerance keeps n * R̂ that is an integer up to rounding from jumping to the next integer
    bentkus = math.e * binomial_cdf(math.ceil(n * risk - 1e-9), n, delta)
    return min(hoeffding, bentkus, 1.0)


def fixed_sequence_test(p_values: Sequence[float], epsilon: float) -> int:
    """How many hypotheses fixed-sequence testing rejects at level ``ε``: the length of the leading run of
    ``p <= ε`` (testing stops at the first ``p > ε``). Controls the family-wise error at ``ε``."""
    if not 0.0 < epsilon < 1.0:
        raise ValueError(f"epsilon (the allowed failure probability) must be in (0, 1), got {epsilon}.")
    rejected = 0
    for p_value in p_values:
        if p_value > epsilon:
            break
        rejected += 1
    return rejected


def rescale_risks(losses: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """Map losses from ``[low, high]`` onto [0, 1] (e.g. a risk difference ``L(early) - L(full)`` in [-1, 1]);
    a tolerance ``δ`` maps the same way: ``(δ - low) / (high - low)``."""
    if not high > low:
        raise ValueError(f"the loss range must have high > low, got [{low}, {high}].")
    losses = torch.as_tensor(losses, dtype=torch.float64)
    if bool((losses < low).any()) or bool((losses > high).any()):
        raise ValueError(f"losses must lie in [{low}, {high}], got values in [{losses.min()}, {losses.max()}].")
    return (losses - low) / (high - low)


def token_disagreement(early: Sequence[int], full: Sequence[int]) -> float:
    """The fraction of positions where two generations differ (a length difference counts as disagreement), in
    [0, 1]: textual inconsistency at the token level."""
    length = max(len(early), len(full))
    if length == 0:
        return 0.0
    same = sum(a == b for a, b in zip(early, full, strict=False))
    return 1.0 - same / length


def rouge_l_f1(candidate: Sequence, reference: Sequence) -> float:
    """ROUGE-L F1 of two token sequences: from their longest common subsequence (F1, β = 1), in [0, 1]."""
    if not candidate or not reference:
        return float(len(candidate) == len(reference))
    previous = [0] * (len(reference) + 1)
    for item in candidate:
        current = [0]
        for j, other in enumerate(reference):
            current.append(previous[j] + 1 if item == other else max(previous[j + 1], current[j]))
        previous = current
    common = previous[-1]
    if common == 0:
        return 0.0
    precision, recall = common / len(candidate), common / len(reference)
    return 2 * precision * recall / (precision + recall)


@dataclass(frozen=True)
class LTTResult:
    """The outcome of `calibrate_threshold`.

    Attributes:
        threshold: the smallest threshold whose risk is certified ``<= delta`` (``None``: none could be; run the
            full model).
        index: its position in the grid (``None`` with it).
        thresholds, risks, p_values: the grid (descending), the empirical risk and the p-value at each threshold.
        delta, epsilon, n, method: the request: risk tolerance δ, failure probability ε, calibration examples,
            p-value method.
    """

    threshold: float | None
    index: int | None
    thresholds: tuple[float, ...]
    risks: tuple[float, ...]
    p_values: tuple[float, ...]
    delta: float
    epsilon: float
    n: int
    method: str

    def guarantee(self) -> str:
        """One sentence stating what was certified."""
        if self.threshold is None:
            return (
                f"No threshold of the grid could be certified at delta={self.delta}, epsilon={self.epsilon} "
                f"(n={self.n}, {self.method}); the model must run at full depth."
            )
        return (
            f"With probability at least {1 - self.epsilon:g} over the calibration draw (n={self.n}), the expected "
            f"inconsistency with the full model is at most {self.delta:g} at threshold {self.threshold:.6g} "
            f"(Learn-then-Test, {self.method} p-values, fixed-sequence testing)."
        )


def calibrate_threshold(
    thresholds: Sequence[float],
    losses: torch.Tensor,
    delta: float,
    epsilon: float,
    method: str = "hoeffding_bentkus",
) -> LTTResult:
    """Learn-then-Test: the smallest threshold of a descending grid whose risk is certified ``<= delta``.

    Args:
        thresholds: the grid, strictly descending (most conservative first).
        losses: ``(n, k)`` per-example losses in [0, 1]: column j is the loss of every calibration example when
            run with ``thresholds[j]``.
        delta: the tolerated risk δ; epsilon: the allowed failure probability ε.
        method: ``"hoeffding"`` or ``"hoeffding_bentkus"``.
    """
    if method not in P_VALUE_METHODS:
        raise ValueError(f"method must be one of {P_VALUE_METHODS}, got {method!r}.")
    thresholds = [float(t) for t in thresholds]
    if any(a <= b for a, b in zip(thresholds, thresholds[1:], strict=False)):
        raise ValueError(f"thresholds must be strictly descending (most conservative first), got {thresholds}.")
    losses = torch.as_tensor(losses, dtype=torch.float64)
    if losses.dim() != 2 or losses.shape[1] != len(thresholds):
        raise ValueError(
            f"losses must have shape (n, {len(thresholds)}) (one column per threshold), got {tuple(losses.shape)}."
        )
    n = losses.shape[0]
    risks = losses.mean(dim=0).tolist()
    p_value = hoeffding_p_value if method == "hoeffding" else hoeffding_bentkus_p_value
    p_values = [p_value(min(max(r, 0.0), 1.0), n, delta) for r in risks]
    rejected = fixed_sequence_test(p_values, epsilon)
    index = rejected - 1 if rejected else None
    return LTTResult(
        threshold=thresholds[index] if index is not None else None,
        index=index,
        thresholds=tuple(thresholds),
        risks=tuple(risks),
        p_values=tuple(p_values),
        delta=delta,
        epsilon=epsilon,
        n=n,
        method=method,
    )


__all__ = [
    "LTTResult",
    "P_VALUE_METHODS",
    "binomial_cdf",
    "calibrate_threshold",
    "fixed_sequence_test",
    "hoeffding_bentkus_p_value",
    "hoeffding_p_value",
    "rescale_risks",
    "rouge_l_f1",
    "token_disagreement",
]
