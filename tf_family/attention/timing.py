"""Timing two or more ways of computing the same thing against each other, interleaved, for the dispatches that
choose by measurement (`native.calibrate`, on request; `tf_family.layers.adaptive_kernels.measure`, on request)."""

from __future__ import annotations

import time
from collections.abc import Callable


def interleaved_times(
    paths: dict[str, Callable[[], object]], rounds: int, after_each: Callable[[], None] | None = None
) -> tuple[dict[str, list[float]], dict[str, object]]:
    """Run every path once to warm up, then ``rounds`` rounds, the order reversed every other round (so that neither
    path always runs on a cache the other warmed); ``after_each`` runs after every timed call, untimed. Returns the
    seconds of each path's timed calls and each path's last result."""
    times: dict[str, list[float]] = {name: [] for name in paths}
    results = {name: path() for name, path in paths.items()}
    for round_index in range(rounds):
        for name in paths if round_index % 2 == 0 else reversed(paths):
            started = time.perf_counter()
            results[name] = paths[name]()
            times[name].append(time.perf_counter() - started)
            if after_each is not None:
                after_each()
    return times, results
