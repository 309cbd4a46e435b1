"""ALiBi slopes against the published vectors, and its bias."""

import math

import pytest
import torch

from tf_family.attention.alibi import alibi_bias, alibi_slopes


def test_slopes_of_powers_of_two():
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0**-k for k in range(1, 9)]))
    torch.testing.assert_close(alibi_slopes(4), torch.tensor([2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8]))
    torch.testing.assert_close(alibi_slopes(1), torch.tensor([2.0**-8]))


def test_slopes_of_twelve_heads_match_the_published_vector():
    """ofirpress/attention_with_linear_biases, issue #17: ``get_slopes(12)``."""
    published = [0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625]
    published += [0.7071067811865476, 0.35355339059327384, 0.17677669529663692, 0.08838834764831849]
    torch.testing.assert_close(alibi_slopes(12), torch.tensor(published))


def test_slopes_of_other_head_counts_follow_the_reference_rule():
    def get_slopes(n):  # the reference repository's function, transcribed
        def power_of_2(n):
            start = 2 ** (-(2 ** -(math.log2(n) - 3)))
            return [start * start**i for i in range(n)]

        if math.log2(n).is_integer():
            return power_of_2(n)
        closest = 2 ** math.floor(math.log2(n))
        return power_of_2(closest) + get_slopes(2 * closest)[0::2][: n - closest]

    for heads in (3, 5, 6, 7, 20, 24):
        torch.testing.assert_close(alibi_slopes(heads), torch.tensor(get_slopes(heads), dtype=torch.float32))


def test_bias_is_minus_slope_times_distance():
    slopes = alibi_slopes(2)
    positions = torch.arange(4)[None]
    bias = alibi_bias(slopes, positions, positions)
    assert bias.shape == (1, 2, 4, 4)
    assert bias[0, 0, 3, 1].item() == pytest.approx(-slopes[0].item() * 2)
    assert bias[0, 1, 2, 2].item() == 0.0


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_slopes_refuse_bad_head_counts(bad):
    with pytest.raises(ValueError, match="num_heads"):
        alibi_slopes(bad)
