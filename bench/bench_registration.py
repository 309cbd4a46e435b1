"""Where registering with the Auto classes costs time: ``import tf_family``, then importing transformers' Auto classes,
``AutoConfig.from_pretrained(folder)`` and ``AutoModelForCausalLM.from_pretrained(folder)`` (a tiny Longformer saved
once), each phase timed inside one fresh interpreter; interleaved rounds, and with ``--before DIR`` another checkout in
the same rounds (issue 38 item 3: public registration instead of an import hook over transformers' private tables).

    python bench/bench_registration.py --rounds 3 --before /path/to/old/checkout
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import markdown_table, write_results  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
PHASES = (
    "import tf_family",
    "from transformers import AutoConfig, AutoModelForCausalLM",
    "AutoConfig.from_pretrained",
    "AutoModelForCausalLM.from_pretrained",
)
CHILD = """
import json, sys, time
marks = [time.perf_counter()]
import tf_family
marks.append(time.perf_counter())
from transformers import AutoConfig, AutoModelForCausalLM
marks.append(time.perf_counter())
config = AutoConfig.from_pretrained(sys.argv[1])
marks.append(time.perf_counter())
model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
marks.append(time.perf_counter())
assert type(model).__name__ == "TffLongformerForCausalLM", type(model)
print(json.dumps([later - earlier for earlier, later in zip(marks, marks[1:])]))
"""
SAVE = """
import sys, tf_family
from transformers import AutoModelForCausalLM
AutoModelForCausalLM.from_config(tf_family.get_arch("longformer").tiny_config()).save_pretrained(sys.argv[1])
"""


def _env(checkout: Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(checkout), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}


def run_once(checkout: Path, folder: Path) -> list[float]:
    """The seconds of each of `PHASES` in one fresh interpreter running against ``checkout``."""
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(folder)],
        env=_env(checkout),
        cwd=checkout,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", type=Path, help="another checkout to time in the same rounds")
    parser.add_argument("--name", default="startup_registration")
    args = parser.parse_args(argv)
    checkouts = {"now": REPO} if args.before is None else {"before": args.before.resolve(), "now": REPO}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "longformer_tiny"
        subprocess.run([sys.executable, "-c", SAVE, str(folder)], env=_env(REPO), check=True, capture_output=True)
        samples = {label: [] for label in checkouts}
        for round_index in range(args.rounds):
            labels = list(checkouts) if round_index % 2 == 0 else list(reversed(checkouts))
            for label in labels:
                samples[label].append(run_once(checkouts[label], folder))
    load_after = os.getloadavg()
    rows = []
    for label, runs in samples.items():
        medians = [statistics.median(run[index] for run in runs) for index in range(len(PHASES))]
        totals = [sum(run) for run in runs]
        rows.append([label, *(f"{value:.2f} s" for value in medians), f"{statistics.median(totals):.2f} s"])
    loaded = max(load_before[0], load_after[0]) > 1.0
    markdown = (
        "# Registration with the Auto classes: where the time goes\n\n"
        + (
            f"**Measured under load, not a result** (load average {load_before[0]:.1f} at the start, "
            f"{load_after[0]:.1f} at the end, on 2 cores).\n\n"
            if loaded
            else ""
        )
        + f"Each phase timed inside one fresh interpreter, {args.rounds} interleaved rounds, medians.\n\n"
        + markdown_table(["checkout", *PHASES, "total"], rows)
        + "\n\nCheckouts: "
        + ", ".join(f"{label} = `{path}`" for label, path in checkouts.items())
    )
    payload = {"rounds": args.rounds, "loadavg_start": load_before, "loadavg_end": load_after, "samples": samples}
    write_results(args.name, payload, markdown)
    print(markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
