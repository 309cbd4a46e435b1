"""The allocator setting (`tf_family.allocator`) before and after: the main job and one recipe per family, each run
under ``/usr/bin/time -v`` with glibc's defaults (``TF_FAMILY_KEEP_FREED_MEMORY=0``) and with freed memory kept
(the default), interleaved (the order alternates every round). Records minor page faults, system and user time, wall
time and peak memory (maximum resident set size) per run; the table gives medians and after/before ratios.

    python bench/bench_allocator.py --rounds 2 --steps 40
    python bench/bench_allocator.py --jobs main,longformer --rounds 3 --steps 60

The machine may be shared: the load average at each run's end is recorded beside it.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import loadavg, markdown_table, write_results  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TIME = "/usr/bin/time"


def jobs(steps: int) -> dict[str, tuple[str, list[str]]]:
    """name -> (family, command after ``python -m``); ``--output_dir`` is appended per run."""
    train = ["tf_family.cli", "train", "--max_train_steps", str(steps), "--logging_steps", str(max(1, steps // 2))]
    return {
        # the main job: `tf-family train` (Transformer-XL small, pre-LN, 128-token segments, batch 8)
        "main": ("segment memory (main job)", train),
        "compressive": ("segment memory", [*train, "--arch", "compressive", "--variant", "small"]),
        "longformer": (
            "sparse attention",
            [*train, "--arch", "longformer", "--variant", "small", "--block_size", "1024"],
        ),
        "big_bird": (
            "sparse attention",
            [
                "tf_family.recipes.masked_lm",
                "--arch",
                "big_bird",
                "--variant",
                "small",
                "--max_train_steps",
                str(steps),
                "--per_device_train_batch_size",
                "4",
            ],
        ),
        "reformer": ("LSH attention", [*train, "--arch", "reformer", "--variant", "small", "--block_size", "1024"]),
        "calm": ("early exit", [*train, "--arch", "calm", "--variant", "small"]),
        "decision_transformer": (
            "offline RL",
            [
                "tf_family.recipes.decision_transformer",
                "--env_id",
                "CartPole-v1",
                "--dataset_steps",
                "3000",
                "--max_train_steps",
                str(steps),
                "--eval_episodes",
                "1",
                "--no_plot",
            ],
        ),
    }


_FIELDS = {
    "minor_page_faults": r"Minor \(reclaiming a frame\) page faults: (\d+)",
    "system_s": r"System time \(seconds\): ([\d.]+)",
    "user_s": r"User time \(seconds\): ([\d.]+)",
    "max_rss_mb": r"Maximum resident set size \(kbytes\): (\d+)",
    "wall_s": r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)",
}


def _seconds(clock: str) -> float:
    parts = [float(part) for part in clock.split(":")]
    return sum(part * 60**power for power, part in enumerate(reversed(parts)))


def run_job(command: list[str], keep: bool, workdir: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    env["TF_FAMILY_KEEP_FREED_MEMORY"] = "1" if keep else "0"
    output = Path(tempfile.mkdtemp(dir=workdir))
    result = subprocess.run(
        [TIME, "-v", sys.executable, "-m", *command, "--output_dir", str(output)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        return {"error": result.stderr[-2000:], "loadavg_end": loadavg()}
    record = {}
    for name, pattern in _FIELDS.items():
        value = re.search(pattern, result.stderr).group(1)
        record[name] = _seconds(value) if name == "wall_s" else float(value)
    record["max_rss_mb"] = round(record["max_rss_mb"] / 1024, 1)
    record["loadavg_end"] = loadavg()
    return record


def _cell(before: dict, after: dict, key: str, digits: int = 1) -> str:
    ratio = after[key] / before[key] if before[key] else float("nan")
    return f"{before[key]:,.{digits}f} → {after[key]:,.{digits}f} ({ratio:.2f}×)"


def report(args: argparse.Namespace, table: dict, names: list[str], runs: dict) -> str:
    """Write the results so far (``results/<name>.json`` and ``.md``) and return the Markdown."""
    rows = []
    for name in names:
        errors = runs[name].get("errors", [])
        if not runs[name]["before"] and not runs[name]["after"] and not errors:
            continue  # not reached yet
        if not runs[name]["before"] or not runs[name]["after"]:
            why = "cut short"
            if errors:
                lines = [line for line in errors[-1]["error"].strip().splitlines() if line.strip()]
                why = "failed: " + (lines[-1][:120] if lines else "no output").replace("|", "/")
            rows.append([name, table[name][0], f"{why} (see the JSON)", "", "", "", ""])
            continue
        before = {key: statistics.median(run[key] for run in runs[name]["before"]) for key in _FIELDS}
        after = {key: statistics.median(run[key] for run in runs[name]["after"]) for key in _FIELDS}
        cell = functools.partial(_cell, before, after)
        rows.append(
            [
                name,
                table[name][0],
                cell("minor_page_faults", 0),
                cell("system_s"),
                cell("user_s"),
                cell("wall_s"),
                cell("max_rss_mb", 0),
            ]
        )
    markdown = (
        f"# Allocator: glibc defaults → freed memory kept\n\n{args.steps} training steps per run, {args.rounds} "
        "interleaved rounds (the order alternates); medians, before → after (after/before). Before: "
        "`TF_FAMILY_KEEP_FREED_MEMORY=0` (glibc malloc, defaults); after: the default (glibc malloc, "
        "M_MMAP_THRESHOLD = M_TRIM_THRESHOLD = 2 GiB, M_TOP_PAD = 1 GiB, set by mallopt at start-up). Each run "
        "includes its start-up and data preparation. The machine was shared with other work (load average per run "
        "in the JSON).\n\n"
        + markdown_table(
            [
                "job",
                "family",
                "minor page faults",
                "system time (s)",
                "user time (s)",
                "wall time (s)",
                "peak RSS (MB)",
            ],
            rows,
        )
    )
    allocators = {
        "before": "glibc malloc, defaults (TF_FAMILY_KEEP_FREED_MEMORY=0)",
        "after": "glibc malloc, freed memory kept (tf_family.allocator.SETTINGS, set by mallopt at start-up)",
    }
    payload = {"steps": args.steps, "rounds": args.rounds, "allocators": allocators, "runs": runs}
    write_results(args.name, {**payload, "commands": {n: table[n][1] for n in names}}, markdown)
    return markdown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40, help="training steps of each run")
    parser.add_argument("--jobs", default=",".join(jobs(1)), help="comma-separated, of: " + ", ".join(jobs(1)))
    parser.add_argument("--name", default="allocator")
    args = parser.parse_args(argv)
    table = jobs(args.steps)
    names = [name.strip() for name in args.jobs.split(",") if name.strip()]
    unknown = [name for name in names if name not in table]
    if unknown:
        raise ValueError(f"--jobs: unknown {unknown}; choose from {list(table)}.")
    runs: dict[str, dict[str, list[dict]]] = {name: {"before": [], "after": [], "errors": []} for name in names}
    with tempfile.TemporaryDirectory() as workdir:
        for round_index in range(args.rounds):
            for name in names:
                order = (False, True) if (round_index + names.index(name)) % 2 == 0 else (True, False)
                for keep in order:
                    record = run_job(table[name][1], keep, Path(workdir))
                    if "error" in record:  # kept in the results: a job that fails gets a row saying so
                        print(name, "failed:", record["error"], flush=True)
                        runs[name]["errors"].append(record)
                        break
                    runs[name]["after" if keep else "before"].append(record)
                    print(name, "kept" if keep else "default", record, flush=True)
                report(args, table, names, runs)  # after every job: a cut-short run keeps what it measured
    print(report(args, table, names, runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
