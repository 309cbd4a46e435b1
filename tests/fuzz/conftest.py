import json

from tests.fuzz.outcomes import BY_SUITE, FAILURES, TALLY


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not TALLY["tried"]:
        return
    parts = ", ".join(f"{key} {TALLY[key]}" for key in ("tried", "clear_error", "accepted", "crash", "silent"))
    terminalreporter.write_line(f"fuzz inputs: {parts}")
    path = config.getoption("fuzz_report", None)
    if path:
        report = {
            "totals": {key: TALLY[key] for key in ("tried", "clear_error", "accepted", "crash", "silent")},
            "by_suite": {suite: dict(counts) for suite, counts in sorted(BY_SUITE.items())},
            "failures": FAILURES,
        }
        with open(path, "w") as f:
            json.dump(report, f, indent=2)
