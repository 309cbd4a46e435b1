"""Train or fine-tune a causal language model with accelerate: any tf_family architecture, or any saved
``AutoModelForCausalLM`` (ours or plain transformers, e.g. GPT-2).

    accelerate launch recipes/causal_lm.py --arch transfo_xl --variant small --max_train_steps 2000
    accelerate launch -m tf_family.recipes.causal_lm --model_name_or_path runs/my-model --lora_r 8 --merge_lora
    accelerate launch --multi_gpu --num_processes 2 -m tf_family.recipes.causal_lm --cpu ...   # two CPU processes
    tf-family train ...                                  # the same recipe, with the main job's defaults

Reads top to bottom: arguments → Accelerator → data → model → optional LoRA → prepare → train loop (gradient
accumulation, clipping, checkpoints) → `evaluate()` → save (safetensors, tokenizer, model card) → optional push.

Data: the bundled State of the Union corpus by default, a Hub dataset (``--dataset_name``) or local files
(``--train_file``, ``--validation_file``: text, JSON lines, CSV or parquet). Every token is scored exactly once with
next-token targets (`tf_family.data.packing`). Memory models (``memory_model`` in the registry: Transformer-XL, …)
train on ordered streams: each batch row reads documents end to end, the memory (``mems``) is carried from step to
step, and reset where a document starts; each process owns its own rows. Other models see shuffled blocks.

A checkpoint (``--checkpointing_steps``) holds the accelerate state (weights, optimizer, scheduler, RNG), the step
reached and each process's memory, so ``--resume_from_checkpoint latest`` continues exactly where a run stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import json
import logging
import math
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import datasets
import torch
import torch.nn.functional as F
import transformers
from accelerate import Accelerator
from accelerate.logging import get_logger
from accelerate.utils import DistributedDataParallelKwargs, DistributedType, gather_object, set_seed
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, get_scheduler

import tf_family
from tf_family import memory as memory_lib
from tf_family.cards import RUN_INFO_FILE, write_model_card
from tf_family.data import (
    SOTU_TOKENIZER_DIR,
    build_document_streams,
    load_text_datasets,
    pack_into_blocks,
    schedule_shuffled_batches,
    schedule_streams,
)
from tf_family.data.packing import IGNORE_INDEX
from tf_family.hub import push_folder
from tf_family.registry import ARCHITECTURES, get_arch

logger = get_logger(__name__)

SCHEDULERS = ["linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup"]
TRACKERS = {"tensorboard": "tensorboard", "trackio": "trackio", "wandb": "wandb"}
CHECKPOINT_PATTERN = re.compile(r"^step_(\d+)$")
DEFAULT_MEMORY_BLOCK_SIZE = 128
DEFAULT_BLOCK_SIZE = 512


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Train or fine-tune a causal LM with accelerate (tf_family).")
    model = parser.add_argument_group("model")
    model.add_argument("--arch", help=f"train from scratch: one of {list(ARCHITECTURES)}")
    model.add_argument("--variant", default="small", help="named size of --arch (tiny, small, base, …)")
    model.add_argument(
        "--config_overrides",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="config fields for --arch, e.g. n_layer=2 mem_len=64 'cutoffs=[2000,4000]'",
    )
    model.add_argument("--model_name_or_path", help="fine-tune a saved folder or Hub id (any AutoModelForCausalLM)")
    model.add_argument(
        "--tokenizer_name", help="tokenizer folder or Hub id (default: the model's, or the bundled one)"
    )

    data = parser.add_argument_group("data")
    data.add_argument("--dataset_name", default="sotu", help="'sotu' (bundled corpus) or a Hub dataset id")
    data.add_argument("--dataset_config_name")
    data.add_argument("--train_file", help="local .txt/.json/.jsonl/.csv/.parquet file (overrides --dataset_name)")
    data.add_argument("--validation_file")
    data.add_argument("--text_column", help="column holding the text (default: 'text' or the first string column)")
    data.add_argument(
        "--sample_by",
        choices=["document", "paragraph", "line"],
        default="document",
        help="how a .txt file is split into documents",
    )
    data.add_argument("--validation_split_percentage", type=int, default=5)
    data.add_argument("--block_size", type=int, help="tokens per training block / memory segment")
    data.add_argument("--max_train_samples", type=int, help="use only the first N training documents")
    data.add_argument("--max_eval_samples", type=int, help="use only the first N validation documents")

    train = parser.add_argument_group("optimisation")
    train.add_argument("--per_device_train_batch_size", type=int, default=8)
    train.add_argument("--per_device_eval_batch_size", type=int, default=8)
    train.add_argument("--learning_rate", type=float, default=5e-4)
    train.add_argument("--weight_decay", type=float, default=0.01)
    train.add_argument("--num_train_epochs", type=int, default=1)
    train.add_argument("--max_train_steps", type=int, help="optimizer steps in all (overrides --num_train_epochs)")
    train.add_argument("--gradient_accumulation_steps", type=int, default=1)
    train.add_argument("--lr_scheduler_type", choices=SCHEDULERS, default="cosine")
    train.add_argument("--num_warmup_steps", type=int, default=0)
    train.add_argument("--max_grad_norm", type=float, default=1.0, help="gradient clipping; 0 turns it off")
    train.add_argument("--mixed_precision", choices=["no", "fp16", "bf16"], default="no")
    train.add_argument("--seed", type=int, default=42)
    train.add_argument(
        "--cpu",
        action="store_true",
        help="run on CPU even if a GPU is present (two CPU processes: "
        "accelerate launch --multi_gpu --num_processes 2 … --cpu)",
    )

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
    return parser.parse_args(argv)


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


def validate_args(args: argparse.Namespace) -> None:
    """Refuse, before any work, what cannot run; each message says what to change."""
    if (args.arch is None) == (args.model_name_or_path is None):
        raise ValueError("Pass exactly one of --arch (train from scratch) and --model_name_or_path (fine-tune).")
    if args.arch is not None:
        spec = get_arch(args.arch)  # ValueError listing the valid names
        if "causal_lm" not in spec.model_classes:
            causal = [name for name, s in ARCHITECTURES.items() if "causal_lm" in s.model_classes]
            raise ValueError(f"--arch {args.arch} has no causal LM; causal-LM architectures: {causal}.")
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
    for name in (
        "block_size",
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
    if args.lora_r < 0:
        raise ValueError(f"--lora_r={args.lora_r} must be >= 0 (0 turns LoRA off).")
    if args.merge_lora and not args.lora_r:
        raise ValueError("--merge_lora needs --lora_r > 0.")
    if args.push_to_hub and not args.hub_model_id:
        raise ValueError("--push_to_hub needs --hub_model_id user/name.")
    trackers = (
        [] if args.report_to == "none" else list(TRACKERS) if args.report_to == "all" else args.report_to.split(",")
    )
    for tracker in trackers:
        if tracker not in TRACKERS:
            raise ValueError(f"--report_to {tracker!r} is not supported; use none, all or one of {list(TRACKERS)}.")
        if args.report_to != "all" and importlib.util.find_spec(TRACKERS[tracker]) is None:
            raise ValueError(f"--report_to {tracker} needs the {tracker} package: pip install {tracker}.")
    args.trackers = [t for t in trackers if importlib.util.find_spec(TRACKERS[t]) is not None]


def parse_config_overrides(items: list[str]) -> dict[str, Any]:
    """``["n_layer=2", "cutoffs=[100, 200]", "pre_lnorm=true"]`` → typed values (JSON, else the raw string)."""
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--config_overrides {item!r} must look like KEY=VALUE, e.g. n_layer=2.")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    return overrides


def default_output_dir(args: argparse.Namespace) -> str:
    model = args.arch or Path(args.model_name_or_path.rstrip("/")).name
    data = Path(args.train_file).stem if args.train_file else args.dataset_name.replace("/", "_")
    return os.path.join("runs", f"{model}-{data}")


def memory_spec(config) -> Any:
    """The registry entry of ``config`` when it is a memory model, else None."""
    for spec in ARCHITECTURES.values():
        if spec.memory_model and config.model_type in (spec.model_type, *spec.legacy_model_types):
            return spec
    return None


def max_positions(config) -> int | None:
    """The longest block the model can read, when it has absolute positions."""
    for name in ("max_position_embeddings", "n_positions", "n_ctx"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def check_lora_targets(model: torch.nn.Module, targets: list[str]) -> None:
    """PEFT matches a target to a module whose name is the target or ends with ``.target``; refuse targets that
    match nothing, listing the names that would."""
    names = [name for name, _ in model.named_modules() if name]
    linear = sorted({name.split(".")[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
    for target in targets:
        if not any(name == target or name.endswith(f".{target}") for name in names):
            raise ValueError(
                f"--lora_target_modules {target!r} matches no module of {type(model).__name__}; its linear layers "
                f"are named {linear}."
            )


def next_token_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Summed next-token NLL (nats) of the scored positions and their count; ``labels`` are already aligned.

    Works for models whose ``logits`` are log-probabilities (adaptive softmax) too: log-softmax is idempotent.
    """
    count = int((labels != IGNORE_INDEX).sum())
    total = F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum"
    )
    return total, count


def model_inputs(batch: dict[str, torch.Tensor], memory: Any, device: torch.device) -> dict[str, Any]:
    """Forward kwargs for one block batch; memory models get their memory and the rows to reset."""
    inputs: dict[str, Any] = {"input_ids": batch["input_ids"].to(device)}
    if memory is not False:  # False marks a model without memory
        inputs["mems"] = memory
        if memory is not None:
            inputs["reset_mems"] = batch["reset"].to(device)
    return inputs


def rows_of(global_batch: list[int], accelerator: Accelerator, per_device: int) -> list[int]:
    start = accelerator.process_index * per_device
    return global_batch[start : start + per_device]


def evaluate(
    model, blocks, schedule, accelerator: Accelerator, per_device: int, has_memory: bool, num_characters: int
) -> dict[str, float]:
    """Validation loss, perplexity, bits per token and bits per character over every scored token.

    Memory models read the validation streams in order, carrying the memory as in training.
    """
    model.eval()
    totals = torch.zeros(2, dtype=torch.float64, device=accelerator.device)
    memory = None if has_memory else False
    with torch.no_grad():
        for global_batch in schedule:
            # every process runs every step, empty rows included: FSDP (and DDP buffer syncs) gather in forward
            batch = blocks.batch(rows_of(global_batch, accelerator, per_device))
            outputs = model(**model_inputs(batch, memory, accelerator.device))
            nll, count = next_token_loss(outputs.logits, batch["labels"].to(accelerator.device))
            totals += torch.tensor([nll.item(), count], dtype=torch.float64, device=accelerator.device)
            if has_memory:
                memory = outputs.mems
    model.train()
    nll, count = accelerator.reduce(totals, reduction="sum").tolist()
    loss = nll / max(count, 1)
    return {
        "eval_loss": loss,
        "perplexity": math.exp(min(loss, 50.0)),
        "bits_per_token": loss / math.log(2),
        "bits_per_character": nll / math.log(2) / max(num_characters, 1),
        "eval_tokens": int(count),
    }


def unigram_perplexity(train_blocks, eval_blocks, vocab_size: int) -> float:
    """Perplexity of the add-one unigram model of the training targets on the evaluation targets: the floor a
    model that learned anything beats."""
    train = train_blocks.labels[train_blocks.labels != IGNORE_INDEX]
    counts = torch.bincount(train, minlength=vocab_size).double() + 1.0
    log_probs = (counts / counts.sum()).log()
    targets = eval_blocks.labels[eval_blocks.labels != IGNORE_INDEX]
    return math.exp(-log_probs[targets].mean().item())


def check_output_dir(args: argparse.Namespace) -> Path:
    """``--output_dir`` as a path; a folder holding an earlier run is refused unless the run resumes or overwrites
    it (nothing the user saved is replaced by accident)."""
    output_dir = Path(args.output_dir)
    earlier_run = (output_dir / "checkpoints").is_dir() or (output_dir / RUN_INFO_FILE).is_file()
    if earlier_run and not (args.resume_from_checkpoint or args.overwrite_output_dir):
        raise ValueError(
            f"--output_dir {output_dir} holds an earlier run; pass --resume_from_checkpoint latest to continue it, "
            "--overwrite_output_dir to replace it, or another --output_dir."
        )
    return output_dir


def find_checkpoint(output_dir: str, which: str) -> Path:
    if which != "latest":
        path = Path(which)
        if not path.is_dir():
            raise ValueError(f"--resume_from_checkpoint {which!r} is not a folder; pass a checkpoint or 'latest'.")
        return path
    root = Path(output_dir) / "checkpoints"
    steps = sorted(
        (int(m.group(1)), p) for p in root.glob("step_*") if (m := CHECKPOINT_PATTERN.match(p.name)) and p.is_dir()
    )
    if not steps:
        raise ValueError(
            f"--resume_from_checkpoint latest: no checkpoint in {root}; train with --checkpointing_steps."
        )
    return steps[-1][1]


def save_checkpoint(accelerator: Accelerator, output_dir: str, state: dict, memory: Any, limit: int | None) -> Path:
    """Write ``checkpoints/step_N`` atomically: everything goes to ``step_N.partial`` first and is renamed once every
    process has written its part, so an interrupted save never replaces the last good checkpoint."""
    root = Path(output_dir) / "checkpoints"
    final = root / f"step_{state['completed_steps']}"
    partial = root / f"step_{state['completed_steps']}.partial"
    if accelerator.is_main_process and partial.exists():
        shutil.rmtree(partial)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(partial))
    if memory not in (None, False):
        tensors = {k: v.detach().cpu().contiguous() for k, v in memory.state_dict().items()}
        save_file(
            tensors,
            str(partial / f"memory_rank{accelerator.process_index}.safetensors"),
            metadata={"class": type(memory).__name__},
        )
    if accelerator.is_main_process:
        (partial / "trainer_state.json").write_text(json.dumps({**state, "world_size": accelerator.num_processes}))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if final.exists():
            shutil.rmtree(final)
        partial.rename(final)
        if limit is not None:
            kept = sorted(
                (int(CHECKPOINT_PATTERN.match(p.name).group(1)), p)
                for p in root.glob("step_*")
                if CHECKPOINT_PATTERN.match(p.name)
            )
            for _, old in kept[:-limit]:
                shutil.rmtree(old)
    accelerator.wait_for_everyone()
    return final


def load_memory(checkpoint: Path, accelerator: Accelerator) -> Any:
    path = checkpoint / f"memory_rank{accelerator.process_index}.safetensors"
    if not path.is_file():
        return None
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        class_name = handle.metadata()["class"]
    memory_class = getattr(memory_lib, class_name)
    return memory_class.from_state_dict(load_file(str(path), device=str(accelerator.device)))


def weights_fingerprint(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def final_barrier(accelerator: Accelerator) -> Any:
    """`accelerator.wait_for_everyone()` that returns the barrier's work handle under gloo (else None): keep it until
    the process group is destroyed, then drop it.

    Why: a gloo barrier holds weak references to the collectives still in flight when it was issued (here the previous
    barrier and, through it, the ``all_gather`` of `gather_object`), so their work objects and tensors are freed only
    with the barrier's work object. If the Python handle goes first, a gloo worker thread frees them, and it needs the
    GIL for the tensors `gather_object` made in Python. ``~ProcessGroupGloo`` joins the worker threads while holding
    the GIL, so a rank that destroys its group right after the barrier (when it frees the DDP wrapper, whose reducer
    holds the last reference) can deadlock: the worker waits for the GIL, the main thread for the worker. With the
    handle held, the workers free nothing, and this thread frees the lot when it drops the handle.
    """
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if not distributed or torch.distributed.get_backend() != "gloo":
        accelerator.wait_for_everyone()
        return None
    work = torch.distributed.barrier(async_op=True)
    work.wait()
    return work


@contextlib.contextmanager
def ending_run(accelerator: Accelerator):
    """The end of a run: the last barrier (`final_barrier`), then, after the block (where the caller lets go of the
    prepared model: ``model, optimizer, scheduler = accelerator.free_memory(model, optimizer, scheduler)``),
    `accelerator.end_training`, and only then the barrier's handle is dropped."""
    handle = final_barrier(accelerator)
    try:
        yield
    finally:
        accelerator.end_training()
        del handle


def make_accelerator(args: argparse.Namespace, output_dir: Path) -> Accelerator:
    """The recipes' `Accelerator` (gradient accumulation, ``--cpu``, mixed precision, trackers under ``output_dir``),
    with logging set up per process and the seed set. Rejects ``--merge_lora`` under FSDP / DeepSpeed."""
    accelerator = Accelerator(
        # a step can leave parameters without gradient (adaptive-input clusters absent from a batch, heads with loss
        # weight 0, pooler weights a masked LM never uses): DDP must not wait for them (a collective mismatch)
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)],
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        cpu=args.cpu,
        mixed_precision=args.mixed_precision,
        log_with=args.trackers or None,
        project_dir=str(output_dir),
    )
    if args.merge_lora and accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED):
        raise ValueError(
            "--merge_lora cannot merge sharded (FSDP / DeepSpeed) weights; save the adapter (drop --merge_lora) and "
            "merge it afterwards with PeftModel.merge_and_unload() on one process."
        )
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    if not accelerator.is_local_main_process:
        datasets.utils.logging.set_verbosity_error()
        transformers.utils.logging.set_verbosity_error()
    set_seed(args.seed)
    return accelerator


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    validate_args(args)
    args.output_dir = args.output_dir or default_output_dir(args)
    config_overrides = parse_config_overrides(args.config_overrides)
    output_dir = check_output_dir(args)

    accelerator = make_accelerator(args, output_dir)

    # ---- data -------------------------------------------------------------------------------------------------
    raw, text_column = load_text_datasets(
        args.dataset_name,
        args.dataset_config_name,
        args.train_file,
        args.validation_file,
        args.text_column,
        args.validation_split_percentage,
        args.sample_by,
    )
    if args.max_train_samples:
        raw["train"] = raw["train"].select(range(min(args.max_train_samples, len(raw["train"]))))
    if args.max_eval_samples:
        raw["validation"] = raw["validation"].select(range(min(args.max_eval_samples, len(raw["validation"]))))

    tokenizer_source = args.tokenizer_name or args.model_name_or_path or str(SOTU_TOKENIZER_DIR)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_source)
    separator_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.pad_token_id
    if separator_id is None:
        raise ValueError(
            f"the tokenizer {tokenizer_source} has neither an eos nor a pad token to separate documents; "
            "pass --tokenizer_name with one that has."
        )

    # ---- model ------------------------------------------------------------------------------------------------
    if args.arch:
        spec = get_arch(args.arch)
        token_ids = {"eos_token_id": separator_id, "bos_token_id": separator_id, "pad_token_id": separator_id}
        config = spec.make_config(args.variant, **{"vocab_size": len(tokenizer), **token_ids, **config_overrides})
        model = spec.model_classes["causal_lm"](config)
    else:
        config = AutoConfig.from_pretrained(args.model_name_or_path, **config_overrides)
        model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path, config=config)
        vocab = getattr(model.config, "vocab_size", None)
        if vocab is not None and len(tokenizer) > vocab:
            raise ValueError(
                f"the tokenizer has {len(tokenizer)} ids but the model embeds {vocab}; pass the model's "
                "own tokenizer with --tokenizer_name."
            )
    spec_memory = memory_spec(model.config)
    has_memory = spec_memory is not None
    limit = max_positions(model.config)
    block_size = args.block_size or (
        DEFAULT_MEMORY_BLOCK_SIZE if has_memory else min(DEFAULT_BLOCK_SIZE, limit or DEFAULT_BLOCK_SIZE)
    )
    if limit is not None and block_size > limit:
        raise ValueError(
            f"--block_size {block_size} is longer than the {limit} positions {type(model).__name__} "
            f"supports; pass --block_size {limit} or less."
        )

    with accelerator.main_process_first():
        tokenized = raw.map(
            lambda rows: {
                "input_ids": tokenizer(rows[text_column], add_special_tokens=False)["input_ids"],
                "num_characters": [len(text) for text in rows[text_column]],
            },
            batched=True,
            remove_columns=raw["train"].column_names,
            desc="tokenizing",
        )
    train_docs, eval_docs = list(tokenized["train"]["input_ids"]), list(tokenized["validation"]["input_ids"])
    eval_characters = int(sum(tokenized["validation"]["num_characters"]))
    world, per_device = accelerator.num_processes, args.per_device_train_batch_size
    if has_memory:
        train_blocks, train_doc_blocks = build_document_streams(train_docs, block_size, separator_id)
        eval_blocks, eval_doc_blocks = build_document_streams(eval_docs, block_size, separator_id)

        def train_schedule(epoch: int) -> list[list[int]]:
            return schedule_streams(train_doc_blocks, world * per_device, args.seed, epoch)

        eval_schedule = schedule_streams(eval_doc_blocks, world * args.per_device_eval_batch_size, 0, shuffle=False)
    else:
        train_blocks = pack_into_blocks(train_docs, block_size, separator_id)
        eval_blocks = pack_into_blocks(eval_docs, block_size, separator_id)

        def train_schedule(epoch: int) -> list[list[int]]:
            return schedule_shuffled_batches(len(train_blocks), world * per_device, args.seed, epoch)

        eval_schedule = schedule_shuffled_batches(
            len(eval_blocks), world * args.per_device_eval_batch_size, 0, shuffle=False, drop_last=False
        )
    micro_per_epoch = len(train_schedule(0))
    if micro_per_epoch == 0:
        raise ValueError(
            f"the training data fills {len(train_blocks)} blocks of {block_size} tokens, fewer than one "
            f"batch of {world * per_device}; lower --per_device_train_batch_size or --block_size."
        )

    # ---- LoRA -------------------------------------------------------------------------------------------------
    if args.lora_r:
        from peft import LoraConfig, get_peft_model

        registry_spec = next(
            (s for s in ARCHITECTURES.values() if model.config.model_type in (s.model_type, *s.legacy_model_types)),
            None,
        )
        targets = args.lora_target_modules or (list(registry_spec.lora_target_modules) if registry_spec else None)
        if targets:
            check_lora_targets(model, targets)
        model = get_peft_model(
            model,
            LoraConfig(
                r=args.lora_r,
                lora_alpha=args.lora_alpha,
                lora_dropout=args.lora_dropout,
                target_modules=targets,
                task_type="CAUSAL_LM",
            ),
        )

    # ---- optimizer, schedule ----------------------------------------------------------------------------------
    # the usual no-decay groups: biases (incl. Transformer-XL's u/v position biases) and normalisation weights
    decay, skip = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (skip if param.ndim < 2 or name.endswith("bias") else decay).append(param)
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": skip, "weight_decay": 0.0}],
        lr=args.learning_rate,
    )
    updates_per_epoch = micro_per_epoch // args.gradient_accumulation_steps
    if updates_per_epoch == 0:
        raise ValueError(
            f"an epoch has {micro_per_epoch} batches, fewer than --gradient_accumulation_steps "
            f"{args.gradient_accumulation_steps}; lower it or the batch size."
        )
    max_train_steps = args.max_train_steps or args.num_train_epochs * updates_per_epoch
    num_epochs = math.ceil(max_train_steps / updates_per_epoch)
    # a prepared scheduler advances once per process at every optimizer step (accelerate's convention), so the
    # schedule is laid out in process-steps
    scheduler = get_scheduler(
        args.lr_scheduler_type,
        optimizer,
        num_warmup_steps=args.num_warmup_steps * world,
        num_training_steps=max_train_steps * world,
    )
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)

    hyperparameters = {
        "arch": args.arch,
        "variant": args.variant if args.arch else None,
        "base_model": args.model_name_or_path,
        "block_size": block_size,
        "per_device_train_batch_size": per_device,
        "world_size": world,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "effective_batch_tokens": world * per_device * args.gradient_accumulation_steps * block_size,
        "learning_rate": args.learning_rate,
        "weight_decay": args.weight_decay,
        "lr_scheduler": args.lr_scheduler_type,
        "num_warmup_steps": args.num_warmup_steps,
        "max_grad_norm": args.max_grad_norm,
        "max_train_steps": max_train_steps,
        "mixed_precision": args.mixed_precision,
        "seed": args.seed,
        "memory_streams": has_memory,
        **({"config_overrides": " ".join(args.config_overrides)} if args.config_overrides else {}),
        **(
            {
                "lora_r": args.lora_r,
                "lora_alpha": args.lora_alpha,
                "lora_dropout": args.lora_dropout,
                "merge_lora": args.merge_lora,
            }
            if args.lora_r
            else {}
        ),
    }
    hyperparameters = {k: v for k, v in hyperparameters.items() if v is not None}
    if args.trackers:
        accelerator.init_trackers("tf_family_causal_lm", config=hyperparameters)

    # ---- resume -----------------------------------------------------------------------------------------------
    completed_steps, start_epoch, resume_update = 0, 0, 0
    memory: Any = None if has_memory else False
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
        if has_memory:
            memory = load_memory(checkpoint, accelerator)
        logger.info(f"resumed from {checkpoint} at step {completed_steps}", main_process_only=True)

    # ---- train ------------------------------------------------------------------------------------------------
    num_parameters = sum(p.numel() for p in model.parameters())
    logger.info(
        f"{num_parameters:,} parameters, {len(train_blocks)} training blocks of {block_size} tokens, "
        f"{max_train_steps} steps on {world} process(es)",
        main_process_only=True,
    )
    progress = tqdm(
        total=max_train_steps, initial=completed_steps, disable=not accelerator.is_local_main_process, desc="training"
    )
    model.train()
    history: list[dict[str, float]] = []
    window_loss, window_tokens, window_start = 0.0, 0, time.perf_counter()
    accumulation = args.gradient_accumulation_steps
    for epoch in range(start_epoch, num_epochs):
        if completed_steps >= max_train_steps:
            break
        schedule = train_schedule(epoch)
        # whole optimizer steps only: micro-batches that do not fill one are left out of this epoch
        schedule = schedule[: len(schedule) - len(schedule) % accumulation]
        first_update = resume_update if epoch == start_epoch else 0
        if first_update == 0:  # streams start again at the top of every epoch: so does the memory
            memory = None if has_memory else False
        for micro_index in range(first_update * accumulation, len(schedule)):
            batch = train_blocks.batch(rows_of(schedule[micro_index], accelerator, per_device))
            labels = batch["labels"].to(accelerator.device)
            # accumulate(): gradients are all-reduced and the optimizer steps on every `accumulation`-th micro-batch
            with accelerator.accumulate(model):
                with accelerator.autocast():
                    outputs = model(**model_inputs(batch, memory, accelerator.device))
                nll, count = next_token_loss(outputs.logits, labels)
                # a batch with nothing to score still takes part in the gradient all-reduce
                loss = nll / count if count else outputs.logits.sum() * 0.0
                if getattr(outputs, "aux_loss", None) is not None:  # e.g. the Compressive Transformer's
                    loss = loss + outputs.aux_loss  # attention-reconstruction loss, which trains its compression
                accelerator.backward(loss)
                if accelerator.sync_gradients and args.max_grad_norm > 0:
                    accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            if has_memory:
                memory = outputs.mems
            window_loss += nll.item()
            window_tokens += count
            if not accelerator.sync_gradients:
                continue
            completed_steps += 1
            update_index = (micro_index + 1) // accumulation  # optimizer steps done in this epoch
            progress.update(1)

            if completed_steps % args.logging_steps == 0 or completed_steps == max_train_steps:
                totals = accelerator.reduce(
                    torch.tensor([window_loss, window_tokens], dtype=torch.float64, device=accelerator.device),
                    reduction="sum",
                ).tolist()
                seconds = time.perf_counter() - window_start
                record = {
                    "train_loss": totals[0] / max(totals[1], 1),
                    "tokens_per_second": totals[1] / seconds,
                    "learning_rate": scheduler.get_last_lr()[0],
                    "step": completed_steps,
                }
                history.append(record)
                progress.set_postfix(loss=f"{record['train_loss']:.3f}", tok_s=f"{record['tokens_per_second']:.0f}")
                accelerator.log({k: v for k, v in record.items() if k != "step"}, step=completed_steps)
                window_loss, window_tokens, window_start = 0.0, 0, time.perf_counter()
            if args.eval_steps and completed_steps % args.eval_steps == 0 and completed_steps < max_train_steps:
                metrics = evaluate(
                    model,
                    eval_blocks,
                    eval_schedule,
                    accelerator,
                    args.per_device_eval_batch_size,
                    has_memory,
                    eval_characters,
                )
                accelerator.log({f"eval/{k}": v for k, v in metrics.items()}, step=completed_steps)
                logger.info(f"step {completed_steps}: {metrics}", main_process_only=True)
            if args.checkpointing_steps and completed_steps % args.checkpointing_steps == 0:
                state = {"completed_steps": completed_steps, "epoch": epoch, "update_in_epoch": update_index}
                if update_index == len(schedule) // accumulation:
                    state.update(epoch=epoch + 1, update_in_epoch=0)
                save_checkpoint(accelerator, args.output_dir, state, memory, args.checkpoints_total_limit)
            if completed_steps >= max_train_steps:
                break
    progress.close()

    # ---- evaluate ---------------------------------------------------------------------------------------------
    metrics = evaluate(
        model, eval_blocks, eval_schedule, accelerator, args.per_device_eval_batch_size, has_memory, eval_characters
    )
    unwrapped = accelerator.unwrap_model(model)
    vocab_size = max(getattr(unwrapped.config, "vocab_size", 0) or 0, len(tokenizer))
    metrics["unigram_perplexity"] = unigram_perplexity(train_blocks, eval_blocks, vocab_size)
    accelerator.log({f"eval/{k}": v for k, v in metrics.items()}, step=completed_steps)
    logger.info(f"validation: {metrics}", main_process_only=True)

    # ---- save -------------------------------------------------------------------------------------------------
    sharded = accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED)
    # under data parallelism every process must end with the same weights; the record lets a reader (and the
    # tests) check it. FSDP / DeepSpeed hold shards instead: their full state dict is gathered (by every process).
    fingerprints = None if sharded else gather_object([weights_fingerprint(unwrapped)])
    full_state_dict = accelerator.get_state_dict(model) if sharded else None
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        output_dir.mkdir(parents=True, exist_ok=True)
        to_save = unwrapped.merge_and_unload() if args.merge_lora else unwrapped
        to_save.save_pretrained(output_dir, state_dict=full_state_dict, safe_serialization=True)
        tokenizer.save_pretrained(output_dir)
        data = {
            "name": args.dataset_name if not args.train_file else None,
            "title": "State of the Union addresses 1790-2021 (bundled with tf_family)"
            if args.dataset_name == "sotu" and not args.train_file
            else (args.dataset_name or "local files"),
            "on_hub": bool(args.dataset_name and args.dataset_name != "sotu" and not args.train_file),
            "train_file": args.train_file,
            "validation_file": args.validation_file,
            "text_column": text_column,
            "train_documents": len(train_docs),
            "train_tokens": int(sum(map(len, train_docs))),
            "eval_documents": len(eval_docs),
            "eval_tokens": int(sum(map(len, eval_docs))),
            "eval_split": "validation",
        }
        if data["title"].startswith("State of the Union"):
            data["description"] = (
                "The State of the Union addresses 1790-1994 (train) and 1995-2009 (validation), "
                "bundled with tf_family (`tf_family.data.load_sotu`), public domain."
            )
        run_info = {
            "recipe": "recipes/causal_lm.py",
            "task": "causal_lm",
            "tf_family_version": tf_family.__version__,
            "model_type": unwrapped.config.model_type,
            "arch": args.arch,
            "base_model": args.model_name_or_path,
            "dataset": {k: v for k, v in data.items() if v is not None},
            "hyperparameters": hyperparameters,
            "metrics": metrics,
            "num_parameters": num_parameters,
            "train_steps": completed_steps,
            "world_size": world,
            "rank_weight_sha256": fingerprints,
            "train_history": history,
        }
        (output_dir / RUN_INFO_FILE).write_text(json.dumps(run_info, indent=2) + "\n")
        write_model_card(output_dir, args.hub_model_id)
        if args.push_to_hub:
            pushed = push_folder(output_dir, args.hub_model_id, token=args.hub_token, private=args.hub_private or None)
            logger.info(f"pushed {pushed} to {args.hub_model_id}")
    with ending_run(accelerator):
        model, optimizer, scheduler = accelerator.free_memory(model, optimizer, scheduler)  # DDP holds the group
    return {
        **metrics,
        "output_dir": str(output_dir),
        "world_size": world,
        "rank_weight_sha256": fingerprints,
        "train_steps": completed_steps,
    }


if __name__ == "__main__":
    main()
