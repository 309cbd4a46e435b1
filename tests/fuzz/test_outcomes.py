import pytest

from tests.fuzz import outcomes
from tests.fuzz.outcomes import FuzzFailure, expect_clear_error_or_ok


@pytest.fixture(autouse=True)
def _keep_the_session_tally():
    # this file tests the classifier itself: its deliberate crashes must not count in the suite's report
    saved = (outcomes.TALLY.copy(), {k: v.copy() for k, v in outcomes.BY_SUITE.items()}, list(outcomes.FAILURES))
    yield
    outcomes.TALLY.clear()
    outcomes.TALLY.update(saved[0])
    outcomes.BY_SUITE.clear()
    outcomes.BY_SUITE.update(saved[1])
    outcomes.FAILURES[:] = saved[2]


def _raise(err):
    raise err


def test_classifies_the_four_outcomes():
    assert expect_clear_error_or_ok(lambda: 1, suite="self", names=["x"], check=lambda r: r == 1) == "accepted"
    assert expect_clear_error_or_ok(lambda: _raise(ValueError("bad x=3")), suite="self", names=["x="]) == "clear_error"
    with pytest.raises(FuzzFailure, match="does not name"):
        expect_clear_error_or_ok(lambda: _raise(ValueError("bad")), suite="self", names=["width"])
    with pytest.raises(FuzzFailure, match="KeyError"):
        expect_clear_error_or_ok(lambda: _raise(KeyError("shards")), suite="self", names=["shards"])
    with pytest.raises(FuzzFailure, match="unsound"):
        expect_clear_error_or_ok(lambda: float("nan"), suite="self", names=["x"], check=lambda r: r == r)
