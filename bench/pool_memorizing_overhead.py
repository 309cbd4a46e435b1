"""Pool the kNN-layer overhead rounds of several `bench_memorizing.py --parts overhead` runs.

A single run's ratio moves by several points on a shared machine; pooling the per-round ratios of runs that alternate
two versions of the code compares them on the same stretch of time. Each argument is ``label=glob`` (the JSON
results of one version's runs), e.g.

    python bench/pool_memorizing_overhead.py "now=results/memorizing_overhead_ab_now_*.json" \\
        "before=results/memorizing_overhead_ab_before_*.json" --name memorizing_overhead_pooled

prints the table and writes ``results/<name>.{json,md}``.
"""

from __future__ import annotations

import argparse
import glob
import json
import statistics

from common import markdown_table, write_results

XL = "Transformer-XL (no kNN layer)"


def quartiles(values: list[float]) -> tuple[float, float, float]:
    ordered = sorted(values)
    return ordered[len(ordered) // 4], statistics.median(ordered), ordered[(3 * len(ordered)) // 4]


def pool(pattern: str, model: str) -> dict:
    paths = sorted(glob.glob(pattern))
    if not paths:
        raise SystemExit(f"no results match {pattern!r}")
    pooled: dict = {"files": paths, "xl": [], "ratios": {}, "steps": {}, "search": {}, "floor": {}}
    for path in paths:
        with open(path) as file:
            times = json.load(file)["overhead"]["models"][model]["times_s"]
        pooled["xl"] += times[XL]
        for label, values in times.items():
            if label.startswith("kNN layer, "):
                size = int(label.split()[2])
                pooled["ratios"].setdefault(size, []).extend(v / x - 1 for v, x in zip(values, times[XL], strict=True))
                pooled["steps"].setdefault(size, []).extend(values)
            elif label.startswith("search ") and label.endswith("exact top-k"):
                pooled["search"].setdefault(int(label.split()[1].rstrip(":")), []).extend(values)
            elif label.startswith("search floor "):
                pooled["floor"].setdefault(int(label.split()[2].rstrip(":")), []).extend(values)
    return pooled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("versions", nargs="+", help="label=glob of one version's JSON results")
    parser.add_argument("--model", default="larger")
    parser.add_argument("--name", default="memorizing_overhead_pooled")
    args = parser.parse_args()
    rows, payload = [], {}
    for version in args.versions:
        label, pattern = version.split("=", 1)
        pooled = payload[label] = pool(pattern, args.model)
        for size in sorted(pooled["ratios"]):
            low, median, high = quartiles(pooled["ratios"][size])
            rows.append([
                label, len(pooled["files"]), len(pooled["ratios"][size]), size,
                f"{median * 100:+.1f} % ({low * 100:+.1f} .. {high * 100:+.1f})",
                f"{statistics.median(pooled['xl']):.3f} / {statistics.median(pooled['steps'][size]):.3f} s",
                f"{statistics.median(pooled['search'][size]) * 1e3:.0f} ms ({statistics.median(pooled['floor'][size]) * 1e3:.0f} ms)",
            ])  # fmt: skip
    markdown = f"### kNN-layer overhead, pooled rounds (model `{args.model}`)\n\n" + markdown_table(
        [
            "code",
            "runs",
            "rounds",
            "entries",
            "median of per-round ratios (quartiles)",
            "XL / kNN step (medians)",
            "exact search alone (floor)",
        ],  # fmt: skip
        rows,
    )
    print(markdown)
    write_results(args.name, {"versions": payload}, markdown)


if __name__ == "__main__":
    main()
