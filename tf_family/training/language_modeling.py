"""What the causal-LM recipe needs beside its loop: the model to train, the block size it reads, the kNN-memory
options, and the unigram floor its perplexity is reported against."""

from __future__ import annotations

import argparse
import math
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from ..data.packing import IGNORE_INDEX
from ..registry import get_arch
from ..spec import carried_state
from .encoder import max_input_length

DEFAULT_MEMORY_BLOCK_SIZE = 128
DEFAULT_BLOCK_SIZE = 512


def max_positions(config) -> int | None:
    """The longest block the model can read, when it has absolute positions (RoBERTa-style offsets counted)."""
    return max_input_length(config)


def build_model(args: argparse.Namespace, tokenizer, separator_id: int, config_overrides: dict[str, Any]):
    """A fresh ``--arch`` model sized for ``tokenizer`` (``separator_id`` as its eos/bos/pad), or the saved
    ``--model_name_or_path`` one; with ``--transfo_xl_checkpoint``, that trained Transformer-XL with kNN memory
    layers added (Wu et al. 2022, section 4.5)."""
    if getattr(args, "transfo_xl_checkpoint", None):
        model_class = get_arch(args.arch).model_classes["causal_lm"]
        return model_class.from_transfo_xl(args.transfo_xl_checkpoint, **config_overrides)
    if args.arch:
        spec = get_arch(args.arch)
        token_ids = {"eos_token_id": separator_id, "bos_token_id": separator_id, "pad_token_id": separator_id}
        config = spec.make_config(args.variant, **{"vocab_size": len(tokenizer), **token_ids, **config_overrides})
        return spec.model_classes["causal_lm"](config)
    config = AutoConfig.from_pretrained(args.model_name_or_path, **config_overrides)
    model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path, config=config)
    vocab = getattr(model.config, "vocab_size", None)
    if vocab is not None and len(tokenizer) > vocab:
        raise ValueError(
            f"the tokenizer has {len(tokenizer)} ids but the model embeds {vocab}; pass the model's "
            "own tokenizer with --tokenizer_name."
        )
    return model


def choose_block_size(requested: int | None, model) -> int:
    """``--block_size``, or when it is not given: 128 for a model that carries a memory, else 512 or the model's
    last position, whichever is smaller. Refuses a block longer than the model's positions."""
    limit = max_positions(model.config)
    has_memory = carried_state(model) is not None
    block_size = requested or (
        DEFAULT_MEMORY_BLOCK_SIZE if has_memory else min(DEFAULT_BLOCK_SIZE, limit or DEFAULT_BLOCK_SIZE)
    )
    if limit is not None and block_size > limit:
        raise ValueError(
            f"--block_size {block_size} is longer than the {limit} positions {type(model).__name__} "
            f"supports; pass --block_size {limit} or less."
        )
    return block_size


def knn_overrides(args: argparse.Namespace) -> dict[str, int]:
    """Config fields of a kNN-memory model (the Memorizing Transformer) that --memory_size / --knn_top_k set."""
    overrides = {"knn_memory_size": args.memory_size, "knn_top_k": args.knn_top_k}
    return {name: value for name, value in overrides.items() if value is not None}


def start_memory(model, batch_size: int, memory_size: int | None) -> Any:
    """The memory a stream starts with: None (the model's own default), or for a kNN-memory model evaluated with
    another size than it trained with, an empty memory of ``memory_size`` entries."""
    if memory_size is None or carried_state(model) != "knn_memory":
        return None
    return model.empty_memory(batch_size, memory_size)


def unigram_perplexity(train_blocks, eval_blocks, vocab_size: int) -> float:
    """Perplexity of the add-one unigram model of the training targets on the evaluation targets: the floor a
    model that learned anything beats."""
    train = train_blocks.labels[train_blocks.labels != IGNORE_INDEX]
    counts = torch.bincount(train, minlength=vocab_size).double() + 1.0
    log_probs = (counts / counts.sum()).log()
    targets = eval_blocks.labels[eval_blocks.labels != IGNORE_INDEX]
    return math.exp(-log_probs[targets].mean().item())


__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_MEMORY_BLOCK_SIZE",
    "build_model",
    "choose_block_size",
    "knn_overrides",
    "max_positions",
    "start_memory",
    "unigram_perplexity",
]
