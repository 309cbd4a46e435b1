"""The result row every measurement writes, and the rows of several seeds folded into one.

A row is ``{"section", "model", "metric", "setting", "value", "unit", ...}`` (plus ``seed``, ``status``,
``documents`` where they apply): the shape of ``compare.json`` and ``compare.csv``, which scripts read. Runs with
several seeds keep one row per seed; the report's tables and plots show their mean and spread (`fold_seeds`).
"""

from __future__ import annotations

import statistics
from typing import Any


def row(section: str, model: str, metric: str, value: Any, unit: str = "", setting: str = "", **extra) -> dict:
    return {
        "section": section,
        "model": model,
        "metric": metric,
        "setting": setting,
        "value": value,
        "unit": unit,
        **extra,
    }


def fold_seeds(rows: list[dict]) -> list[dict]:
    """One row per (section, model, metric, setting): the mean of the seeds' numeric values, with ``spread`` (half
    the range) and ``seeds`` (how many) where more than one seed measured it; a non-numeric row stays as it is."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["section"], r["model"], r["metric"], r["setting"]), []).append(r)
    folded = []
    for group in groups.values():
        values = [
            r["value"] for r in group if isinstance(r["value"], int | float) and not isinstance(r["value"], bool)
        ]
        first = {k: v for k, v in group[0].items() if k != "seed"}
        if len(values) > 1:
            mean = statistics.fmean(values)
            if all(isinstance(v, int) for v in values) and mean == int(mean):
                mean = int(mean)
            first.update(value=mean, spread=(max(values) - min(values)) / 2, seeds=len(values))
        folded.append(first)
    return folded


__all__ = ["fold_seeds", "row"]
