"""Tally of what the fuzzing suite threw at tf_family and how each input ended.

Every fuzz test routes its call through :func:`expect_clear_error_or_ok`. An input ends in one of four ways:

- ``clear_error``: a ``ValueError``/``TypeError`` (or a subclass, e.g. ``FileNotFoundError`` is *not* one: it is
  accepted only where the test lists it in ``clear``) whose message names the offending argument/file;
- ``accepted``: the call returned and ``check`` found the result sound (finite, right shape, ...);
- ``crash``: any other exception, or a clear-looking error that does not name the problem;
- ``silent``: the call returned but ``check`` found the result unsound (NaN, wrong shape, a file read from outside
  its folder, ...).

Crashes and silent acceptances fail the test; the session tally is printed at the end of the run and written as JSON
with ``pytest --fuzz-report out.json`` (tests/fuzz/conftest.py).
"""

from __future__ import annotations

import collections
import traceback
from collections.abc import Callable, Iterable
from typing import Any

TALLY: collections.Counter = collections.Counter()
BY_SUITE: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
FAILURES: list[dict[str, str]] = []


class FuzzFailure(AssertionError):
    """A fuzzed input crashed or was accepted silently."""


def _record(suite: str, outcome: str, detail: str = "") -> None:
    TALLY["tried"] += 1
    TALLY[outcome] += 1
    BY_SUITE[suite]["tried"] += 1
    BY_SUITE[suite][outcome] += 1
    if outcome in ("crash", "silent"):
        FAILURES.append({"suite": suite, "outcome": outcome, "detail": detail[-2000:]})


def expect_clear_error_or_ok(
    call: Callable[[], Any],
    *,
    suite: str,
    names: Iterable[str],
    check: Callable[[Any], bool | None] | None = None,
    clear: tuple[type[BaseException], ...] = (ValueError, TypeError),
    describe: str = "",
) -> str:
    """Run ``call`` and classify the outcome; raise :class:`FuzzFailure` on a crash or a silent acceptance.

    ``names``: words of which at least one must appear in a clear error's message (the argument, field or file
    name). ``check``: called on the return value; returning ``False`` or raising marks the input as silently accepted.
    Returns the outcome's name.
    """
    names = [n for n in names if n]
    try:
        result = call()
    except clear as err:
        message = str(err)
        if names and not any(n.lower() in message.lower() for n in names):
            detail = f"{describe}: {type(err).__name__} does not name any of {names}: {message}"
            _record(suite, "crash", detail)
            raise FuzzFailure(detail) from err
        _record(suite, "clear_error")
        return "clear_error"
    except Exception as err:  # noqa: BLE001 - anything else is a crash by definition
        detail = f"{describe}: {type(err).__name__}: {err}\n{traceback.format_exc()}"
        _record(suite, "crash", detail)
        raise FuzzFailure(detail) from err
    if check is not None:
        try:
            sound = check(result)
        except Exception as err:  # noqa: BLE001
            detail = f"{describe}: accepted, and the result check raised {type(err).__name__}: {err}"
            _record(suite, "silent", detail)
            raise FuzzFailure(detail) from err
        if sound is False:
            detail = f"{describe}: accepted with an unsound result"
            _record(suite, "silent", detail)
            raise FuzzFailure(detail)
    _record(suite, "accepted")
    return "accepted"
