"""The command-line groups every training recipe shares, and their validation.

A recipe builds its own parser (its model and data groups are its own) and adds these groups with the defaults that
suit its task; `validate_run_args` then refuses, before any work, what cannot run (each message says what to change).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import logging
import os
import time
from typing import Any

from ..registry import ARCHITECTURES, get_arch
from ..utils.user_errors import DEBUG_FLAG, check_local_path, did_you_mean

logger = logging.getLogger(__name__)

SCHEDULERS = ["linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup"]
TRACKERS = {"tensorboard": "tensorboard", "trackio": "trackio", "wandb": "wandb"}
CPU_HELP = "run on CPU even if a GPU is present"


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` with each option's default in force, said once: an option whose help already speaks of its
    default (``default: ...``) is left as written, and an unset default (None, off) is not shown."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if (action.help and "default" in action.help) or action.default in (None, False):
            return action.help
        return super()._get_help_string(action)


def add_debug_argument(parser: argparse.ArgumentParser) -> None:
    """``--debug``: a user's mistake shows its full traceback instead of one ``error: ...`` line
    (`tf_family.utils.user_errors.run_main` reads it)."""
    parser.add_argument(
        DEBUG_FLAG, action="store_true", help="show the full traceback of an error instead of one line"
    )


def _launch_started() -> float:
    """When this run started: now for one process; for several, the start of their common parent (the launcher),
    so that every process names the same folder."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        try:
            with open(f"/proc/{os.getppid()}/stat") as stat:
                ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
            with open("/proc/stat") as boot:
                booted = next(int(line.split()[1]) for line in boot if line.startswith("btime"))
            return booted + ticks / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError, StopIteration):
            pass
    return time.time()


def timestamped_run_dir(name: str) -> str:
    """``runs/<name>-<YYYYmmdd-HHMMSS>``: a fresh folder for each run, so that the same command runs again (one
    process: ``-2``, ``-3`` … appended to a folder that exists already, two runs in the same second)."""
    folder = os.path.join("runs", f"{name}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(_launch_started()))}")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # every process must name the same folder: no looking
        return folder
    candidate, number = folder, 1
    while os.path.exists(candidate):
        number += 1
        candidate = f"{folder}-{number}"
    return candidate


def add_optimisation_arguments(
    parser: argparse.ArgumentParser,
    *,
    learning_rate: float,
    lr_scheduler_type: str,
    weight_decay: float = 0.01,
    num_warmup_steps: int = 0,
    max_grad_norm: float = 1.0,
    per_device_train_batch_size: int = 8,
    num_train_epochs: int | None = 1,
    max_train_steps: int | None = None,
    eval_batches: bool = True,
    batch_help: str | None = None,
    cpu_help: str = CPU_HELP,
) -> argparse._ArgumentGroup:
    """The "optimisation" group: batch sizes, AdamW, the learning-rate schedule, clipping, precision, seed, ``--cpu``.
    Twelve parameters: after the parser, one keyword per recipe-specific default or help text of the group.

    ``num_train_epochs=None`` leaves out ``--num_train_epochs`` (the run is counted in ``--max_train_steps`` only);
    ``eval_batches=False`` leaves out ``--per_device_eval_batch_size``."""
    train = parser.add_argument_group("optimisation")
    train.add_argument("--per_device_train_batch_size", type=int, default=per_device_train_batch_size, help=batch_help)
    if eval_batches:
        train.add_argument("--per_device_eval_batch_size", type=int, default=8)
    train.add_argument("--learning_rate", type=float, default=learning_rate)
    train.add_argument("--weight_decay", type=float, default=weight_decay)
    if num_train_epochs is not None:
        train.add_argument("--num_train_epochs", type=int, default=num_train_epochs)
        steps_help = "optimizer steps in all (overrides --num_train_epochs)"
    else:
        steps_help = "optimizer steps"
    train.add_argument("--max_train_steps", type=int, default=max_train_steps, help=steps_help)
    train.add_argument("--gradient_accumulation_steps", type=int, default=1)
    train.add_argument("--lr_scheduler_type", choices=SCHEDULERS, default=lr_scheduler_type)
    train.add_argument("--num_warmup_steps", type=int, default=num_warmup_steps)
    train.add_argument("--max_grad_norm", type=float, default=max_grad_norm, help="gradient clipping; 0 turns it off")
    train.add_argument("--mixed_precision", choices=["no", "fp16", "bf16"], default="no")
    train.add_argument("--seed", type=int, default=42)
    train.add_argument("--cpu", action="store_true", help=cpu_help)
    return train


def add_run_arguments(
    parser: argparse.ArgumentParser, *, default_output_dir: str, logging_steps: int, eval_steps: bool = True
) -> argparse._ArgumentGroup:
    """The "evaluation, checkpoints, output" group: the output folder and its guard, evaluation and checkpoint
    cadence, resuming, logging and experiment tracking. A recipe adds its own evaluation options to the group."""
    run = parser.add_argument_group("evaluation, checkpoints, output")
    run.add_argument("--output_dir", help=f"where the model, card and checkpoints go (default: {default_output_dir})")
    run.add_argument("--overwrite_output_dir", action="store_true", help="reuse a folder that holds an earlier run")
    if eval_steps:
        run.add_argument("--eval_steps", type=int, help="also evaluate every N optimizer steps")
    run.add_argument("--checkpointing_steps", type=int, help="save a resumable checkpoint every N optimizer steps")
    run.add_argument("--checkpoints_total_limit", type=int, help="keep only the N most recent checkpoints")
    run.add_argument("--resume_from_checkpoint", help="a checkpoint folder, or 'latest' in --output_dir")
    run.add_argument(
        "--allow_inexact_resume",
        action="store_true",
        help="resume even when the checkpoint's random states cannot be restored (the run goes on, with a warning, "
        "but no longer exactly as it would have without the interruption); without it such a resume is refused",
    )
    run.add_argument("--logging_steps", type=int, default=logging_steps)
    run.add_argument("--report_to", default="none", help="experiment tracking: none, tensorboard, trackio, wandb, all")
    add_debug_argument(run)
    return run


def add_lora_and_hub_arguments(parser: argparse.ArgumentParser) -> None:
    """The LoRA and Hub options every training recipe shares."""
    lora = parser.add_argument_group("LoRA (PEFT)")
    lora.add_argument("--lora_r", type=int, default=0, help="LoRA rank; 0 trains all weights")
    lora.add_argument("--lora_alpha", type=float, default=16.0)
    lora.add_argument("--lora_dropout", type=float, default=0.05)
    lora.add_argument("--lora_target_modules", nargs="+", help="module names (default: the registry's per arch)")
    lora.add_argument("--merge_lora", action="store_true", help="save merged weights instead of the adapter")

    hub = parser.add_argument_group("Hub")
    hub.add_argument("--push_to_hub", action="store_true")
    hub.add_argument("--hub_model_id", help="user/name of the repository to push to")
    hub.add_argument("--hub_token")
    hub.add_argument("--hub_private", action="store_true")
    hub.add_argument(
        "--remote_code",
        action="store_true",
        help="also write the model's code into the saved folder (tf-family export), so that plain transformers "
        "loads it with trust_remote_code=True where tf_family is not installed",
    )


def architectures_with(task: str) -> list[str]:
    """The registry names of the architectures with a ``task`` model class."""
    return [name for name, spec in ARCHITECTURES.items() if task in spec.model_classes]


def check_model_source(args: argparse.Namespace, task: str, refusal: str) -> None:
    """Exactly one of ``--arch`` (train from scratch) and ``--model_name_or_path`` (fine-tune); ``--arch`` is
    checked by `check_arch`."""
    if (args.arch is None) == (args.model_name_or_path is None):
        raise ValueError("Pass exactly one of --arch (train from scratch) and --model_name_or_path (fine-tune).")
    if args.arch is not None:
        check_arch(args, task, refusal)


def check_arch(args: argparse.Namespace, task: str, refusal: str) -> None:
    """``--arch`` names an architecture with a ``task`` model and ``--variant`` one of its variants; a model trained
    from scratch takes no LoRA. ``refusal`` is the message for an architecture without the task, formatted with
    ``arch`` and ``able`` (the architectures that have it)."""
    spec = get_arch(args.arch)  # ValueError listing the valid names
    if task not in spec.model_classes:
        raise ValueError(refusal.format(arch=args.arch, able=architectures_with(task)))
    spec.make_config(args.variant)  # ValueError naming the variants
    if args.lora_r:
        raise ValueError("--lora_r adapts a trained model: use it with --model_name_or_path, not with --arch.")


def check_at_least(args: argparse.Namespace, names: tuple[str, ...], minimum: int = 1) -> None:
    """Each of the integer options ``names`` is unset (None) or at least ``minimum``."""
    for name in names:
        value = getattr(args, name)
        if value is not None and value < minimum:
            rule = "at least 1" if minimum == 1 else f">= {minimum}"
            raise ValueError(f"--{name}={value} must be {rule}.")


# a run of fewer optimizer steps than this is a smoke run: unless --max_eval_samples says otherwise, it evaluates on
# the first SMOKE_EVAL_SAMPLES validation examples (documents) only
SMOKE_RUN_STEPS = 100
SMOKE_EVAL_SAMPLES = 4


def apply_smoke_eval_cap(args: argparse.Namespace) -> None:
    """A run of fewer than `SMOKE_RUN_STEPS` optimizer steps (``--max_train_steps``) evaluates on the first
    `SMOKE_EVAL_SAMPLES` validation examples unless ``--max_eval_samples`` is given; ``--max_eval_samples 0`` means
    all of them (and is stored as None)."""
    if not hasattr(args, "max_eval_samples"):
        return
    if args.max_eval_samples == 0:
        args.max_eval_samples = None
    elif args.max_eval_samples is None and args.max_train_steps is not None and args.max_train_steps < SMOKE_RUN_STEPS:
        args.max_eval_samples = SMOKE_EVAL_SAMPLES
        logger.info(
            f"a smoke run (--max_train_steps {args.max_train_steps} < {SMOKE_RUN_STEPS}): evaluating on the first "
            f"{SMOKE_EVAL_SAMPLES} validation examples only; --max_eval_samples N (0: all) says otherwise."
        )


# the options that name something to load: a local path among them must exist (data files are always local)
SOURCE_OPTIONS = ("model_name_or_path", "tokenizer_name", "transfo_xl_checkpoint")
FILE_OPTIONS = ("train_file", "validation_file", "test_file")


def check_local_sources(args: argparse.Namespace) -> None:
    """Every option that loads a folder or file (`SOURCE_OPTIONS`, `FILE_OPTIONS`, ``--resume_from_checkpoint``
    unless ``latest``) names one that exists, when it names a local one: said at once, naming the option and path,
    before a Hub lookup would take it for a repository id and retry the network."""
    for name in SOURCE_OPTIONS:
        check_local_path(getattr(args, name, None), f"--{name}")
    for name in FILE_OPTIONS:
        check_local_path(getattr(args, name, None), f"--{name}", always_local=True)
    resume = getattr(args, "resume_from_checkpoint", None)
    if resume not in (None, "latest"):
        check_local_path(resume, "--resume_from_checkpoint", always_local=True)


def validate_run_args(args: argparse.Namespace) -> None:
    """The shared groups' checks: local sources (`check_local_sources`), cadences and limits, LoRA, Hub, and the
    trackers, which it resolves into ``args.trackers`` (the installed ones; ``--report_to all`` skips those that are
    not). Applies the smoke-run evaluation cap (`apply_smoke_eval_cap`)."""
    check_local_sources(args)
    apply_smoke_eval_cap(args)
    check_at_least(
        args, ("gradient_accumulation_steps", "logging_steps", "checkpointing_steps", "checkpoints_total_limit")
    )
    check_at_least(args, tuple(name for name in ("eval_steps", "max_train_steps") if hasattr(args, name)))
    if args.lora_r < 0:
        raise ValueError(f"--lora_r={args.lora_r} must be >= 0 (0 turns LoRA off).")
    if args.merge_lora and not args.lora_r:
        raise ValueError("--merge_lora needs --lora_r > 0.")
    if getattr(args, "remote_code", False) and args.lora_r and not args.merge_lora:
        raise ValueError(
            "--remote_code exports a whole model's code; a LoRA run saves an adapter: add --merge_lora, or leave "
            "--remote_code out."
        )
    if args.push_to_hub and not args.hub_model_id:
        raise ValueError("--push_to_hub needs --hub_model_id user/name.")
    if args.push_to_hub:  # before the work, not after it: offline, not logged in, unreachable
        from ..shipping.hub import check_push_access

        check_push_access(args.hub_model_id, args.hub_token)
    trackers = (
        [] if args.report_to == "none" else list(TRACKERS) if args.report_to == "all" else args.report_to.split(",")
    )
    for tracker in trackers:
        if tracker not in TRACKERS:
            raise ValueError(f"--report_to {tracker!r} is not supported; use none, all or one of {list(TRACKERS)}.")
        if args.report_to != "all" and importlib.util.find_spec(TRACKERS[tracker]) is None:
            raise ValueError(f"--report_to {tracker} needs the {tracker} package: pip install {tracker}.")
    args.trackers = [t for t in trackers if importlib.util.find_spec(TRACKERS[t]) is not None]


def config_fields(arch: str) -> list[str]:
    """The fields of ``arch``'s config class (what ``--config_overrides`` may set)."""
    config_class = get_arch(arch).config_class
    if dataclasses.is_dataclass(config_class):
        return [field.name for field in dataclasses.fields(config_class)]
    return list(config_class().to_dict())


def parse_config_overrides(items: list[str], arch: str | None = None) -> dict[str, Any]:
    """``["n_layer=2", "cutoffs=[100, 200]", "pre_lnorm=true"]`` → typed values (JSON, else the raw string). With
    ``arch``, a key that is no field of its config is refused, naming the closest field."""
    overrides = {}
    fields = config_fields(arch) if arch in ARCHITECTURES else None
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--config_overrides {item!r} must look like KEY=VALUE, e.g. n_layer=2.")
        if fields is not None and key not in fields:
            raise ValueError(
                f"--config_overrides {item}: {get_arch(arch).config_class.__name__} has no field {key!r}"
                f"{did_you_mean(key, fields)}; its fields are listed in its docstring and on its documentation page."
            )
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    return overrides
