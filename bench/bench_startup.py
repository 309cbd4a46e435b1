"""Start-up time: ``import tf_family``, ``tf-family --help`` and ``tf-family list`` (issue 31's targets: 2 s, 1.5 s,
1.5 s), each in a fresh interpreter, wall and CPU time, interleaved over rounds; with ``--before DIR`` the same
commands run against another checkout (e.g. the code before the lazy imports) in the same rounds.

Also records ``python -X importtime -c "import tf_family"``: the cumulative import time of ``tf_family`` and the
slowest imports under it.

    python bench/bench_startup.py --rounds 7 --before /path/to/old/checkout
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import markdown_table, write_results  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
COMMANDS = {
    "import tf_family": ["-c", "import tf_family"],
    "tf-family --help": ["-c", "import sys; from tf_family.cli import main; sys.exit(main())", "--help"],
    "tf-family list": ["-c", "import sys; from tf_family.cli import main; sys.exit(main())", "list"],
}
TARGETS_S = {"import tf_family": 2.0, "tf-family --help": 1.5, "tf-family list": 1.5}


def run_once(checkout: Path, args: list[str]) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of one fresh interpreter running ``args`` against ``checkout``."""
    env = {**os.environ, "PYTHONPATH": str(checkout), "HF_HUB_OFFLINE": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, *args],
        env=env,
        cwd=checkout,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return round(wall, 4), round(cpu, 4)


def import_profile(checkout: Path, top: int = 8) -> dict:
    """``-X importtime`` of ``import tf_family``: its cumulative microseconds and the ``top`` slowest imports."""
    env = {**os.environ, "PYTHONPATH": str(checkout), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import tf_family"],
        env=env,
        cwd=checkout,
        capture_output=True,
        text=True,
    )
    rows = []  # (name with its nesting indent, self us, cumulative us)
    for line in result.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        self_part, cumulative, name = line.split("|", 2)
        rows.append((name[1:].rstrip(), int(self_part.split(":")[1]), int(cumulative)))
    total = next((cumulative for name, _, cumulative in rows if name == "tf_family"), None)
    top_level = sorted((row for row in rows if not row[0].startswith(" ")), key=lambda row: -row[2])[:top]
    return {
        "tf_family_cumulative_s": None if total is None else total / 1e6,
        "modules_imported": len(rows),
        "slowest_top_level": [{"module": name, "cumulative_s": cumulative / 1e6} for name, _, cumulative in top_level],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--before", type=Path, help="another checkout to time in the same rounds")
    parser.add_argument("--name", default="startup")
    args = parser.parse_args(argv)
    checkouts = {"now": REPO}
    if args.before is not None:
        checkouts = {"before": args.before.resolve(), "now": REPO}
    for checkout in checkouts.values():  # warm the page cache and __pycache__
        for command in COMMANDS.values():
            run_once(checkout, command)
    samples = {(label, name): {"wall_s": [], "cpu_s": []} for label in checkouts for name in COMMANDS}
    order = [(label, name) for name in COMMANDS for label in checkouts]
    for round_index in range(args.rounds):
        for label, name in order if round_index % 2 == 0 else reversed(order):
            wall, cpu = run_once(checkouts[label], COMMANDS[name])
            samples[label, name]["wall_s"].append(wall)
            samples[label, name]["cpu_s"].append(cpu)
    profiles = {label: import_profile(checkout) for label, checkout in checkouts.items()}
    rows, results = [], []
    for name in COMMANDS:
        for label in checkouts:
            wall = statistics.median(samples[label, name]["wall_s"])
            cpu = statistics.median(samples[label, name]["cpu_s"])
            met = "met" if wall <= TARGETS_S[name] else "not met"
            rows.append(
                [
                    name,
                    label,
                    f"{wall:.2f} s",
                    f"{min(samples[label, name]['wall_s']):.2f} s",
                    f"{cpu:.2f} s",
                    f"{TARGETS_S[name]} s ({met})",
                ]
            )
            results.append({"command": name, "checkout": label, "target_s": TARGETS_S[name], **samples[label, name]})
    profile_rows = [
        [
            label,
            f"{profile['tf_family_cumulative_s']:.3f} s",
            profile["modules_imported"],
            ", ".join(f"{row['module']} {row['cumulative_s']:.2f} s" for row in profile["slowest_top_level"][:4]),
        ]
        for label, profile in profiles.items()
    ]
    markdown = (
        f"# Start-up time\n\nFresh interpreter per call, {args.rounds} interleaved rounds; medians (wall and CPU = "
        "user + system of the child), and the fastest wall time.\n\n"
        + markdown_table(["command", "checkout", "wall (median)", "wall (min)", "CPU (median)", "target"], rows)
        + '\n\n`python -X importtime -c "import tf_family"`:\n\n'
        + markdown_table(
            ["checkout", "tf_family cumulative", "modules imported", "slowest top-level imports"], profile_rows
        )
        + "\n\nCheckouts: "
        + ", ".join(f"{label} = `{path}`" for label, path in checkouts.items())
    )
    write_results(args.name, {"rounds": args.rounds, "results": results, "importtime": profiles}, markdown)
    print(markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
