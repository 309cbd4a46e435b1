"""Small benchmark harness shared by the scripts in ``bench/``.

Method (see ``bench/README.md``): 2 threads with ``OMP_WAIT_POLICY=PASSIVE`` (the machine is shared; OpenMP's
default spin-waiting makes 2-thread ops several times slower whenever a co-tenant holds a core), one warm-up call,
then at least 3 timed repeats; tables report the median and the min, ratios are taken from medians of the same run.
Every repeat's time goes to ``bench/results/<name>.json``; the medians go to ``bench/results/<name>.md``.

Call `setup_threads()` *before* importing torch: OpenMP reads its environment once, when torch loads.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"
DATA_DIR = BENCH_DIR / "data"


def setup_threads(threads: int = 2) -> None:
    """Passive OpenMP waiting and ``threads`` intra-op threads (1 inter-op thread); freed memory kept as the CLI and
    the recipes keep it (`tf_family.allocator`; ``TF_FAMILY_KEEP_FREED_MEMORY=0`` measures glibc's defaults). The
    result files record which allocator ran."""
    module = _allocator_module()
    if module is not None:
        module.keep_freed_memory()
    if "torch" in sys.modules and os.environ.get("OMP_WAIT_POLICY", "").upper() != "PASSIVE":
        print("warning: torch was imported before setup_threads(); OMP_WAIT_POLICY=PASSIVE has no effect", flush=True)
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    os.environ.setdefault("MKL_NUM_THREADS", str(threads))
    import torch

    torch.set_num_threads(threads)
    with contextlib.suppress(RuntimeError):  # already set, or inter-op work already started
        torch.set_num_interop_threads(1)


def loadavg() -> list[float]:
    """1, 5 and 15-minute load averages (empty where /proc is missing)."""
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []


@dataclass
class Timing:
    """Wall-clock times of one measured callable; `times_s` excludes the warm-up."""

    times_s: list[float]
    warmup_s: float
    flag: str | None = None
    loadavg_end: list[float] = field(default_factory=loadavg)

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)

    @property
    def min_s(self) -> float:
        return min(self.times_s)

    def to_dict(self) -> dict:
        return {**asdict(self), "median_s": self.median_s, "min_s": self.min_s, "n": len(self.times_s)}


def time_callable(
    fn: Callable[[], object], repeats: int = 3, max_repeats: int = 10, min_total_s: float = 5.0, cap_s: float = 120.0
) -> Timing:
    """One warm-up call, then ``repeats`` timed calls, more (up to ``max_repeats``) while their total stays under
    ``min_total_s``. If ``repeats`` calls would not fit in ``cap_s`` (judged from the warm-up), fewer are made, at
    least one, and the result is flagged."""
    start = time.perf_counter()
    fn()
    warmup = time.perf_counter() - start
    wanted = max(1, min(repeats, int(cap_s / max(warmup, 1e-9))))
    times: list[float] = []
    while len(times) < max_repeats:
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
        if len(times) >= wanted and sum(times) >= min_total_s:
            break
        if len(times) >= wanted and sum(times) + times[-1] > cap_s:
            break
    flag = f"n={len(times)} (cap {cap_s:.0f} s)" if len(times) < repeats else None
    return Timing(times_s=[round(t, 5) for t in times], warmup_s=round(warmup, 5), flag=flag)


def time_interleaved(steps: dict[str, Callable[[], object]], rounds: int, warmups: int = 2) -> dict[str, list[float]]:
    """``warmups`` calls of each step, then ``rounds`` rounds of one call of each, alternating (the order reversed
    every other round): a shared machine's drift hits every step alike. Returns each step's times in seconds."""
    for step in steps.values():
        for _ in range(warmups):
            step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    names = list(steps)
    for round_index in range(rounds):
        for name in names if round_index % 2 == 0 else reversed(names):
            start = time.perf_counter()
            steps[name]()
            times[name].append(round(time.perf_counter() - start, 5))
    return times


def _allocator_module():
    """This checkout's ``tf_family/allocator.py`` (standard library only), loaded by path: a worker of another
    environment (transformers 4.35.2) sets and reports the same allocator without importing tf_family."""
    if "_bench_allocator" not in sys.modules:
        path = BENCH_DIR.parent / "tf_family" / "allocator.py"
        if not path.is_file():  # a checkout from before the allocator setting
            return None
        spec = importlib.util.spec_from_file_location("_bench_allocator", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["_bench_allocator"] = module
        spec.loader.exec_module(module)
    return sys.modules["_bench_allocator"]


def allocator() -> str:
    """Which allocator this process runs (`tf_family.allocator.describe`)."""
    module = _allocator_module()
    return "system malloc, defaults" if module is None else module.describe()


def machine_info() -> dict:
    """CPU, core count, versions, threads and load: what a reader needs to compare two result files."""
    import torch

    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "loadavg": loadavg(),
        "allocator": allocator(),
    }
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    return info


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def write_results(name: str, payload: dict, markdown: str) -> tuple[Path, Path]:
    """Write ``results/<name>.json`` (payload plus machine, command and date) and ``results/<name>.md``."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    record = {
        "name": name,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python", *sys.argv]),
        "machine": machine_info(),
        **payload,
    }
    json_path, md_path = RESULTS_DIR / f"{name}.json", RESULTS_DIR / f"{name}.md"
    json_path.write_text(json.dumps(record, indent=2) + "\n")
    machine = record["machine"]
    footer = (
        f"\n\n{machine['cpu']}, {machine['cores']} cores, torch {machine['torch']} ({machine['torch_threads']} "
        f"threads, OMP_WAIT_POLICY={machine['omp_wait_policy']}), {machine['allocator']}, loadavg "
        f"{machine['loadavg']}, {record['date']}.\n"
        f"Command: `{record['command']}`\n"
    )
    md_path.write_text(markdown.rstrip() + footer)
    return json_path, md_path


def format_seconds(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"
