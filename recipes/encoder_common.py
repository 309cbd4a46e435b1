"""What the encoder task recipes (sequence classification, masked LM, question answering) share: arguments and their
checks, the tokenizer and its special tokens, the model from the registry or a saved folder, optional LoRA, the
optimiser, the training loop (gradient accumulation, clipping, logging, atomic checkpoints, exact resume) and the
saved run (weights, tokenizer, ``training_run.json``, model card, optional push). Checkpoints and LoRA target checks
are the causal-LM recipe's own (`tf_family.recipes.causal_lm`).

Tokenizer: a model trained from scratch (``--arch``) uses the bundled SOTU BPE tokenizer unless ``--tokenizer_name``
is given. That tokenizer has only ``<|endoftext|>`` (id 0); the recipes add ``<cls>`` and ``<sep>`` (ids 8192, 8193;
the masked LM also ``<mask>``, 8194) and pad with ``<|endoftext|>``. Padding keeps id 0 on purpose: Longformer's
positions start at ``pad_token_id + 1`` (RoBERTa's convention), so a large pad id would eat the position table.
Any tokenizer without cls / sep / pad tokens gets the same treatment (cls and sep fall back to its bos and eos tokens
when it has them).
Inputs are assembled by the recipes as ``<cls> text <sep>`` (and ``<cls> question <sep> context <sep>``), so any
fast tokenizer works, with or without its own template; a tokenizer that gained cls / sep tokens also gets that
template as its post-processor, so the saved tokenizer frames ``tokenizer(text)`` as the model was trained.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.logging import get_logger
from accelerate.utils import DistributedType, gather_object
from tqdm.auto import tqdm
from transformers import AutoConfig, AutoTokenizer, get_scheduler

import tf_family
from tf_family.cards import RUN_INFO_FILE, write_model_card
from tf_family.data import SOTU_TOKENIZER_DIR
from tf_family.data.packing import EMPTY_BLOCK
from tf_family.hub import push_folder
from tf_family.recipes.causal_lm import (
    SCHEDULERS,
    TRACKERS,
    add_lora_and_hub_arguments,
    check_lora_targets,
    check_output_dir,
    ending_run,
    find_checkpoint,
    make_accelerator,
    parse_config_overrides,
    save_checkpoint,
    weights_fingerprint,
)
from tf_family.registry import ARCHITECTURES, get_arch

logger = get_logger(__name__)

# special tokens added to a tokenizer that lacks them (see the module docstring)
ADDED_SPECIAL_TOKENS = {"cls_token": "<cls>", "sep_token": "<sep>", "mask_token": "<mask>"}


def add_common_arguments(parser: argparse.ArgumentParser, task: str, default_dataset: str, max_length: int) -> None:
    """The arguments every encoder recipe takes; ``task`` is the registry task name (e.g. ``masked_lm``)."""
    model = parser.add_argument_group("model")
    model.add_argument("--arch", help=f"train from scratch: one of {list(ARCHITECTURES)} with a {task} model")
    model.add_argument("--variant", default="small", help="named size of --arch (tiny, small, base, …)")
    model.add_argument(
        "--config_overrides", nargs="*", default=[], metavar="KEY=VALUE", help="config fields for --arch"
    )
    model.add_argument("--model_name_or_path", help="fine-tune a saved folder or Hub id")
    model.add_argument(
        "--tokenizer_name", help="tokenizer folder or Hub id (default: the model's, or the bundled one)"
    )

    data = parser.add_argument_group("data")
    data.add_argument("--dataset_name", default=default_dataset, help="a bundled dataset name or a Hub dataset id")
    data.add_argument("--dataset_config_name")
    data.add_argument("--train_file", help="local .json/.jsonl/.csv/.parquet file (overrides --dataset_name)")
    data.add_argument("--validation_file")
    data.add_argument("--max_length", type=int, default=max_length, help="tokens per input, special tokens included")
    data.add_argument("--max_train_samples", type=int, help="use only the first N training examples")
    data.add_argument("--max_eval_samples", type=int, help="use only the first N evaluation examples")

    train = parser.add_argument_group("optimisation")
    train.add_argument("--per_device_train_batch_size", type=int, default=8)
    train.add_argument("--per_device_eval_batch_size", type=int, default=8)
    train.add_argument("--learning_rate", type=float, default=5e-5 if task != "masked_lm" else 5e-4)
    train.add_argument("--weight_decay", type=float, default=0.01)
    train.add_argument("--num_train_epochs", type=int, default=3)
    train.add_argument("--max_train_steps", type=int, help="optimizer steps in all (overrides --num_train_epochs)")
    train.add_argument("--gradient_accumulation_steps", type=int, default=1)
    train.add_argument("--lr_scheduler_type", choices=SCHEDULERS, default="linear")
    train.add_argument("--num_warmup_steps", type=int, default=0)
    train.add_argument("--max_grad_norm", type=float, default=1.0, help="gradient clipping; 0 turns it off")
    train.add_argument("--mixed_precision", choices=["no", "fp16", "bf16"], default="no")
    train.add_argument("--seed", type=int, default=42)
    train.add_argument("--cpu", action="store_true", help="run on CPU even if a GPU is present")

    run = parser.add_argument_group("evaluation, checkpoints, output")
    run.add_argument("--output_dir", help="where the model, card and checkpoints go (default: runs/<model>-<data>)")
    run.add_argument("--overwrite_output_dir", action="store_true", help="reuse a folder that holds an earlier run")
    run.add_argument("--eval_steps", type=int, help="also evaluate every N optimizer steps")
    run.add_argument("--checkpointing_steps", type=int, help="save a resumable checkpoint every N optimizer steps")
    run.add_argument("--checkpoints_total_limit", type=int, help="keep only the N most recent checkpoints")
    run.add_argument("--resume_from_checkpoint", help="a checkpoint folder, or 'latest' in --output_dir")
    run.add_argument("--logging_steps", type=int, default=10)
    run.add_argument("--report_to", default="none", help="experiment tracking: none, tensorboard, trackio, wandb, all")

    add_lora_and_hub_arguments(parser)


def validate_common_args(args: argparse.Namespace, task: str, min_length: int = 3) -> None:
    """Refuse, before any work, what cannot run; each message says what to change."""
    if (args.arch is None) == (args.model_name_or_path is None):
        raise ValueError("Pass exactly one of --arch (train from scratch) and --model_name_or_path (fine-tune).")
    if args.arch is not None:
        spec = get_arch(args.arch)  # ValueError listing the valid names
        if task not in spec.model_classes:
            able = [name for name, s in ARCHITECTURES.items() if task in s.model_classes]
            raise ValueError(f"--arch {args.arch} has no {task} model; architectures with one: {able}.")
        spec.make_config(args.variant)  # ValueError naming the variants
        if args.lora_r:
            raise ValueError("--lora_r adapts a trained model: use it with --model_name_or_path, not with --arch.")
    for name in (
        "per_device_train_batch_size",
        "per_device_eval_batch_size",
        "gradient_accumulation_steps",
        "num_train_epochs",
        "logging_steps",
    ):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name}={getattr(args, name)} must be at least 1.")
    if args.max_length < min_length:
        raise ValueError(f"--max_length={args.max_length} must be at least {min_length} (special tokens included).")
    for name in (
        "max_train_steps",
        "eval_steps",
        "checkpointing_steps",
        "checkpoints_total_limit",
        "max_train_samples",
        "max_eval_samples",
    ):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name}={value} must be at least 1.")
    if args.learning_rate <= 0:
        raise ValueError(f"--learning_rate={args.learning_rate} must be positive.")
    if args.lora_r < 0:
        raise ValueError(f"--lora_r={args.lora_r} must be >= 0 (0 turns LoRA off).")
    if args.merge_lora and not args.lora_r:
        raise ValueError("--merge_lora needs --lora_r > 0.")
    if args.push_to_hub and not args.hub_model_id:
        raise ValueError("--push_to_hub needs --hub_model_id user/name.")
    if args.validation_file and not args.train_file:
        raise ValueError("--validation_file needs --train_file too (local files replace --dataset_name).")
    trackers = (
        [] if args.report_to == "none" else list(TRACKERS) if args.report_to == "all" else args.report_to.split(",")
    )
    for tracker in trackers:
        if tracker not in TRACKERS:
            raise ValueError(f"--report_to {tracker!r} is not supported; use none, all or one of {list(TRACKERS)}.")
        if args.report_to != "all" and importlib.util.find_spec(TRACKERS[tracker]) is None:
            raise ValueError(f"--report_to {tracker} needs the {tracker} package: pip install {tracker}.")
    args.trackers = [t for t in trackers if importlib.util.find_spec(TRACKERS[t]) is not None]


def default_output_dir(args: argparse.Namespace, task: str) -> str:
    model = args.arch or Path(args.model_name_or_path.rstrip("/")).name
    data = Path(args.train_file).stem if args.train_file else args.dataset_name.replace("/", "_")
    return os.path.join("runs", f"{model}-{task}-{data}")


def load_tokenizer(args: argparse.Namespace, need_mask: bool = False):
    """The tokenizer, with cls / sep / pad (and mask, when ``need_mask``) tokens guaranteed (module docstring)."""
    source = args.tokenizer_name or args.model_name_or_path or str(SOTU_TOKENIZER_DIR)
    tokenizer = AutoTokenizer.from_pretrained(source)
    if not tokenizer.is_fast:
        raise ValueError(f"the tokenizer {source} is not a fast tokenizer; the recipes need character offsets.")
    added = {}
    if tokenizer.cls_token is None:
        added["cls_token"] = tokenizer.bos_token or ADDED_SPECIAL_TOKENS["cls_token"]
    if tokenizer.sep_token is None:
        added["sep_token"] = tokenizer.eos_token or ADDED_SPECIAL_TOKENS["sep_token"]
    if tokenizer.cls_token is None and tokenizer.sep_token is None and added["cls_token"] == added["sep_token"]:
        added["cls_token"] = ADDED_SPECIAL_TOKENS["cls_token"]  # a classifier reads the cls token: keep it distinct
        added["sep_token"] = ADDED_SPECIAL_TOKENS["sep_token"]
    if tokenizer.pad_token is None:
        added["pad_token"] = tokenizer.eos_token or tokenizer.unk_token or "<pad>"
    if need_mask and tokenizer.mask_token is None:
        added["mask_token"] = ADDED_SPECIAL_TOKENS["mask_token"]
    if added:
        if (
            args.model_name_or_path
            and not args.arch
            and any(tokenizer.convert_tokens_to_ids(t) in (None, tokenizer.unk_token_id) for t in added.values())
        ):
            logger.warning(f"adding special tokens {added} to the tokenizer of a trained model: embeddings grow")
        tokenizer.add_special_tokens(added)
    if "cls_token" in added or "sep_token" in added:
        # the saved tokenizer then frames its inputs as the model was trained: `tokenizer(text)` gives
        # <cls> text <sep>, `tokenizer(question, context)` gives <cls> question <sep> context <sep>
        from tokenizers.processors import TemplateProcessing

        cls, sep = tokenizer.cls_token, tokenizer.sep_token
        tokenizer.backend_tokenizer.post_processor = TemplateProcessing(
            single=f"{cls} $A {sep}",
            pair=f"{cls} $A {sep} $B:1 {sep}:1",
            special_tokens=[(cls, tokenizer.cls_token_id), (sep, tokenizer.sep_token_id)],
        )
    return tokenizer


def token_ids(tokenizer) -> dict[str, int]:
    ids = {
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.cls_token_id,
        "eos_token_id": tokenizer.sep_token_id,
        "sep_token_id": tokenizer.sep_token_id,
    }
    return {k: v for k, v in ids.items() if v is not None}


def build_model(args: argparse.Namespace, task: str, tokenizer, config_overrides: dict[str, Any], auto_class, **head):
    """A registry model from scratch (``--arch``) or a saved one (``--model_name_or_path``) with the ``head`` config
    fields (e.g. ``num_labels``); the embeddings grow when the tokenizer gained tokens."""
    if args.arch:
        spec = get_arch(args.arch)
        config = spec.make_config(
            args.variant, **{"vocab_size": len(tokenizer), **token_ids(tokenizer), **head, **config_overrides}
        )
        return spec.model_classes[task](config)
    config = AutoConfig.from_pretrained(args.model_name_or_path, **head, **config_overrides)
    model = auto_class.from_pretrained(args.model_name_or_path, config=config, ignore_mismatched_sizes=bool(head))
    vocab = getattr(model.config, "vocab_size", None)
    if vocab is not None and len(tokenizer) > vocab:
        model.resize_token_embeddings(len(tokenizer))
    return model


def max_input_length(config) -> int | None:
    """The longest input the model's position table allows (RoBERTa-style offsets counted), or None."""
    positions = getattr(config, "max_position_embeddings", None)
    if not isinstance(positions, int):
        return None
    if getattr(config, "model_type", "").endswith("longformer") or "roberta" in getattr(config, "model_type", ""):
        return positions - (config.pad_token_id or 0) - 1
    return positions


def check_max_length(args: argparse.Namespace, model) -> None:
    limit = max_input_length(model.config)
    if limit is not None and args.max_length > limit:
        raise ValueError(
            f"--max_length {args.max_length} is longer than the {limit} tokens {type(model).__name__} can read; pass "
            f"--max_length {limit} or less, or a larger max_position_embeddings (--config_overrides)."
        )


def apply_lora(model, args: argparse.Namespace, train_head: bool = False):
    """LoRA adapters on the registry's (or the given) target modules. ``train_head``: the task head (every
    parameter outside the base model, e.g. a freshly initialised classifier) is trained in full beside the adapters;
    the run must then save merged weights (validated by `check_lora_head`)."""
    if not args.lora_r:
        return model
    head = [p for name, p in model.named_parameters() if not name.startswith(f"{model.base_model_prefix}.")]
    from peft import LoraConfig, get_peft_model

    registry_spec = next(
        (s for s in ARCHITECTURES.values() if model.config.model_type in (s.model_type, *s.legacy_model_types)), None
    )
    targets = args.lora_target_modules or (list(registry_spec.lora_target_modules) if registry_spec else None)
    if targets:
        check_lora_targets(model, targets)
    config = LoraConfig(
        r=args.lora_r,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        target_modules=targets,
    )  # no task_type: the plain PeftModel passes every keyword (labels, positions) through to the model
    # not PEFT's modules_to_save: it matches names by suffix, and a head's names (e.g. Longformer's `out_proj`) can
    # also name attention projections that carry adapters
    model = get_peft_model(model, config)
    if train_head:
        for param in head:
            param.requires_grad_(True)
    return model


def check_lora_head(args: argparse.Namespace) -> None:
    """A task with a new head trains it in full: only merged weights hold it."""
    if args.lora_r and not args.merge_lora:
        raise ValueError(
            "--lora_r trains this task's new head in full beside the adapters, and only merged weights keep it: add "
            "--merge_lora."
        )


def make_optimizer(model, args: argparse.Namespace, updates_per_epoch: int, world: int):
    """AdamW with the usual no-decay groups (biases, normalisation weights) and the learning-rate schedule (laid out
    in process-steps: a prepared scheduler advances once per process at every optimizer step)."""
    decay, skip = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (skip if param.ndim < 2 or name.endswith("bias") else decay).append(param)
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": skip, "weight_decay": 0.0}],
        lr=args.learning_rate,
    )
    max_train_steps = args.max_train_steps or args.num_train_epochs * updates_per_epoch
    scheduler = get_scheduler(
        args.lr_scheduler_type,
        optimizer,
        num_warmup_steps=args.num_warmup_steps * world,
        num_training_steps=max_train_steps * world,
    )
    return optimizer, scheduler, max_train_steps


def epoch_batches(num_examples: int, global_batch: int, seed: int, epoch: int) -> list[list[int]]:
    """Shuffled global batches of example indices for one epoch (order fixed by ``(seed, epoch)``; a last partial
    batch is dropped so every process gets a full one)."""
    order = torch.randperm(num_examples, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
    return [order[i : i + global_batch] for i in range(0, num_examples - global_batch + 1, global_batch)]


def eval_batches(num_examples: int, global_batch: int) -> list[list[int]]:
    """Every example once, in order; the last batch is filled with `EMPTY_BLOCK` (skipped by the reader)."""
    batches = [list(range(i, min(i + global_batch, num_examples))) for i in range(0, num_examples, global_batch)]
    if batches:
        batches[-1] += [EMPTY_BLOCK] * (global_batch - len(batches[-1]))
    return batches


def rows_of(global_batch: list[int], accelerator: Accelerator, per_device: int) -> list[int]:
    start = accelerator.process_index * per_device
    return [i for i in global_batch[start : start + per_device] if i != EMPTY_BLOCK]


def pad_batch(
    sequences: list[list[int]], pad_id: int, extra: dict[str, list] | None = None
) -> dict[str, torch.Tensor]:
    """Right-pad ``input_ids`` to the longest row; ``attention_mask`` marks the real tokens. ``extra`` lists of
    per-token values (e.g. MLM labels) are padded with -100, per-row values become tensors."""
    length = max(map(len, sequences))
    batch = {
        "input_ids": torch.tensor([s + [pad_id] * (length - len(s)) for s in sequences], dtype=torch.long),
        "attention_mask": torch.tensor([[1] * len(s) + [0] * (length - len(s)) for s in sequences], dtype=torch.long),
    }
    for key, values in (extra or {}).items():
        if values and isinstance(values[0], list):
            batch[key] = torch.tensor([v + [-100] * (length - len(v)) for v in values], dtype=torch.long)
        else:
            batch[key] = torch.tensor(values, dtype=torch.long)
    return batch


def predict(accelerator: Accelerator, model, num_examples: int, per_device: int, collate: Callable, read: Callable):
    """Run the (unwrapped) model over every example once, split across processes; returns ``read(outputs, batch,
    indices)``'s items from every process, in example order. ``read`` returns a list of ``(index, value)``."""
    world = accelerator.num_processes
    unwrapped = accelerator.unwrap_model(model)
    unwrapped.eval()
    items = []
    with torch.no_grad():
        for global_batch in eval_batches(num_examples, world * per_device):
            indices = rows_of(global_batch, accelerator, per_device)
            if not indices:
                continue
            batch = {k: v.to(accelerator.device) for k, v in collate(indices, train=False).items()}
            with accelerator.autocast():
                outputs = unwrapped(**{k: v for k, v in batch.items() if k in model_input_names(unwrapped, batch)})
            items.extend(read(outputs, batch, indices))
    unwrapped.train()
    gathered = gather_object(items) if world > 1 else items
    return [value for _, value in sorted(gathered, key=lambda item: item[0])]


def model_input_names(model, batch: dict) -> set[str]:
    import inspect

    parameters = inspect.signature(model.forward).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):  # e.g. a PEFT wrapper
        return set(batch)
    return {k for k in batch if k in parameters}


def train(
    accelerator: Accelerator,
    args: argparse.Namespace,
    model,
    optimizer,
    scheduler,
    max_train_steps: int,
    num_examples: int,
    collate: Callable,
    evaluate: Callable[[], dict[str, float]],
    output_dir: Path,
) -> tuple[int, list[dict[str, float]]]:
    """The training loop: ``collate(indices, train=True, epoch=…, step=…)`` builds a batch with its targets (the
    model computes the loss); returns the optimizer steps done and the logged history."""
    world, per_device, accumulation = (
        accelerator.num_processes,
        args.per_device_train_batch_size,
        args.gradient_accumulation_steps,
    )
    updates_per_epoch = len(epoch_batches(num_examples, world * per_device, args.seed, 0)) // accumulation
    num_epochs = math.ceil(max_train_steps / updates_per_epoch)
    completed_steps, start_epoch, resume_update = 0, 0, 0
    if args.resume_from_checkpoint:
        checkpoint = find_checkpoint(args.output_dir, args.resume_from_checkpoint)
        state = json.loads((checkpoint / "trainer_state.json").read_text())
        if state["world_size"] != world:
            raise ValueError(
                f"{checkpoint} was written by {state['world_size']} processes; resume it with as many "
                f"(this run has {world})."
            )
        accelerator.load_state(str(checkpoint))
        completed_steps, start_epoch, resume_update = (
            state["completed_steps"],
            state["epoch"],
            state["update_in_epoch"],
        )
        logger.info(f"resumed from {checkpoint} at step {completed_steps}", main_process_only=True)

    input_names = None
    progress = tqdm(
        total=max_train_steps, initial=completed_steps, disable=not accelerator.is_local_main_process, desc="training"
    )
    model.train()
    history: list[dict[str, float]] = []
    window_loss, window_batches, window_examples, window_start = 0.0, 0, 0, time.perf_counter()
    for epoch in range(start_epoch, num_epochs):
        if completed_steps >= max_train_steps:
            break
        schedule = epoch_batches(num_examples, world * per_device, args.seed, epoch)
        schedule = schedule[: len(schedule) - len(schedule) % accumulation]
        first_update = resume_update if epoch == start_epoch else 0
        for micro_index in range(first_update * accumulation, len(schedule)):
            indices = rows_of(schedule[micro_index], accelerator, per_device)
            batch = collate(indices, train=True, epoch=epoch, step=micro_index)
            batch = {k: v.to(accelerator.device) for k, v in batch.items()}
            if input_names is None:
                input_names = model_input_names(accelerator.unwrap_model(model), batch)
            with accelerator.accumulate(model):
                with accelerator.autocast():
                    outputs = model(**{k: v for k, v in batch.items() if k in input_names})
                loss = outputs.loss
                accelerator.backward(loss)
                if accelerator.sync_gradients and args.max_grad_norm > 0:
                    accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            window_loss += loss.item()
            window_batches += 1
            window_examples += len(indices)
            if not accelerator.sync_gradients:
                continue
            completed_steps += 1
            update_index = (micro_index + 1) // accumulation
            progress.update(1)
            if completed_steps % args.logging_steps == 0 or completed_steps == max_train_steps:
                totals = accelerator.reduce(
                    torch.tensor(
                        [window_loss, window_batches, window_examples], dtype=torch.float64, device=accelerator.device
                    ),
                    reduction="sum",
                ).tolist()
                record = {
                    "train_loss": totals[0] / max(totals[1], 1),
                    "examples_per_second": totals[2] / (time.perf_counter() - window_start),
                    "learning_rate": scheduler.get_last_lr()[0],
                    "step": completed_steps,
                }
                history.append(record)
                progress.set_postfix(loss=f"{record['train_loss']:.3f}")
                accelerator.log({k: v for k, v in record.items() if k != "step"}, step=completed_steps)
                window_loss, window_batches, window_examples, window_start = 0.0, 0, 0, time.perf_counter()
            if args.eval_steps and completed_steps % args.eval_steps == 0 and completed_steps < max_train_steps:
                metrics = evaluate()
                accelerator.log({f"eval/{k}": v for k, v in metrics.items()}, step=completed_steps)
                logger.info(f"step {completed_steps}: {metrics}", main_process_only=True)
            if args.checkpointing_steps and completed_steps % args.checkpointing_steps == 0:
                state = {"completed_steps": completed_steps, "epoch": epoch, "update_in_epoch": update_index}
                if update_index == len(schedule) // accumulation:
                    state.update(epoch=epoch + 1, update_in_epoch=0)
                save_checkpoint(accelerator, args.output_dir, state, None, args.checkpoints_total_limit)
            if completed_steps >= max_train_steps:
                break
    progress.close()
    return completed_steps, history


def hyperparameters_of(args: argparse.Namespace, world: int, max_train_steps: int, **extra) -> dict[str, Any]:
    values = {
        "arch": args.arch,
        "variant": args.variant if args.arch else None,
        "base_model": args.model_name_or_path,
        "max_length": args.max_length,
        "per_device_train_batch_size": args.per_device_train_batch_size,
        "world_size": world,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "learning_rate": args.learning_rate,
        "weight_decay": args.weight_decay,
        "lr_scheduler": args.lr_scheduler_type,
        "num_warmup_steps": args.num_warmup_steps,
        "max_grad_norm": args.max_grad_norm,
        "max_train_steps": max_train_steps,
        "mixed_precision": args.mixed_precision,
        "seed": args.seed,
        **extra,
        **({"config_overrides": " ".join(args.config_overrides)} if args.config_overrides else {}),
        **(
            {"lora_r": args.lora_r, "lora_alpha": args.lora_alpha, "lora_dropout": args.lora_dropout,
             "merge_lora": args.merge_lora}
            if args.lora_r
            else {}
        ),
    }  # fmt: skip
    return {k: v for k, v in values.items() if v is not None}


def save_run(
    accelerator: Accelerator,
    args: argparse.Namespace,
    model,
    tokenizer,
    output_dir: Path,
    *,
    recipe: str,
    task: str,
    data: dict[str, Any],
    hyperparameters: dict[str, Any],
    metrics: dict[str, Any],
    parameters: int,
    steps: int,
    history: list[dict[str, Any]],
) -> dict[str, Any]:
    """Weights (safetensors), tokenizer, ``training_run.json`` and the model card; optional push. Returns what a
    recipe's `main` returns: the metrics, the output folder, the world size, every process's weight fingerprint
    (data parallelism must end with the same weights everywhere) and the number of steps. The caller then ends the
    run with `ending_run`, after letting go of the prepared model (its own references to the DDP wrapper)."""
    run_info = {
        "recipe": f"recipes/{recipe}.py",
        "task": task,
        "dataset": {k: v for k, v in data.items() if v is not None},
        "hyperparameters": hyperparameters,
        "metrics": metrics,
        "num_parameters": parameters,
        "train_steps": steps,
        "train_history": history,
    }
    unwrapped = accelerator.unwrap_model(model)
    sharded = accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED)
    fingerprints = None if sharded else gather_object([weights_fingerprint(unwrapped)])
    full_state_dict = accelerator.get_state_dict(model) if sharded else None
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        output_dir.mkdir(parents=True, exist_ok=True)
        to_save = unwrapped.merge_and_unload() if args.merge_lora else unwrapped
        to_save.save_pretrained(output_dir, state_dict=full_state_dict, safe_serialization=True)
        tokenizer.save_pretrained(output_dir)
        run_info = {
            "tf_family_version": tf_family.__version__,
            "model_type": unwrapped.config.model_type,
            "arch": args.arch,
            "base_model": args.model_name_or_path,
            **run_info,
            "world_size": accelerator.num_processes,
            "rank_weight_sha256": fingerprints,
        }
        (output_dir / RUN_INFO_FILE).write_text(json.dumps(run_info, indent=2) + "\n")
        write_model_card(output_dir, args.hub_model_id)
        if args.push_to_hub:
            pushed = push_folder(output_dir, args.hub_model_id, token=args.hub_token, private=args.hub_private or None)
            logger.info(f"pushed {pushed} to {args.hub_model_id}")
    return {
        **metrics,
        "output_dir": str(output_dir),
        "world_size": accelerator.num_processes,
        "rank_weight_sha256": fingerprints,
        "train_steps": steps,
    }


def num_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


__all__ = [
    "add_common_arguments",
    "apply_lora",
    "build_model",
    "check_lora_head",
    "check_max_length",
    "check_output_dir",
    "default_output_dir",
    "ending_run",
    "epoch_batches",
    "eval_batches",
    "hyperparameters_of",
    "load_tokenizer",
    "make_accelerator",
    "make_optimizer",
    "num_parameters",
    "pad_batch",
    "parse_config_overrides",
    "predict",
    "rows_of",
    "save_run",
    "train",
    "validate_common_args",
]
