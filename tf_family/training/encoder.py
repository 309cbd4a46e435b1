"""What the encoder task recipes (sequence classification, masked LM, question answering) share beyond the rest of
`tf_family.training`: their arguments and checks, the tokenizer and its special tokens, the model from the registry
or a saved folder, batches of examples, and the named steps of their training loops, which the recipes write out
(as accelerate's examples do): `example_loaders` (the examples through `DataLoader`s prepared by accelerate),
`resume_position`, `epoch_batches` (resumed with ``accelerate.skip_first_batches``), `training_step`,
`after_optimizer_step` (log, evaluation, atomic checkpoint) and `gather_predictions` (prediction over a split).
The image recipe (`recipes/image_modeling.py`) uses the same steps.

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator, skip_first_batches
from accelerate.logging import get_logger
from accelerate.utils import gather_object
from tqdm.auto import tqdm
from transformers import AutoConfig, AutoTokenizer

from ..data import SOTU_TOKENIZER_DIR
from ..data.sampling import ExampleDataset, ShuffledBlockSampler, example_loader
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


def model_input_names(model, batch: dict) -> set[str]:
    parameters = inspect.signature(model.forward).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):  # e.g. a PEFT wrapper
        return set(batch)
    return {k for k in batch if k in parameters}


def example_loaders(
    run: Run, collate: Callable[[list[int], int], dict], num_examples: int, evaluation: dict[str, tuple[Callable, int]]
) -> tuple[torch.utils.data.DataLoader, dict[str, torch.utils.data.DataLoader]]:
    """The training loader (``num_examples`` examples shuffled by ``(seed, epoch)`` in whole groups of
    ``--gradient_accumulation_steps``, a last partial batch dropped) and one evaluation loader per split of
    ``evaluation`` (``{split: (collate, num_examples)}``, every example once, in order), each prepared by accelerate:
    each process reads its own rows of every step (`tf_family.data.sampling`). ``collate(indices, epoch)`` builds
    a batch (`ExampleDataset`)."""
    args, world, accelerator = run.args, run.world, run.accelerator
    train_sampler = ShuffledBlockSampler(
        num_examples, args.per_device_train_batch_size, world, args.seed, whole_steps=args.gradient_accumulation_steps
    )
    train_dataloader = accelerator.prepare(example_loader(ExampleDataset(num_examples, collate), train_sampler))
    eval_dataloaders = {}
    for split, (eval_collate, eval_examples) in evaluation.items():
        sampler = ShuffledBlockSampler(
            eval_examples, args.per_device_eval_batch_size, world, shuffle=False, drop_last_batch=False
        )
        eval_dataloaders[split] = accelerator.prepare(
            example_loader(ExampleDataset(eval_examples, eval_collate), sampler)
        )
    return train_dataloader, eval_dataloaders


def gather_predictions(accelerator: Accelerator, model, dataloader, read: Callable) -> list:
    """Run the (unwrapped) model over a prepared evaluation loader (`example_loaders`: every example once, split
    across processes); returns ``read(outputs, batch, indices)``'s items from every process, in example order.
    ``read`` returns a list of ``(index, value)``."""
    unwrapped = accelerator.unwrap_model(model)
    unwrapped.eval()
    items = []
    with torch.no_grad():
        for batch in tqdm(dataloader, desc="evaluating", disable=not accelerator.is_local_main_process, leave=False):
            if not batch:  # this process's part of the last step is filler
                continue
            indices = batch.pop("example_index").tolist()
            with accelerator.autocast():
                outputs = unwrapped(**{k: v for k, v in batch.items() if k in model_input_names(unwrapped, batch)})
            items.extend(read(outputs, batch, indices))
    unwrapped.train()
    gathered = gather_object(items) if accelerator.num_processes > 1 else items
    return [value for _, value in sorted(gathered, key=lambda item: item[0])]


def resume_position(run: Run) -> tuple[int, int]:
    """With ``--resume_from_checkpoint``: the saved state restored (weights, optimizer, schedule, RNG) and
    ``run.completed_steps`` set; returns the epoch and the optimizer step in it to continue from (0, 0 otherwise)."""
    if not run.args.resume_from_checkpoint:
        return 0, 0
    _, state = resume(run.accelerator, run.args)
    run.completed_steps = state["completed_steps"]
    return state["epoch"], state["update_in_epoch"]


def epoch_batches(run: Run, dataloader, epoch: int, first_update: int):
    """This process's micro-batches of ``epoch`` from optimizer step ``first_update`` on (the prepared loader in the
    epoch's order, ``skip_first_batches`` past what a resumed run has done), and the optimizer steps in the epoch."""
    accumulation = run.args.gradient_accumulation_steps
    dataloader.set_epoch(epoch)  # the sampler's order of this epoch (seed + epoch)
    # and the dataset's (a masked LM's masks): accelerate passes the epoch on to it only when it does not shard the
    # batch sampler, that is in one process
    dataloader.dataset.set_epoch(epoch)
    updates = len(dataloader) // accumulation
    return (skip_first_batches(dataloader, first_update * accumulation) if first_update else dataloader), updates


def training_step(run: Run, batch: dict[str, torch.Tensor]) -> tuple[float, int]:
    """One micro-batch inside accelerate's gradient accumulation: forward (the model computes the loss from the
    batch's targets), backward, and on the micro-batch that syncs the gradients, clipping and the optimizer step
    (`Run.optimizer_step`). Returns the loss and the examples read."""
    accelerator, model = run.accelerator, run.model
    examples = len(batch.pop("example_index"))
    input_names = model_input_names(accelerator.unwrap_model(model), batch)
    with accelerator.accumulate(model):
        with accelerator.autocast():
            outputs = model(**{k: v for k, v in batch.items() if k in input_names})
        loss = outputs.loss
        run.optimizer_step(loss)
    return loss.item(), examples


def after_optimizer_step(
    run: Run, log, evaluate: Callable[[], dict[str, float]], position: tuple[int, int, int]
) -> dict[str, float] | None:
    """What follows an optimizer step: the log line (``--logging_steps``, returned), ``evaluate()``
    (``--eval_steps``) and a checkpoint (``--checkpointing_steps``); ``position`` is the epoch, the optimizer steps
    done in it and the optimizer steps it has."""
    args, steps, record = run.args, run.completed_steps, None
    if steps % args.logging_steps == 0 or steps == run.max_train_steps:
        record = log.write(steps, run.scheduler.get_last_lr()[0])
    if args.eval_steps and steps % args.eval_steps == 0 and steps < run.max_train_steps:
        run.log_metrics(evaluate(), label=f"step {steps}")
    if args.checkpointing_steps and steps % args.checkpointing_steps == 0:
        epoch, update, updates_in_epoch = position
        if update == updates_in_epoch:  # the epoch is done: a resumed run starts the next one
            epoch, update = epoch + 1, 0
        state = {"completed_steps": steps, "epoch": epoch, "update_in_epoch": update}
        save_checkpoint(run.accelerator, args.output_dir, state, None, args.checkpoints_total_limit)
    return record


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
    "after_optimizer_step",
    "build_model",
    "check_max_length",
    "default_output_dir",
    "epoch_batches",
    "example_loaders",
    "first_rows",
    "gather_predictions",
    "load_tokenizer",
    "num_parameters",
    "pad_batch",
    "resume_position",
    "training_step",
    "updates_per_epoch",
    "validate_common_args",
]
