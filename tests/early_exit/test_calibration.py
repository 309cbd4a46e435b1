"""Learn-then-Test: p-values by hand, fixed-sequence testing, and the guarantee on synthetic risks."""

import math

import pytest
import torch

from tf_family.early_exit import (
    binomial_cdf,
    calibrate_threshold,
    fixed_sequence_test,
    hoeffding_bentkus_p_value,
    hoeffding_p_value,
    rescale_risks,
    rouge_l_f1,
    token_disagreement,
)


def test_hoeffding_by_hand():
    assert hoeffding_p_value(0.05, 100, 0.1) == pytest.approx(math.exp(-2 * 100 * 0.05**2))
    assert hoeffding_p_value(0.2, 100, 0.1) == 1.0


def test_binomial_cdf_by_hand():
    assert binomial_cdf(1, 3, 0.5) == pytest.approx(0.5)  # (1 + 3) / 8
    assert binomial_cdf(0, 4, 0.1) == pytest.approx(0.9**4)
    assert binomial_cdf(-1, 4, 0.1) == 0.0 and binomial_cdf(4, 4, 0.1) == 1.0


def test_hoeffding_bentkus_by_hand():
    n, delta, risk = 50, 0.2, 0.1
    h = risk * math.log(risk / delta) + (1 - risk) * math.log((1 - risk) / (1 - delta))
    bentkus = math.e * sum(math.comb(n, i) * delta**i * (1 - delta) ** (n - i) for i in range(0, 6))
    assert hoeffding_bentkus_p_value(risk, n, delta) == pytest.approx(min(math.exp(-n * h), bentkus))
    # never larger than Hoeffding's bound on the same data (HB is the tighter bound here)
    assert hoeffding_bentkus_p_value(risk, n, delta) <= hoeffding_p_value(risk, n, delta)
    with pytest.raises(ValueError, match="delta"):
        hoeffding_bentkus_p_value(0.1, 10, 1.5)


def test_fixed_sequence_stops_at_the_first_failure():
    assert fixed_sequence_test([0.01, 0.02, 0.2, 0.01], 0.05) == 2
    assert fixed_sequence_test([0.5, 0.01], 0.05) == 0


def test_consistency_losses():
    assert token_disagreement([1, 2, 3, 4], [1, 2, 0, 4]) == 0.25
    assert token_disagreement([1, 2], [1, 2, 3, 4]) == 0.5
    assert rouge_l_f1([1, 2, 3, 4], [1, 3, 4, 5]) == pytest.approx(0.75)  # LCS 1 3 4
    assert rouge_l_f1([1, 2], [1, 2]) == 1.0 and rouge_l_f1([1], [2]) == 0.0
    torch.testing.assert_close(
        rescale_risks(torch.tensor([-1.0, 0.0, 1.0]), -1, 1), torch.tensor([0, 0.5, 1.0]).double()
    )


def _synthetic_losses(n: int, thresholds: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Bernoulli losses whose true risk at threshold λ is ``0.4 (1 - λ)`` (lower thresholds exit more, err more);
    losses are monotone in λ per example, as a real early-exit model's are."""
    u = torch.rand(n, 1, generator=generator, dtype=torch.float64)
    return (u < 0.4 * (1 - thresholds[None, :])).double()  # (n, k)


def test_calibration_returns_the_smallest_certified_threshold():
    thresholds = torch.linspace(1.0, 0.0, 21, dtype=torch.float64)
    losses = _synthetic_losses(2000, thresholds, torch.Generator().manual_seed(0))
    result = calibrate_threshold(thresholds.tolist(), losses, delta=0.1, epsilon=0.05)
    # true risk 0.4 (1 - λ) <= 0.1 needs λ >= 0.75; with 2000 samples the certified one lies just above
    assert result.threshold is not None and 0.75 <= result.threshold <= 0.9
    assert result.p_values[result.index] <= 0.05 and result.p_values[result.index + 1] > 0.05
    assert "0.1" in result.guarantee()
    nothing = calibrate_threshold([0.9, 0.5], torch.ones(10, 2), delta=0.1, epsilon=0.05)
    assert nothing.threshold is None and "full depth" in nothing.guarantee()
    with pytest.raises(ValueError, match="descending"):
        calibrate_threshold([0.5, 0.9], torch.zeros(10, 2), delta=0.1, epsilon=0.05)


@pytest.mark.parametrize("method", ["hoeffding", "hoeffding_bentkus"])
def test_violation_rate_over_random_splits_stays_below_epsilon(method):
    """Draw many calibration sets; the test risk (the true risk, known here) of the returned threshold exceeds δ in
    at most an ε fraction of draws (plus binomial slack of the 400 trials)."""
    thresholds = torch.linspace(1.0, 0.0, 41, dtype=torch.float64)
    true_risk = 0.4 * (1 - thresholds)
    delta, epsilon, trials = 0.1, 0.1, 400
    generator = torch.Generator().manual_seed(1)
    violations, certified = 0, 0
    for _ in range(trials):
        result = calibrate_threshold(
            thresholds.tolist(), _synthetic_losses(200, thresholds, generator), delta, epsilon, method
        )
        if result.threshold is not None:
            certified += 1
            violations += bool(true_risk[result.index] > delta)
    assert certified > trials // 2  # the procedure is not trivially conservative
    # the rate must stay <= ε; 3 standard deviations of a binomial at ε absorb the draw
    assert violations / trials <= epsilon + 3 * math.sqrt(epsilon * (1 - epsilon) / trials)
