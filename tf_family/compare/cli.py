"""`tf-family compare`: the family side by side on one corpus, against dense baselines, in one command.

    tf-family compare --quick                                  # a stated subset of the family, about 15 min on 2 CPUs
    tf-family compare --archs transfo_xl memorizing --tokens 2000000 --output_dir runs/compare
    tf-family compare --device cuda --dry-run                  # the one-GPU grid: what would run, nothing run
    python -m tf_family.compare --train_file my.txt --validation_file held_out.txt --minutes 5

Reads top to bottom: arguments and settings (`tf_family.compare.presets`) -> the grid of cells (one model x one
measurement x one seed each; `tf_family.compare.grid`) -> run every cell not already cached, with a progress bar over
the whole grid -> the report (`tf_family.compare.report`).

Who: every architecture of the registry with a causal-LM head (``--archs``; `tf_family.compare.family`), each built
with one shared shape and trained by the causal-LM recipe on the same data for the same optimizer steps of the same
tokens, and a dense baseline, transformers' ``LlamaForCausalLM`` with SDPA, of the same width and depth, its
feed-forward width chosen so that its parameter count is nearest the family's median. A model built around a base
model's config (the kNN-LM) is that baseline's trained weights plus a datastore of training tokens. Encoders (every
architecture with a bidirectional sequence-classification head, ``--encoders``, and transformers' RoBERTa as their
dense baseline) are trained by the sequence-classification recipe on the Long Range Arena's five tasks made here
(`tf_family.compare.lra`) and on the Brown genres. ``--quick`` takes one causal model per group and the first
encoders when no ``--archs`` / ``--encoders`` are given, and says so in its report.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from .data import ENCODER_TASKS
from .family import causal_archs, encoder_archs, group_of
from .presets import DEFAULT, GPU, QUICK

MEASURES = ("perplexity", "passkey", "cost")
DEVICES = ("cpu", "cuda")
MAX_DEFAULT_JOBS = 8  # each process holds its own torch and data (about 1 GB)


def default_jobs(device: str) -> int:
    """``--jobs`` when not given: on CPU one process per core this process may run on, at most `MAX_DEFAULT_JOBS` (the
    grid's models are small: processes side by side keep the cores busier than threads in one; the guide's Budgets
    section has the timings); on a GPU one, which holds the device."""
    if device == "cuda":
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, MAX_DEFAULT_JOBS))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tf-family compare",
        description="The family side by side on one corpus against dense baselines: perplexity by position, "
        "passkey retrieval, training and decoding cost, encoders on the Long Range Arena's tasks and Brown genres.",
    )
    parser.add_argument(
        "--quick", action="store_true", help="small sizes, a stated subset of the family (about 15 min on 2 CPU cores)"
    )
    parser.add_argument(
        "--archs", nargs="*", help="causal models of the registry (default: all, or --quick's subset; none: skip)"
    )
    parser.add_argument("--encoders", nargs="*", help="encoders of the registry (default: all; none: skip)")
    parser.add_argument("--no_baseline", action="store_true", help="leave the dense baselines out")
    parser.add_argument("--measures", nargs="+", default=list(MEASURES), choices=MEASURES)
    parser.add_argument(
        "--encoder_tasks", nargs="*", choices=ENCODER_TASKS, help="default: the preset's (--quick: listops, text)"
    )
    parser.add_argument("--tokens", type=int, help="training tokens per causal model (the same for each)")
    parser.add_argument("--minutes", type=float, help="training minutes per causal model instead of --tokens")
    parser.add_argument("--train_file", help="training text (.txt/.json/.jsonl/.csv/.parquet; default: bundled SOTU)")
    parser.add_argument("--validation_file", help="held-out text: its longest documents are the perplexity set")
    parser.add_argument("--text_column")
    parser.add_argument("--output_dir", default="runs/compare", help="report, tables, plots and the cell cache")
    parser.add_argument("--seed", type=int, help="one seed instead of the preset's seeds")
    parser.add_argument(
        "--device", choices=DEVICES, help="default: cuda when a GPU is present; cuda alone picks the one-GPU grid"
    )
    parser.add_argument("--cpu", action="store_true", help="the same as --device cpu")
    parser.add_argument(
        "--jobs",
        type=int,
        help="processes that run cells side by side from one shared queue, each with its share of the CPU threads (a "
        "model's training and its measures stay in one process); default: one per CPU core this process may use (at "
        f"most {MAX_DEFAULT_JOBS}) on CPU, 1 on a GPU",
    )
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)  # set by --jobs for its processes
    parser.add_argument("--dry_run", "--dry-run", action="store_true", help="print the grid and its cells; run none")
    parser.add_argument(
        "--report_only",
        action="store_true",
        help="write the report from the cells cached so far, running none (e.g. while another run fills the grid)",
    )
    parser.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help=f"change a setting of the grid (JSON values), e.g. width=128 'train_lengths=[512,1024]'; keys: "
        f"{sorted(QUICK)}",
    )
    parser.add_argument(
        "--config_overrides",
        nargs="*",
        default=[],
        metavar="ARCH:KEY=VALUE",
        help="a config field of one architecture, e.g. longformer:attention_window=64",
    )
    return parser


def _device(args: argparse.Namespace) -> str:
    if args.cpu and args.device not in (None, "cpu"):
        raise ValueError(f"--cpu and --device {args.device} disagree; pass one of them.")
    if args.cpu:
        return "cpu"
    if args.device:
        return args.device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _preset(args: argparse.Namespace, device: str) -> tuple[str, dict[str, Any]]:
    if args.quick:
        return "quick", dict(QUICK)
    if device == "cuda":
        return "gpu", dict(GPU)
    return "default", dict(DEFAULT)


def _apply_set(settings: dict[str, Any], items: list[str]) -> None:
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in settings:
            raise ValueError(f"--set {item!r}: use KEY=VALUE with KEY one of {sorted(settings)}.")
        try:
            settings[key] = json.loads(value)
        except json.JSONDecodeError:
            raise ValueError(f"--set {item!r}: the value must be JSON (a number, a list, a quoted string).") from None


PASSKEY_TRAIN = ("window", "all")


def _check_numbers(settings: dict[str, Any]) -> None:
    names = (
        "steps",
        "batch",
        "segment",
        "block",
        "width",
        "depth",
        "heads",
        "eval_docs",
        "encoder_steps",
        "passkey_seeds",
    )
    for name in names:
        if not isinstance(settings[name], int) or isinstance(settings[name], bool) or settings[name] < 1:
            raise ValueError(f"setting {name}={settings[name]!r} must be a positive integer.")
    for name in ("seeds", "encoder_seeds"):
        if not settings[name] or not all(isinstance(s, int) for s in settings[name]):
            raise ValueError(f"setting {name}={settings[name]!r} must be a non-empty list of integers.")
    if settings["passkey_train"] not in PASSKEY_TRAIN:
        raise ValueError(
            f"setting passkey_train={settings['passkey_train']!r} must be one of {PASSKEY_TRAIN}: train the passkey "
            "task at the scored distances inside the dense baseline's window (block) or at all of them."
        )
    if settings["passkey_train"] == "window" and min(settings["passkey_distances"]) > settings["block"]:
        raise ValueError(
            f"setting passkey_train='window' needs a passkey distance within block={settings['block']} tokens; "
            f'passkey_distances={settings["passkey_distances"]!r} has none: add one or set passkey_train="all".'
        )
    if settings["block"] % settings["segment"]:
        raise ValueError(
            f"setting block={settings['block']} must be a multiple of segment={settings['segment']}: memory models "
            "read each block in segments."
        )


def _models(args: argparse.Namespace, settings: dict[str, Any]) -> tuple[list[str], list[str], str]:
    """The causal and encoder models of the run, and how they were chosen (said in the report)."""
    from .grid import default_archs

    causal, encoders = default_archs(settings)
    chosen = "the whole family"
    if settings.get("subset") and args.archs is None:
        groups = ", ".join(f"{m} ({group_of(m)})" for m in causal)
        chosen = (
            f"--quick's subset: one causal model per group, {groups}; the first {settings['quick_encoders']} "
            "encoders; --archs and --encoders choose others"
        )
    if args.archs is not None:
        unknown = [a for a in args.archs if a not in causal_archs()]
        if unknown:
            raise ValueError(
                f"--archs {unknown}: not causal architectures of the registry; choose from {causal_archs()}."
            )
        causal, chosen = list(args.archs), "--archs"
    if args.encoders is not None:
        unknown = [a for a in args.encoders if a not in encoder_archs()]
        if unknown:
            raise ValueError(f"--encoders {unknown}: choose from {encoder_archs()}.")
        encoders = list(args.encoders)
    return causal, encoders, chosen


def _config_overrides(items: list[str]) -> dict[str, dict[str, Any]]:
    overrides: dict[str, dict[str, Any]] = {}
    known = (*causal_archs(), *encoder_archs())
    for item in items:
        arch, colon, rest = item.partition(":")
        key, sep, value = rest.partition("=")
        if not colon or not sep or arch not in known:
            raise ValueError(f"--config_overrides {item!r}: use ARCH:KEY=VALUE, e.g. longformer:attention_window=64.")
        try:
            overrides.setdefault(arch, {})[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides.setdefault(arch, {})[key] = value
    return overrides


def parse_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The grid's settings: the preset, ``--set``, ``--tokens``/``--minutes``, the models; refuses what cannot
    run."""
    device = _device(args)
    preset, settings = _preset(args, device)
    _apply_set(settings, args.set)
    if args.tokens is not None and args.minutes is not None:
        raise ValueError("--tokens and --minutes both set the training budget; pass one of them.")
    if args.minutes is not None and args.minutes <= 0:
        raise ValueError(f"--minutes={args.minutes} must be positive.")
    if args.tokens is not None:
        if args.tokens < 1:
            raise ValueError(f"--tokens={args.tokens} must be positive.")
        settings["steps"] = max(1, args.tokens // (settings["batch"] * settings["block"]))
    if args.seed is not None:
        settings["seeds"] = [args.seed]
        settings["encoder_seeds"] = [args.seed]
    settings["minutes"] = args.minutes
    _check_numbers(settings)
    if args.jobs is None:
        args.jobs = default_jobs(device)
    if args.jobs < 1 or (args.worker is not None and not 0 <= args.worker < args.jobs):
        raise ValueError(f"--jobs={args.jobs} must be a positive integer (--worker {args.worker} below it).")
    settings["archs"], settings["encoders"], settings["chosen"] = _models(args, settings)
    if args.encoder_tasks is None:
        args.encoder_tasks = list(settings["encoder_tasks"])
    if args.no_baseline and any(_wraps_base(a) for a in settings["archs"]):
        raise ValueError(
            "--archs with a model built on the dense baseline (kNN-LM) needs the baseline: drop --no_baseline."
        )
    if args.validation_file and not args.train_file:
        raise ValueError("--validation_file needs --train_file too (local files replace the bundled corpus).")
    settings["config_overrides"] = _config_overrides(args.config_overrides)
    settings["device"] = device
    settings["preset"] = preset
    return settings


def _wraps_base(name: str) -> bool:
    from ..registry import get_arch
    from .family import wraps_base_config

    return wraps_base_config(get_arch(name))


def versions() -> dict[str, str]:
    import accelerate
    import datasets
    import torch
    import transformers

    import tf_family

    return {
        "tf_family": getattr(tf_family, "__version__", "unknown"),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "accelerate": accelerate.__version__,
        "datasets": datasets.__version__,
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs visible, torch threads {torch.get_num_threads()}",
    }


def describe(grid, cells) -> str:
    """What a run would do: device, preset, shape, models and their work, the cells (``--dry-run`` prints it)."""
    settings = grid.settings
    tokens = settings["steps"] * settings["batch"] * settings["block"]
    lines = [
        f"device {settings['device']}, preset {settings['preset']}, cache {grid.cache}",
        f"shape: {grid.shape}",
        f"causal models ({settings['chosen']}): {', '.join(grid.causal_models()) or 'none'}",
        f"  each {settings['steps']} optimizer steps of {settings['batch']} x {settings['block']} tokens "
        f"({tokens:,} tokens), seeds {settings['seeds']}",
        f"encoders: {', '.join(grid.encoder_models()) or 'none'} on {', '.join(grid.args.encoder_tasks) or 'no task'}"
        f", {settings['encoder_steps']} steps of {settings['encoder_batch']}, seeds {settings['encoder_seeds']}",
        f"{len(cells)} cells:",
    ]
    lines += [f"  {cell.key}" + (f" (needs {', '.join(cell.needs)})" if cell.needs else "") for cell in cells]
    return "\n".join(lines) + "\n"


def run_workers(grid, cells, argv: list[str], jobs: int) -> None:
    """Run the grid's cells in ``jobs`` processes, each with ``cpus // jobs`` threads, taking chains from one shared
    queue (`tf_family.compare.grid.run_claimed`); one progress bar here, read from the cache. The shared data files
    are written first, here, so that no two processes write one."""
    import shutil
    import subprocess

    from tqdm.auto import tqdm

    from .grid import cell_path, claims_folder

    for task in grid.args.encoder_tasks:
        grid.data.task(task)
    shutil.rmtree(claims_folder(grid), ignore_errors=True)  # claims of an earlier, stopped run
    threads = str(max(1, (os.cpu_count() or 1) // jobs))
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    command = [sys.executable, "-m", "tf_family.cli", "compare", *argv]
    started = time.time()
    workers = [subprocess.Popen([*command, "--jobs", str(jobs), "--worker", str(k)], env=env) for k in range(jobs)]

    def finished() -> int:
        done = 0
        for cell in cells:
            path = cell_path(grid, cell)
            with contextlib.suppress(OSError, ValueError):
                if path.stat().st_mtime >= started or "error" not in json.loads(path.read_text()):
                    done += 1
        return done

    with tqdm(total=len(cells), desc=f"compare ({jobs} processes)", unit="cell", dynamic_ncols=True) as progress:
        while any(worker.poll() is None for worker in workers):
            if (done := finished()) != progress.n:
                progress.update(done - progress.n)
            time.sleep(1.0)
        progress.update(finished() - progress.n)
    codes = [worker.wait() for worker in workers]
    if any(codes):
        failed = [k for k, code in enumerate(codes) if code]
        raise RuntimeError(
            f"compare --jobs {jobs}: worker(s) {failed} exited with {[codes[k] for k in failed]}; the cells they "
            "finished are cached, a rerun with the same options resumes."
        )


def main(argv: list[str] | None = None) -> int:
    from .grid import Grid, run_cells, run_claimed
    from .report import write_report

    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    settings = parse_settings(args)
    started = time.perf_counter()
    grid = Grid(args, settings)
    cells = grid.cells()
    if args.dry_run:
        sys.stdout.write(describe(grid, cells))
        return 0
    if settings["device"] == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("--device cuda: no GPU is visible to torch; use --device cpu or --dry-run.")
    if args.worker is not None:  # one of --jobs's processes: chains from the shared queue, no report
        run_claimed(grid, cells)
        return 0
    if args.jobs > 1 and not args.report_only:
        run_workers(grid, cells, argv, args.jobs)
    results = run_cells(grid, cells, args.report_only or args.jobs > 1)
    command = {"argv": argv, **vars(args)}
    paths = write_report(Path(args.output_dir), results, settings, versions(), command, time.perf_counter() - started)
    failed = [k for k, r in results.items() if "error" in r and r["error"] != "not run yet"]
    sys.stdout.write(f"report: {paths['html']}\ntable: {paths['markdown']}\n")
    if failed:
        sys.stdout.write(f"{len(failed)} cell(s) failed (recorded in the report): {', '.join(failed)}\n")
    return 0


__all__ = [
    "MAX_DEFAULT_JOBS",
    "MEASURES",
    "build_parser",
    "default_jobs",
    "describe",
    "main",
    "parse_settings",
    "run_workers",
    "versions",
]
