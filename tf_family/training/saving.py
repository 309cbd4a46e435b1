"""The end of a run: the weights (safetensors; merged LoRA on request), the tokenizer, the run record
(``training_run.json``), the model card made from it, and the optional push to the Hub.

Under data parallelism every process must end with the same weights: each process's weight fingerprint goes into
the record (``rank_weight_sha256``), so a reader (and the tests) can check it. FSDP / DeepSpeed hold shards instead:
their full state dict is gathered (by every process) and no fingerprints are taken.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.logging import get_logger
from accelerate.utils import DistributedType, gather_object

from .. import __version__
from ..shipping.cards import RUN_INFO_FILE, write_model_card
from ..shipping.hub import hub_id_of, portable_reference, push_folder
from ..utils.files import atomic_write_text

logger = get_logger(__name__)


def weights_fingerprint(model: torch.nn.Module) -> str:
    """SHA-256 of the model's state dict (names and bytes, in name order)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())  # 0-d too
    return digest.hexdigest()


# what transformers writes into tokenizer_config.json from the loading call, true only where the run was
TOKENIZER_LOAD_KEYS = ("is_local", "local_files_only")


def save_tokenizer(tokenizer, output_dir: str | Path) -> None:
    """``tokenizer.save_pretrained(output_dir)`` without the loading call's ``is_local`` / ``local_files_only``
    (a folder loaded from the Hub would otherwise say it is local and must not be fetched)."""
    tokenizer.save_pretrained(output_dir)
    path = Path(output_dir) / "tokenizer_config.json"
    if path.is_file():
        config = json.loads(path.read_text(encoding="utf-8"))
        if any(key in config for key in TOKENIZER_LOAD_KEYS):
            for key in TOKENIZER_LOAD_KEYS:
                config.pop(key, None)
            atomic_write_text(path, json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def point_adapter_at_base(model, base_model: str) -> None:
    """Make a PEFT model's saved ``adapter_config.json`` name ``base_model`` (`tf_family.shipping.hub.portable_reference`:
    a Hub id, else an absolute path) instead of the path as it was typed, relative to wherever the run started."""
    for config in getattr(model, "peft_config", {}).values():
        config.base_model_name_or_path = base_model


def save_model(
    accelerator: Accelerator, model, output_dir: Path, merge_lora: bool, tokenizer=None
) -> list[str] | None:
    """Every process calls it; the main process writes the weights (and ``tokenizer``) into ``output_dir``.
    Returns every process's weight fingerprint, in rank order (None under FSDP / DeepSpeed)."""
    unwrapped = accelerator.unwrap_model(model)
    sharded = accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED)
    fingerprints = None if sharded else gather_object([weights_fingerprint(unwrapped)])
    full_state_dict = accelerator.get_state_dict(model) if sharded else None
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        output_dir.mkdir(parents=True, exist_ok=True)
        to_save = unwrapped.merge_and_unload() if merge_lora else unwrapped
        to_save.save_pretrained(output_dir, state_dict=full_state_dict, safe_serialization=True)
        if tokenizer is not None:
            save_tokenizer(tokenizer, output_dir)
    return fingerprints


def run_hyperparameters(
    args: argparse.Namespace, world_size: int, max_train_steps: int, **task_values: Any
) -> dict[str, Any]:
    """The run's settings for the record and the trackers: the model's source, ``task_values`` (e.g. the block size),
    the optimisation, the config overrides and LoRA; unset values are left out."""
    values = {
        "arch": args.arch,
        "variant": args.variant if args.arch else None,
        "base_model": portable_reference(args.model_name_or_path) if args.model_name_or_path else None,
        **task_values,
        "per_device_train_batch_size": args.per_device_train_batch_size,
        "world_size": world_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "learning_rate": args.learning_rate,
        "weight_decay": args.weight_decay,
        "lr_scheduler": args.lr_scheduler_type,
        "num_warmup_steps": args.num_warmup_steps,
        "max_grad_norm": args.max_grad_norm,
        "max_train_steps": max_train_steps,
        "mixed_precision": args.mixed_precision,
        "seed": args.seed,
        # evaluation on the first N validation examples only (a smoke run's cap, or --max_eval_samples)
        "max_eval_samples": getattr(args, "max_eval_samples", None),
        **({"config_overrides": " ".join(args.config_overrides)} if args.config_overrides else {}),
        **(
            {"lora_r": args.lora_r, "lora_alpha": args.lora_alpha, "lora_dropout": args.lora_dropout,
             "merge_lora": args.merge_lora}
            if args.lora_r
            else {}
        ),
    }  # fmt: skip
    return {k: v for k, v in values.items() if v is not None}


def run_record(
    args: argparse.Namespace,
    model,
    *,
    recipe: str,
    task: str,
    dataset: dict[str, Any],
    hyperparameters: dict[str, Any],
    metrics: dict[str, Any],
    num_parameters: int,
    train_steps: int,
    world_size: int,
    fingerprints: list[str] | None,
    history: list[dict[str, Any]],
    **extra: Any,
) -> dict[str, Any]:
    """The content of ``training_run.json`` (what the model card is made from): the recipe and task, the model's
    type and source, the data (unset fields left out), the settings, the metrics (``extra`` follows them, e.g. the
    Decision Transformer's evaluations), the size of the run and the logged history. ``model`` is unwrapped.

    Thirteen parameters: after the arguments and the model, one keyword per field of the record it writes."""
    return {
        "recipe": f"recipes/{recipe}.py",
        "task": task,
        "tf_family_version": __version__,
        "model_type": model.config.model_type,
        "arch": args.arch,
        # a Hub id when known, else an absolute path: what the folder was fine-tuned from (an adapter needs it)
        "base_model": portable_reference(args.model_name_or_path) if args.model_name_or_path else None,
        "base_model_on_hub": hub_id_of(args.model_name_or_path) is not None if args.model_name_or_path else None,
        "adapter": bool(getattr(args, "lora_r", 0)) and not getattr(args, "merge_lora", False),
        "dataset": {k: v for k, v in dataset.items() if v is not None},
        "hyperparameters": hyperparameters,
        "metrics": metrics,
        **extra,
        "num_parameters": num_parameters,
        "train_steps": train_steps,
        "world_size": world_size,
        "rank_weight_sha256": fingerprints,
        "train_history": history,
    }


def saved_contents(output_dir: Path) -> list[str]:
    """What a run's folder holds, in words, from the files really there (a run without a tokenizer names none)."""
    files = {path.name for path in output_dir.iterdir()}
    contents = []
    if "adapter_model.safetensors" in files:
        contents.append("LoRA adapter")
    elif files & {"model.safetensors", "model.safetensors.index.json"}:
        contents.append("weights")
    contents += [
        what for name, what in (("config.json", "config"), ("tokenizer_config.json", "tokenizer")) if name in files
    ]
    if (output_dir / "datastore").is_dir():
        contents.append("datastore/")
    if any(name.startswith("modeling_") and name.endswith(".py") for name in files):
        contents.append("code for loading without tf_family")
    return [*contents, "model card README.md", RUN_INFO_FILE]


def publish_run(output_dir: Path, record: dict[str, Any], args: argparse.Namespace | None = None) -> None:
    """Main process only: write ``training_run.json`` and the model card made from it; push the folder when
    ``args`` asks for it (``--push_to_hub``, ``--hub_model_id``, ``--hub_token``, ``--hub_private``); with
    ``--remote_code``, first add the model's code for loading without tf_family (`tf_family.shipping.remote_code`)."""
    hub_model_id = getattr(args, "hub_model_id", None)
    atomic_write_text(output_dir / RUN_INFO_FILE, json.dumps(record, indent=2) + "\n")
    if getattr(args, "remote_code", False):
        from ..shipping.remote_code import export_remote_code

        export_remote_code(output_dir)  # before the card, which then says how the folder loads without tf_family
    write_model_card(output_dir, hub_model_id)
    sys.stdout.write(f"saved to {output_dir} ({', '.join(saved_contents(output_dir))})\n")
    if getattr(args, "push_to_hub", False):
        pushed = push_folder(output_dir, hub_model_id, token=args.hub_token, private=args.hub_private or None)
        sys.stdout.write(f"pushed {len(pushed)} files to https://huggingface.co/{hub_model_id}\n")


def save_run(
    accelerator: Accelerator, args: argparse.Namespace, model, output_dir: Path, tokenizer=None, **record: Any
) -> dict[str, Any]:
    """`save_model`, then (main process) `publish_run` of the `run_record` made from ``record`` (its keyword
    arguments but the world size and the fingerprints). Every process calls it and gets what a recipe's ``main``
    returns: the metrics, the output folder, the world size, every process's weight fingerprint and the number of
    steps. The caller then ends the run with `ending_run`, after letting go of the prepared model."""
    if args.model_name_or_path and args.lora_r and not args.merge_lora:
        point_adapter_at_base(accelerator.unwrap_model(model), portable_reference(args.model_name_or_path))
    fingerprints = save_model(accelerator, model, output_dir, args.merge_lora, tokenizer)
    world = accelerator.num_processes
    if accelerator.is_main_process:
        unwrapped = accelerator.unwrap_model(model)
        publish_run(
            output_dir, run_record(args, unwrapped, world_size=world, fingerprints=fingerprints, **record), args
        )
    return {
        **record["metrics"],
        "output_dir": str(output_dir),
        "world_size": world,
        "rank_weight_sha256": fingerprints,
        "train_steps": record["train_steps"],
    }
