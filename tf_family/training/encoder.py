"""What the encoder task recipes (sequence classification, masked LM, question answering) share beyond the rest of
`tf_family.training`: their arguments and checks, the tokenizer and its special tokens, the model from the registry
or a saved folder, batches of examples, prediction over a split, and one training loop (gradient accumulation,
clipping, logging, atomic checkpoints, exact resume). The loop is the same for the three tasks (each passes the
batches it builds and its evaluation), so it is written once here rather than three times in the recipes.

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
import inspect
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.logging import get_logger
from accelerate.utils import gather_object
from tqdm.auto import tqdm
from transformers import AutoConfig, AutoTokenizer

from ..data import SOTU_TOKENIZER_DIR
from ..data.packing import EMPTY_BLOCK
from ..modeling.utils import max_input_length
from ..registry import get_arch
from .arguments import (
    add_lora_and_hub_arguments,
    add_optimisation_arguments,
    add_run_arguments,
    architectures_with,
    check_at_least,
    check_model_source,
    timestamped_run_dir,
    validate_run_args,
)
from .checkpointing import resume, save_checkpoint
from .run import Run

logger = get_logger(__name__)

# special tokens added to a tokenizer that lacks them (see the module docstring)
ADDED_SPECIAL_TOKENS = {"cls_token": "<cls>", "sep_token": "<sep>", "mask_token": "<mask>"}


def add_common_arguments(parser: argparse.ArgumentParser, task: str, default_dataset: str, max_length: int) -> None:
    """The arguments every encoder recipe takes; ``task`` is the registry task name (e.g. ``masked_lm``)."""
    model = parser.add_argument_group("model")
    model.add_argument("--arch", help=f"train from scratch: one of {architectures_with(task)}")
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
    data.add_argument(
        "--max_eval_samples",
        type=int,
        help="use only the first N evaluation examples (0: all; default: all, or 4 in a run of under 100 steps)",
    )

    add_optimisation_arguments(
        parser, learning_rate=5e-5 if task != "masked_lm" else 5e-4, lr_scheduler_type="linear", num_train_epochs=3
    )
    add_run_arguments(parser, default_output_dir="runs/<model>-<task>-<data>-<time>", logging_steps=10)
    add_lora_and_hub_arguments(parser)


def validate_common_args(args: argparse.Namespace, task: str, min_length: int = 3) -> None:
    """Refuse, before any work, what cannot run; each message says what to change."""
    check_model_source(args, task, "--arch {arch} has no " + task + " model; architectures with one: {able}.")
    check_at_least(args, ("per_device_train_batch_size", "per_device_eval_batch_size", "num_train_epochs"))
    if args.max_length < min_length:
        raise ValueError(f"--max_length={args.max_length} must be at least {min_length} (special tokens included).")
    check_at_least(args, ("max_train_samples",))
    check_at_least(args, ("max_eval_samples",), minimum=0)
    if args.learning_rate <= 0:
        raise ValueError(f"--learning_rate={args.learning_rate} must be positive.")
    if args.validation_file and not args.train_file:
        raise ValueError("--validation_file needs --train_file too (local files replace --dataset_name).")
    validate_run_args(args)


def default_output_dir(args: argparse.Namespace, task: str) -> str:
    model = args.arch or Path(args.model_name_or_path.rstrip("/")).name
    data = Path(args.train_file).stem if args.train_file else args.dataset_name.replace("/", "_")
    return timestamped_run_dir(f"{model}-{task}-{data}")


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


def check_max_length(args: argparse.Namespace, model) -> None:
    limit = max_input_length(model.config)
    if limit is not None and args.max_length > limit:
        raise ValueError(
            f"--max_length {args.max_length} is longer than the {limit} tokens {type(model).__name__} can read; pass "
            f"--max_length {limit} or less, or a larger max_position_embeddings (--config_overrides)."
        )


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
        schedule = eval_batches(num_examples, world * per_device)
        for global_batch in tqdm(
            schedule, desc="evaluating", disable=not accelerator.is_local_main_process, leave=False
        ):
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
    parameters = inspect.signature(model.forward).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):  # e.g. a PEFT wrapper
        return set(batch)
    return {k for k in batch if k in parameters}


def _start_position(accelerator: Accelerator, args: argparse.Namespace) -> tuple[int, int, int]:
    """Where the loop starts: the optimizer steps done, the epoch and the update within it (all 0 unless
    ``--resume_from_checkpoint``)."""
    if not args.resume_from_checkpoint:
        return 0, 0, 0
    _, state = resume(accelerator, args)
    return state["completed_steps"], state["epoch"], state["update_in_epoch"]


def train(
    run: Run, num_examples: int, collate: Callable, evaluate: Callable[[], dict[str, float]], described: str
) -> list[dict[str, float]]:
    """The training loop of a prepared `Run` over ``num_examples`` (``described`` in the opening log line):
    ``collate(indices, train=True, epoch=…, step=…)`` builds a batch with its targets (the model computes the loss),
    ``evaluate()`` runs every ``--eval_steps``. Keeps the optimizer steps done in ``run.completed_steps``; returns the
    logged history."""
    accelerator, args, model = run.accelerator, run.args, run.model
    world, per_device, accumulation = run.world, args.per_device_train_batch_size, args.gradient_accumulation_steps
    max_train_steps = run.max_train_steps
    updates_per_epoch = len(epoch_batches(num_examples, world * per_device, args.seed, 0)) // accumulation
    num_epochs = math.ceil(max_train_steps / updates_per_epoch)
    run.completed_steps, start_epoch, resume_update = _start_position(accelerator, args)
    input_names = None
    progress, log = run.start_training(
        "examples_per_second", f"{described}, {max_train_steps} steps on {world} process(es)"
    )
    for epoch in range(start_epoch, num_epochs):
        if run.completed_steps >= max_train_steps:
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
                run.optimizer_step(loss)
            log.add(loss.item(), 1, len(indices))
            if not accelerator.sync_gradients:
                continue
            run.completed_steps += 1
            update_index = (micro_index + 1) // accumulation
            progress.update(1)
            if run.completed_steps % args.logging_steps == 0 or run.completed_steps == max_train_steps:
                record = log.write(run.completed_steps, run.scheduler.get_last_lr()[0])
                progress.set_postfix(loss=f"{record['train_loss']:.3f}")
            if (
                args.eval_steps
                and run.completed_steps % args.eval_steps == 0
                and run.completed_steps < max_train_steps
            ):
                run.log_metrics(evaluate(), label=f"step {run.completed_steps}")
            if args.checkpointing_steps and run.completed_steps % args.checkpointing_steps == 0:
                state = {"completed_steps": run.completed_steps, "epoch": epoch, "update_in_epoch": update_index}
                if update_index == len(schedule) // accumulation:
                    state.update(epoch=epoch + 1, update_in_epoch=0)
                save_checkpoint(accelerator, args.output_dir, state, None, args.checkpoints_total_limit)
            if run.completed_steps >= max_train_steps:
                break
    progress.close()
    return log.history


def updates_per_epoch(run: Run, num_examples: int, described: str, fix: str) -> int:
    """Optimizer steps in one epoch of ``num_examples``; none (``described`` says what the data makes) is refused
    with ``fix``."""
    args = run.args
    updates = num_examples // (run.world * args.per_device_train_batch_size) // args.gradient_accumulation_steps
    if updates == 0:
        raise ValueError(
            f"{described}, fewer than one optimizer step of {run.world} × {args.per_device_train_batch_size} × "
            f"{args.gradient_accumulation_steps}; lower {fix}."
        )
    return updates


def first_rows(rows, count: int | None):
    """The first ``count`` rows of a dataset (all with ``count`` 0 or None): ``--max_train_samples`` and the like."""
    return rows.select(range(min(count, len(rows)))) if count else rows


def num_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


__all__ = [
    "add_common_arguments",
    "build_model",
    "check_max_length",
    "default_output_dir",
    "epoch_batches",
    "eval_batches",
    "first_rows",
    "load_tokenizer",
    "num_parameters",
    "pad_batch",
    "predict",
    "rows_of",
    "train",
    "updates_per_epoch",
    "validate_common_args",
]
