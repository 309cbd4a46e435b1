"""Optional PEFT LoRA adapters on a model about to be trained."""

from __future__ import annotations

import argparse
import warnings

import torch

from ..registry import find_arch


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


def check_lora_head(args: argparse.Namespace) -> None:
    """A task with a new head trains it in full: only merged weights hold it."""
    if args.lora_r and not args.merge_lora:
        raise ValueError(
            "--lora_r trains this task's new head in full beside the adapters, and only merged weights keep it: add "
            "--merge_lora."
        )


def apply_lora(
    model: torch.nn.Module, args: argparse.Namespace, task_type: str | None = None, train_head: bool = False
) -> torch.nn.Module:
    """LoRA adapters (``--lora_r``; none when it is 0) on ``--lora_target_modules``, by default the registry's
    targets for the model's architecture (PEFT's own defaults for a model outside the registry).

    ``task_type``: PEFT's task wrapper (e.g. ``"CAUSAL_LM"``); without one, the plain `PeftModel` passes every
    keyword (labels, positions, returns-to-go) through to the model. ``train_head``: the task head (every parameter
    outside the base model, e.g. a freshly initialised classifier) is trained in full beside the adapters; the run
    must then save merged weights (`check_lora_head`)."""
    if not args.lora_r:
        return model
    from peft import LoraConfig, get_peft_model

    prefix = f"{model.base_model_prefix}."
    head = [p for name, p in model.named_parameters() if not name.startswith(prefix)] if train_head else []
    spec = find_arch(model.config.model_type)
    targets = args.lora_target_modules or (list(spec.lora_target_modules) if spec else None)
    if targets:
        check_lora_targets(model, targets)
    config = LoraConfig(
        r=args.lora_r,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        target_modules=targets,
        **({"task_type": task_type} if task_type else {}),
    )
    # a head is not put in PEFT's modules_to_save: it matches names by suffix, and a head's names (e.g. Longformer's
    # `out_proj`) can also name attention projections that carry adapters
    with warnings.catch_warnings():
        # peft reads transformers' deprecated `is_gradient_checkpointing` alias: noise the user can do nothing about
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*deprecated", category=FutureWarning)
        model = get_peft_model(model, config)
    for param in head:
        param.requires_grad_(True)
    return model
