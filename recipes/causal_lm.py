"""Train or fine-tune a causal language model with accelerate: any tf_family architecture, or any saved
``AutoModelForCausalLM`` (ours or plain transformers, e.g. GPT-2).

    accelerate launch recipes/causal_lm.py --arch transfo_xl --variant small --max_train_steps 2000
    accelerate launch -m tf_family.recipes.causal_lm --model_name_or_path runs/my-model --lora_r 8 --merge_lora
    accelerate launch --multi_gpu --num_processes 2 -m tf_family.recipes.causal_lm --cpu ...   # two CPU processes
    tf-family train ...                                  # the same recipe, with the main job's defaults

Reads top to bottom, as accelerate's examples do: arguments → Accelerator → data (blocks and their `DataLoader`s) →
model → optional LoRA → ``accelerator.prepare`` (model, optimizer, scheduler, loaders) → the training loop
(`train`: `epoch_batches` → `training_step` → `after_optimizer_step`, with gradient accumulation, clipping,
evaluations and checkpoints) → `evaluate()` → save (safetensors, tokenizer, model card) → optional push.

Data: the bundled State of the Union corpus by default, a Hub dataset (``--dataset_name``) or local files
(``--train_file``, ``--validation_file``: text, JSON lines, CSV or parquet). Every token is scored exactly once with
next-token targets (`tf_family.data.packing`). Models that carry a memory between steps (the class attribute
``carried_state``: Transformer-XL, the Compressive and Memorizing Transformers, SPALM) train on ordered streams:
each batch row reads documents end to end (`tf_family.data.sampling.DocumentStreamSampler`), the memory (``mems``)
is carried from step to step, and reset where a document starts; each process owns its own rows. Other models see
shuffled blocks (`ShuffledBlockSampler`), or with ``--streaming`` the blocks of their own part of the stream, in
order (`SequentialStepSampler`, `streaming_loader`). The loaders are prepared by accelerate; a resumed run skips what it
has read with ``accelerate.skip_first_batches`` (a stream instead continues from the position its checkpoint
recorded).

A checkpoint (``--checkpointing_steps``) holds the accelerate state (weights, optimizer, scheduler, RNG), the step
reached and each process's memory, so ``--resume_from_checkpoint latest`` continues exactly where a run stopped.
The run's lifecycle (arguments shared with the other recipes, accelerator, checkpoints, saving) is
`tf_family.training`'s.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from accelerate import Accelerator, skip_first_batches
from accelerate.logging import get_logger
from datasets import DatasetDict
from datasets.distributed import split_dataset_by_node
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import AutoTokenizer

from tf_family.data import (
    SOTU_TOKENIZER_DIR,
    DocumentStreamSampler,
    SequentialStepSampler,
    ShuffledBlockSampler,
    StreamingBlocks,
    block_loader,
    build_document_streams,
    load_text_streams,
    pack_into_blocks,
    streaming_loader,
)
from tf_family.data.packing import IGNORE_INDEX
from tf_family.models.knn_lm.modeling_knn_lm import DATASTORE_FOLDER
from tf_family.registry import ARCHITECTURES, get_arch
from tf_family.training import (
    TrainingLog,
    add_lora_and_hub_arguments,
    add_optimisation_arguments,
    add_run_arguments,
    apply_lora,
    carried_state,
    check_at_least,
    check_model_source,
    load_carried_state,
    load_data_state,
    parse_config_overrides,
    resume,
    save_checkpoint,
    validate_run_args,
)
from tf_family.training.arguments import HelpFormatter, architectures_with, timestamped_run_dir
from tf_family.training.encoder import first_rows
from tf_family.training.language_modeling import (
    DEFAULT_DATASTORE_TOKENS,
    add_text_data_arguments,
    attach_run_datastore,
    build_model,
    choose_block_size,
    document_separator,
    knn_overrides,
    language_model_metrics,
    load_lm_datasets,
    start_memory,
    unigram_perplexity,
    variant_base_config,
    wraps_base_model,
)
from tf_family.training.run import Run, prepare, start_run
from tf_family.utils.user_errors import run_main

logger = get_logger(__name__)


def build_parser(prog: str | None = None, defaults: dict[str, Any] | None = None) -> argparse.ArgumentParser:
    """The recipe's options. ``prog`` names the command in the usage line; ``defaults`` replace the recipe's own
    defaults (``tf-family train`` passes the main job's), and ``--help`` shows the defaults in force."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Train or fine-tune a causal LM with accelerate (tf_family).",
        formatter_class=HelpFormatter,
    )
    model = parser.add_argument_group("model")
    model.add_argument("--arch", help=f"train from scratch: one of {architectures_with('causal_lm')}")
    model.add_argument(
        "--variant", help="named size of --arch (tiny, small, base, …; default: 'small' where the arch has it)"
    )
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
    model.add_argument(
        "--transfo_xl_checkpoint",
        help="with --arch memorizing: start from this trained Transformer-XL folder, adding the kNN layers "
        "(Memorizing Transformers section 4.5: fine-tune an existing model to use memory)",
    )
    model.add_argument(
        "--memory_size", type=int, help="kNN memory entries per row and head in training (kNN-memory models)"
    )
    model.add_argument(
        "--eval_memory_size", type=int, help="kNN memory entries in evaluation (default: --memory_size)"
    )
    model.add_argument("--knn_top_k", type=int, help="neighbours each query retrieves (kNN-memory models)")
    model.add_argument(
        "--datastore_tokens",
        type=int,
        default=DEFAULT_DATASTORE_TOKENS,
        help="kNN-LM (--arch knn_lm): after training its base model, store this many training tokens in its "
        "datastore (0: all)",
    )

    data = parser.add_argument_group("data")
    add_text_data_arguments(data)
    data.add_argument(
        "--streaming",
        action="store_true",
        help="read the training data as a stream (datasets IterableDataset), packed into blocks on the fly: a corpus "
        "larger than memory trains; needs --max_train_steps; resumable (checkpoints record the stream's position)",
    )
    data.add_argument("--block_size", type=int, help="tokens per training block / memory segment")
    data.add_argument("--max_train_samples", type=int, help="use only the first N training documents")
    data.add_argument(
        "--max_eval_samples",
        type=int,
        help="use only the first N validation documents (0: all; default: all, or 4 in a run of under 100 steps)",
    )

    add_optimisation_arguments(
        parser,
        learning_rate=5e-4,
        lr_scheduler_type="cosine",
        cpu_help="run on CPU even if a GPU is present (two CPU processes: "
        "accelerate launch --multi_gpu --num_processes 2 … --cpu)",
    )
    add_run_arguments(parser, default_output_dir="runs/<model>-<data>-<time>", logging_steps=10)
    add_lora_and_hub_arguments(parser)
    parser.set_defaults(**(defaults or {}))
    return parser


def parse_args(
    argv: list[str] | None = None, prog: str | None = None, defaults: dict[str, Any] | None = None
) -> argparse.Namespace:
    args = build_parser(prog, defaults).parse_args(argv)
    if args.arch and args.variant is None:
        variants = get_arch(args.arch).variants if args.arch in ARCHITECTURES else {}
        args.variant = "small" if "small" in variants or not variants else next(iter(variants))
    return args


def validate_args(args: argparse.Namespace) -> None:
    """Refuse, before any work, what cannot run; each message says what to change."""
    check_model_source(args, "causal_lm", "--arch {arch} has no causal LM; causal-LM architectures: {able}.")
    if args.arch and "base_config" in getattr(get_arch(args.arch).config_class, "sub_configs_defaults", {}):
        # a retrieval wrapper (kNN-LM): its variant's base model is trained, then its datastore built
        if variant_base_config(args.arch, args.variant) is None:
            able = [name for name in get_arch(args.arch).variants if variant_base_config(args.arch, name)]
            raise ValueError(
                f"--arch {args.arch} --variant {args.variant} names no base model to train; choose a variant that "
                f"does ({able}), or wrap a model you trained with recipes/knn_lm.py (`build`, then `eval`)."
            )
    elif args.datastore_tokens != DEFAULT_DATASTORE_TOKENS:
        raise ValueError("--datastore_tokens sizes a kNN-LM's datastore: use it with --arch knn_lm.")
    check_at_least(
        args,
        (
            "per_device_train_batch_size",
            "per_device_eval_batch_size",
            "num_train_epochs",
            "block_size",
            "max_train_samples",
            "knn_top_k",
        ),
    )
    check_at_least(args, ("max_eval_samples", "memory_size", "eval_memory_size", "datastore_tokens"), minimum=0)
    knn_options = args.memory_size is not None or args.eval_memory_size is not None or args.knn_top_k is not None
    if knn_options and args.arch and get_arch(args.arch).carried_state != "knn_memory":
        raise ValueError(
            f"--memory_size, --eval_memory_size and --knn_top_k set a kNN memory; --arch {args.arch} has none "
            "(use --arch memorizing)."
        )
    if args.streaming:
        if args.max_train_steps is None:
            raise ValueError("--streaming needs --max_train_steps: a stream's length is not known in advance.")
        if args.arch and (get_arch(args.arch).carried_state or args.arch == "knn_lm"):
            raise ValueError(
                f"--streaming trains on blocks packed in stream order, for models without memory; --arch {args.arch} reads ordered "
                "document streams (a memory) or builds a datastore over the whole training set: drop --streaming."
            )
    if args.transfo_xl_checkpoint and args.arch != "memorizing":
        raise ValueError(
            "--transfo_xl_checkpoint adds kNN memory layers to a Transformer-XL: use it with --arch memorizing."
        )
    validate_run_args(args)


def default_output_dir(args: argparse.Namespace) -> str:
    model = args.arch or Path(args.model_name_or_path.rstrip("/")).name
    data = Path(args.train_file).stem if args.train_file else args.dataset_name.replace("/", "_")
    return timestamped_run_dir(f"{model}-{data}")


def next_token_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Summed next-token NLL (nats) of the scored positions and their count; ``labels`` are already aligned.

    Works for models whose ``logits`` are log-probabilities (adaptive softmax) too: log-softmax is idempotent.
    """
    count = int((labels != IGNORE_INDEX).sum())
    total = F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum"
    )
    return total, count


def model_inputs(
    batch: dict[str, torch.Tensor], carries_memory: bool, memory: Any = None, exit_labels: bool = False
) -> dict[str, Any]:
    """Forward kwargs for one block batch. A model that ``carries_memory`` gets its ``memory`` (None: a stream's
    start, the model's own empty memory) and, once it has one, the rows to reset; early-exit models in training
    (``exit_training``: CALM) get the aligned targets, and return their anytime loss as ``aux_loss``."""
    inputs: dict[str, Any] = {"input_ids": batch["input_ids"]}
    if exit_labels:
        inputs["exit_targets"] = batch["labels"]
    if carries_memory:
        inputs["mems"] = memory
        if memory is not None:
            inputs["reset_mems"] = batch["reset"]
    return inputs


def evaluate(
    model,
    dataloader,
    accelerator: Accelerator,
    per_device: int,
    carries_memory: bool,
    num_characters: int,
    memory_size: int | None = None,
) -> dict[str, float]:
    """Validation loss, perplexity, bits per token and bits per character over every scored token of
    ``dataloader`` (prepared: each process reads its ``per_device`` rows of every step).

    Memory models read the validation streams in order, carrying the memory as in training (a kNN memory of
    ``memory_size`` entries when given).
    """
    model.eval()
    totals = torch.zeros(2, dtype=torch.float64, device=accelerator.device)
    memory = start_memory(accelerator.unwrap_model(model), per_device, memory_size) if carries_memory else None
    progress = tqdm(dataloader, desc="evaluating", disable=not accelerator.is_local_main_process, leave=False)
    with torch.no_grad():
        # every process runs every step, empty rows included: FSDP (and DDP buffer syncs) gather in forward
        for batch in progress:
            outputs = model(**model_inputs(batch, carries_memory, memory))
            nll, count = next_token_loss(outputs.logits, batch["labels"])
            totals += torch.tensor([nll.item(), count], dtype=torch.float64, device=accelerator.device)
            if carries_memory:
                memory = outputs.mems
    model.train()
    nll, count = accelerator.reduce(totals, reduction="sum").tolist()
    return {
        **language_model_metrics(nll, count, num_characters, loss_key="eval_loss"),
        "scored_tokens": int(count),  # the validation tokens scored (one per token, plus each document's end)
    }


def streamed_counts(stream: StreamingBlocks, accelerator: Accelerator) -> dict[str, Any]:
    """What the processes read from their training streams, summed (every process calls it)."""
    counts = torch.tensor([stream.documents_read, stream.tokens_read], device=accelerator.device)
    documents, tokens = accelerator.reduce(counts, reduction="sum").tolist()
    return {"streaming": True, "train_documents_read": int(documents), "train_tokens_read": int(tokens)}


@dataclass
class Corpus:
    """The text read: the validation split (and the training split, or its stream with ``--streaming``), the column
    holding the text, the tokenizer and the id laid between documents."""

    raw: DatasetDict
    train_stream: Any
    text_column: str
    validation_documents: int  # before a smoke run's cap: the summary says what was scored
    tokenizer: Any = None
    separator_id: int = 0


@dataclass
class LanguageModel:
    """The model built for the run and how it is fed: whether it carries a memory between steps, whether it trains
    early exits (CALM's anytime loss), the block size it reads and the kNN memory size in evaluation."""

    model: Any
    has_memory: bool
    trains_exits: bool
    block_size: int
    eval_memory_size: int | None


@dataclass
class Blocks:
    """The training and validation blocks (``train``: a `StreamingBlocks` with ``--streaming``), the loaders that
    read them (``accelerator.prepare``-d by `prepare_training`) and what the summary counts."""

    train: Any
    eval: Any
    train_dataloader: DataLoader
    eval_dataloader: DataLoader
    train_docs: list | None
    eval_docs: list
    eval_characters: int


def load_corpus(args: argparse.Namespace, accelerator: Accelerator) -> Corpus:
    """The training and validation text (the training split streamed with ``--streaming``), capped for a smoke
    run, and the tokenizer with its document separator."""
    train_stream = None
    if args.streaming:  # the training split is read as it is consumed; the validation split is loaded whole
        train_stream, validation, text_column = load_text_streams(
            args.dataset_name, args.dataset_config_name, args.train_file, args.validation_file, args.text_column,
            args.sample_by,
        )  # fmt: skip
        if args.max_train_samples:
            train_stream = train_stream.take(args.max_train_samples)
        if accelerator.num_processes > 1:  # each process reads its own part of the stream
            train_stream = split_dataset_by_node(train_stream, accelerator.process_index, accelerator.num_processes)
        raw = DatasetDict({"validation": validation})
    else:
        raw, text_column = load_lm_datasets(args)
        raw = DatasetDict({split: raw[split] for split in ("train", "validation")})  # a test split is not read here
        raw["train"] = first_rows(raw["train"], args.max_train_samples)
    validation_documents = len(raw["validation"])
    raw["validation"] = first_rows(raw["validation"], args.max_eval_samples)
    corpus = Corpus(raw, train_stream, text_column, validation_documents)
    tokenizer_source = (
        args.tokenizer_name or args.model_name_or_path or args.transfo_xl_checkpoint or str(SOTU_TOKENIZER_DIR)
    )
    corpus.tokenizer = AutoTokenizer.from_pretrained(tokenizer_source)
    corpus.separator_id = document_separator(corpus.tokenizer, tokenizer_source)
    return corpus


def build_language_model(args: argparse.Namespace, corpus: Corpus, config_overrides: dict[str, Any]) -> LanguageModel:
    """The ``--arch`` or saved model (`build_model`), with what the options ask of it checked against what it is."""
    config_overrides = {**config_overrides, **knn_overrides(args)}
    model = build_model(args, corpus.tokenizer, corpus.separator_id, config_overrides)
    # a model that carries a memory between steps (Transformer-XL's segment memory, the Compressive Transformer's,
    # the Memorizing Transformer's kNN memory)
    has_memory = carried_state(model) is not None
    if (knn_overrides(args) or args.eval_memory_size is not None) and carried_state(model) != "knn_memory":
        raise ValueError(
            "--memory_size, --eval_memory_size and --knn_top_k set a kNN memory; "
            f"{type(model).__name__} has none (use --arch memorizing)."
        )
    eval_memory_size = args.eval_memory_size if args.eval_memory_size is not None else args.memory_size
    # an early-exit model (CALM) trains every exit: the anytime loss (and its meta classifier) comes back as aux_loss
    trains_exits = bool(getattr(model, "exit_training", False))
    block_size = choose_block_size(args.block_size, model)
    if args.streaming and (has_memory or wraps_base_model(model.config)):
        raise ValueError(
            f"--streaming packs independent blocks; {type(model).__name__} reads ordered document streams (a memory) "
            "or builds a datastore over the whole training set: drop --streaming."
        )
    return LanguageModel(model, has_memory, trains_exits, block_size, eval_memory_size)


def make_blocks(run: Run, corpus: Corpus, lm: LanguageModel) -> Blocks:
    """Tokenized documents cut into blocks and their loaders: streamed blocks in stream order (``--streaming``:
    `SequentialStepSampler` counts ``--max_train_steps`` of micro-batches, `streaming_loader` reads them),
    ordered document streams for a model with memory (`DocumentStreamSampler`: each row's documents contiguous from
    step to step, on one process), shuffled blocks otherwise (`ShuffledBlockSampler`)."""
    args, accelerator, tokenizer, text_column = run.args, run.accelerator, corpus.tokenizer, corpus.text_column
    block_size, separator_id = lm.block_size, corpus.separator_id
    with accelerator.main_process_first():
        tokenized = corpus.raw.map(
            lambda rows: {
                "input_ids": tokenizer(rows[text_column], add_special_tokens=False)["input_ids"],
                "num_characters": [len(text) for text in rows[text_column]],
            },
            batched=True,
            remove_columns=corpus.raw["validation"].column_names,
            desc="tokenizing",
        )
    train_docs = None if args.streaming else list(tokenized["train"]["input_ids"])
    eval_docs = list(tokenized["validation"]["input_ids"])
    eval_characters = int(sum(tokenized["validation"]["num_characters"]))
    world, per_device, eval_per_device = run.world, args.per_device_train_batch_size, args.per_device_eval_batch_size
    # an epoch ends on an optimizer step: micro-batches that do not fill one are left out of it
    whole_steps = args.gradient_accumulation_steps
    if lm.has_memory:
        train_blocks, train_doc_blocks = build_document_streams(train_docs, block_size, separator_id)
        eval_blocks, eval_doc_blocks = build_document_streams(eval_docs, block_size, separator_id)
        train_sampler = DocumentStreamSampler(train_doc_blocks, per_device, world, args.seed, whole_steps=whole_steps)
        eval_sampler = DocumentStreamSampler(eval_doc_blocks, eval_per_device, world, shuffle=False)
    else:
        if args.streaming:
            train_blocks = StreamingBlocks(
                corpus.train_stream,
                lambda text: tokenizer(text, add_special_tokens=False)["input_ids"],
                text_column,
                block_size,
                separator_id,
            )
            train_sampler = SequentialStepSampler(args.max_train_steps * whole_steps, per_device, world)
        else:
            train_blocks = pack_into_blocks(train_docs, block_size, separator_id)
            train_sampler = ShuffledBlockSampler(
                len(train_blocks), per_device, world, args.seed, whole_steps=whole_steps
            )
        eval_blocks = pack_into_blocks(eval_docs, block_size, separator_id)
        eval_sampler = ShuffledBlockSampler(
            len(eval_blocks), eval_per_device, world, shuffle=False, drop_last_batch=False
        )
    if not args.streaming and not train_sampler.schedule(0):
        raise ValueError(
            f"the training data fills {len(train_blocks)} blocks of {block_size} tokens, fewer than one "
            f"batch of {world * per_device}; lower --per_device_train_batch_size or --block_size."
        )
    if args.streaming:
        train_dataloader = streaming_loader(train_blocks, train_sampler)
    else:
        train_dataloader = block_loader(train_blocks, train_sampler)
    eval_dataloader = block_loader(eval_blocks, eval_sampler)
    return Blocks(train_blocks, eval_blocks, train_dataloader, eval_dataloader, train_docs, eval_docs, eval_characters)


def prepare_training(run: Run, lm: LanguageModel, blocks: Blocks) -> int:
    """Optional LoRA, then the optimizer, schedule and ``accelerator.prepare`` of the model (`prepare`) and of the
    loaders; returns the epochs."""
    args, accumulation = run.args, run.args.gradient_accumulation_steps
    model = apply_lora(lm.model, args, task_type="CAUSAL_LM")
    if args.streaming:  # one pass of max_train_steps updates, blocks in stream order
        micro_per_epoch = args.max_train_steps * accumulation
    else:
        micro_per_epoch = len(blocks.train_dataloader.batch_sampler.schedule(0))
    updates_per_epoch = micro_per_epoch // accumulation
    if updates_per_epoch == 0:
        raise ValueError(
            f"an epoch has {micro_per_epoch} batches, fewer than --gradient_accumulation_steps "
            f"{accumulation}; lower it or the batch size."
        )
    max_train_steps = args.max_train_steps or args.num_train_epochs * updates_per_epoch
    tokens = run.world * args.per_device_train_batch_size * accumulation * lm.block_size
    prepare(
        run, model, max_train_steps, "tf_family_causal_lm", block_size=lm.block_size, effective_batch_tokens=tokens,
        memory_streams=lm.has_memory,
    )  # fmt: skip
    lm.model = None  # the prepared model is run.model
    # each process reads its own rows of every step (the samplers' order; see tf_family.data.sampling)
    blocks.eval_dataloader = run.accelerator.prepare(blocks.eval_dataloader)
    blocks.train_dataloader = run.accelerator.prepare(blocks.train_dataloader)
    return math.ceil(max_train_steps / updates_per_epoch)


def resume_run(run: Run, lm: LanguageModel, blocks: Blocks) -> tuple[int, int, Any]:
    """With ``--resume_from_checkpoint``: the state saved (weights, optimizer, schedule, RNG) restored; returns the
    epoch and the update in it to continue from, and the memory the processes carried (None: none, or a model
    without memory)."""
    start_epoch, resume_update, memory = 0, 0, None
    if run.args.resume_from_checkpoint:
        checkpoint, state = resume(run.accelerator, run.args)
        run.completed_steps, start_epoch, resume_update = (
            state["completed_steps"],
            state["epoch"],
            state["update_in_epoch"],
        )
        if lm.has_memory:
            memory = load_carried_state(checkpoint, run.accelerator)
        if run.args.streaming:
            data_state = load_data_state(checkpoint, run.accelerator)
            if data_state is None:
                raise ValueError(f"{checkpoint} was written by a run without --streaming; resume it without.")
            blocks.train.load_state_dict(data_state)
    return start_epoch, resume_update, memory


def evaluate_run(run: Run, lm: LanguageModel, blocks: Blocks, with_memory: bool = True) -> dict[str, float]:
    """`evaluate` of the run's model on the validation blocks (``with_memory=False``: a kNN-LM's base model alone)."""
    return evaluate(
        run.model, blocks.eval_dataloader, run.accelerator, run.args.per_device_eval_batch_size,
        lm.has_memory and with_memory, blocks.eval_characters, lm.eval_memory_size if with_memory else None,
    )  # fmt: skip


def epoch_batches(run: Run, blocks: Blocks, epoch: int, first_update: int) -> tuple[Iterable, int]:
    """This process's micro-batches of ``epoch`` from optimizer step ``first_update`` on, and the optimizer steps
    in the epoch: the prepared loader in the epoch's order (``skip_first_batches`` past the steps a resumed run has
    done: a sampler's batches skipped unread, so a stream, restored by `resume_run`, is not advanced)."""
    accumulation = run.args.gradient_accumulation_steps
    loader = blocks.train_dataloader
    loader.set_epoch(epoch)  # the sampler's order of this epoch (seed + epoch)
    updates = len(loader) // accumulation
    return (skip_first_batches(loader, first_update * accumulation) if first_update else loader), updates


def training_step(run: Run, lm: LanguageModel, batch: dict[str, torch.Tensor], memory: Any) -> tuple[Any, float, int]:
    """One micro-batch inside accelerate's gradient accumulation: forward (with the memory carried in), the
    next-token loss plus the model's auxiliary loss, backward, and on the micro-batch that syncs the gradients,
    clipping and the optimizer step (`Run.optimizer_step`). Returns the memory to carry (None: a model without),
    the summed NLL and the tokens scored."""
    accelerator, model = run.accelerator, run.model
    # accumulate(): gradients are all-reduced and the optimizer steps on every `accumulation`-th micro-batch
    with accelerator.accumulate(model):
        with accelerator.autocast():
            outputs = model(**model_inputs(batch, lm.has_memory, memory, lm.trains_exits))
        nll, count = next_token_loss(outputs.logits, batch["labels"])
        # a batch with nothing to score still takes part in the gradient all-reduce
        loss = nll / count if count else outputs.logits.sum() * 0.0
        # the Compressive Transformer's attention-reconstruction loss (which trains its compression), or CALM's
        # anytime loss minus the last layer's cross entropy plus its meta classifier's loss
        if getattr(outputs, "aux_loss", None) is not None:
            loss = loss + outputs.aux_loss
        run.optimizer_step(loss)
    return (outputs.mems if lm.has_memory else None), nll.item(), count


def after_optimizer_step(
    run: Run, lm: LanguageModel, blocks: Blocks, log: TrainingLog, memory: Any, position: tuple[int, int, int]
) -> dict[str, float] | None:
    """What follows an optimizer step: the log line (``--logging_steps``, returned), an evaluation (``--eval_steps``)
    and a checkpoint (``--checkpointing_steps``) with the memory the processes carry; ``position`` is the epoch, the
    optimizer steps done in it and the optimizer steps it has."""
    args, steps, record = run.args, run.completed_steps, None
    if steps % args.logging_steps == 0 or steps == run.max_train_steps:
        record = log.write(steps, run.scheduler.get_last_lr()[0])
    if args.eval_steps and steps % args.eval_steps == 0 and steps < run.max_train_steps:
        run.log_metrics(evaluate_run(run, lm, blocks), label=f"step {steps}")
    if args.checkpointing_steps and steps % args.checkpointing_steps == 0:
        epoch, update, updates_in_epoch = position
        # a stream's position after the last micro-batch trained on (its loader has read one ahead)
        last_micro_batch = update * args.gradient_accumulation_steps - 1
        data_state = blocks.train_dataloader.dataset.state_after(last_micro_batch) if args.streaming else None
        if update == updates_in_epoch:  # the epoch is done: a resumed run starts the next one
            epoch, update = epoch + 1, 0
        state = {"completed_steps": steps, "epoch": epoch, "update_in_epoch": update}
        # the batch layout: another number of processes can then resume the run (`check_world_change`)
        state.update(
            per_device_train_batch_size=args.per_device_train_batch_size,
            gradient_accumulation_steps=args.gradient_accumulation_steps,
        )
        save_checkpoint(
            run.accelerator, args.output_dir, state, memory, args.checkpoints_total_limit, data_state=data_state
        )
    return record


def train(run: Run, lm: LanguageModel, blocks: Blocks, num_epochs: int) -> TrainingLog:
    """The training loop: epochs of micro-batches (`epoch_batches`), each a `training_step` carrying the memory
    from step to step, and after each optimizer step the log, evaluations and checkpoints (`after_optimizer_step`);
    returns the log of training steps."""
    args, accumulation = run.args, run.args.gradient_accumulation_steps
    start_epoch, resume_update, memory = resume_run(run, lm, blocks)
    blocks_text = "streamed training blocks" if args.streaming else f"{len(blocks.train)} training blocks"
    described = f"{blocks_text} of {lm.block_size} tokens, {run.max_train_steps} steps on {run.world} process(es)"
    progress, log = run.start_training("tokens_per_second", described)
    for epoch in range(start_epoch, num_epochs):
        if run.completed_steps >= run.max_train_steps:
            break
        first_update = resume_update if epoch == start_epoch else 0
        if first_update == 0:  # streams start again at the top of every epoch: so does the memory
            memory = None
        batches, updates_in_epoch = epoch_batches(run, blocks, epoch, first_update)
        for micro_index, batch in enumerate(batches, start=first_update * accumulation):
            memory, nll, count = training_step(run, lm, batch, memory)
            log.add(nll, count, count)
            if not run.accelerator.sync_gradients:
                continue
            run.completed_steps += 1
            progress.update(1)
            position = (epoch, (micro_index + 1) // accumulation, updates_in_epoch)
            record = after_optimizer_step(run, lm, blocks, log, memory, position)
            if record is not None:
                progress.set_postfix(loss=f"{record['train_loss']:.3f}", tok_s=f"{record['tokens_per_second']:.0f}")
            if run.completed_steps >= run.max_train_steps:
                break
    progress.close()
    return log


def final_metrics(run: Run, lm: LanguageModel, blocks: Blocks, corpus: Corpus) -> tuple[dict[str, Any], bool]:
    """The validation metrics of the trained model (a kNN-LM's once its datastore is built, its base model's
    perplexity beside), with the unigram floor; returns them and whether a datastore was built."""
    args, unwrapped = run.args, run.accelerator.unwrap_model(run.model)
    base_metrics = None
    if wraps_base_model(unwrapped.config):  # a kNN-LM: the trained base model's keys over the training data
        base_metrics = evaluate_run(run, lm, blocks, with_memory=False)  # the base LM alone, before the datastore
        limit = args.datastore_tokens or None  # 0: all of them
        attach_run_datastore(
            run.accelerator, run.model, blocks.train, run.output_dir / DATASTORE_FOLDER, corpus.tokenizer,
            args.per_device_eval_batch_size, limit,
        )  # fmt: skip
    metrics = evaluate_run(run, lm, blocks)
    if base_metrics is not None:
        metrics.update(base_perplexity=base_metrics["perplexity"], datastore_keys=unwrapped.datastore.size)
    vocab_size = max(getattr(unwrapped.config, "vocab_size", 0) or 0, len(corpus.tokenizer))
    if not args.streaming:  # a stream's token counts are not kept
        metrics["unigram_perplexity"] = unigram_perplexity(blocks.train, blocks.eval, vocab_size)
    run.log_metrics(metrics)
    return metrics, base_metrics is not None


def describe_data(run: Run, corpus: Corpus, blocks: Blocks) -> dict[str, Any]:
    """The data as the run record and model card state it (every process calls it: a stream's counts are summed)."""
    args, train_docs, eval_docs = run.args, blocks.train_docs, blocks.eval_docs
    bundled = args.dataset_name == "sotu" and not args.train_file
    data = {
        "name": args.dataset_name if not args.train_file else None,
        "title": "State of the Union addresses 1790-2021 (bundled with tf_family)"
        if bundled
        else (args.dataset_name or "local files"),
        "on_hub": bool(args.dataset_name and args.dataset_name != "sotu" and not args.train_file),
        "train_file": args.train_file,
        "validation_file": args.validation_file,
        "text_column": corpus.text_column,
        **(streamed_counts(blocks.train, run.accelerator) if args.streaming else {}),
        **({} if args.streaming else {"train_documents": len(train_docs), "train_tokens": sum(map(len, train_docs))}),
        "eval_documents": len(eval_docs),
        "eval_tokens": int(sum(map(len, eval_docs))),
        "eval_split": "validation",
    }
    if bundled:
        data["description"] = (
            "The State of the Union addresses 1790-1994 (train) and 1995-2009 (validation), "
            "bundled with tf_family (`tf_family.data.load_sotu`), public domain."
        )
    return data


def main(
    argv: list[str] | None = None, prog: str | None = None, defaults: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Run the recipe on ``argv`` (see `parse_args` for ``prog`` and ``defaults``); returns `save_run`'s summary.

    parse → data and tokenizer → model → blocks → prepare → train → evaluate → save."""
    args = parse_args(argv, prog, defaults)
    validate_args(args)
    config_overrides = parse_config_overrides(args.config_overrides, args.arch)
    run = start_run(args, lambda: default_output_dir(args))
    corpus = load_corpus(args, run.accelerator)
    lm = build_language_model(args, corpus, config_overrides)
    blocks = make_blocks(run, corpus, lm)
    num_epochs = prepare_training(run, lm, blocks)
    log = train(run, lm, blocks, num_epochs)
    metrics, has_datastore = final_metrics(run, lm, blocks, corpus)
    datastore_size = run.accelerator.unwrap_model(run.model).datastore.size if has_datastore else None
    summary = run.finish(
        corpus.tokenizer, recipe="causal_lm", task="causal_lm", dataset=describe_data(run, corpus, blocks),
        metrics=metrics, history=log.history,
        **({"datastore": {"folder": DATASTORE_FOLDER, "keys": datastore_size}} if has_datastore else {}),
    )  # fmt: skip
    return {**summary, "eval_documents": len(blocks.eval_docs), "validation_documents": corpus.validation_documents}


if __name__ == "__main__":
    raise SystemExit(run_main(main))
