"""Train or fine-tune a masked language model with accelerate: any tf_family architecture with a ``masked_lm`` head
(Longformer, BigBird, …), or any saved ``AutoModelForMaskedLM``.

    accelerate launch recipes/masked_lm.py --arch longformer --variant small --max_length 4096
    accelerate launch -m tf_family.recipes.masked_lm --arch big_bird --dataset_name brown --max_length 1024

Data: the bundled State of the Union corpus by default, the bundled Brown Corpus (``--dataset_name brown``), a Hub
dataset or local files (``--train_file`` / ``--validation_file``: text, JSON lines, CSV or parquet), loaded as in the
causal-LM recipe. Documents are laid end to end, separated by ``<sep>``, and cut into blocks of ``--max_length``
tokens framed as ``<cls> … <sep>``. BERT's masking: ``--mlm_probability`` of the ordinary tokens of a block are
predicted (at least one per block); of those, 80 % are replaced by ``<mask>``, 10 % by a random ordinary token and
10 % kept. The choice is drawn from a generator seeded by (seed, epoch, block), so a resumed run and any number of
processes see the same masks; validation uses one fixed draw. Metrics: cross-entropy and perplexity of the predicted
tokens and their top-1 accuracy. Same conventions as the causal-LM recipe (checkpoints, exact resume, LoRA, card).
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import torch
import torch.nn.functional as F
from accelerate.logging import get_logger
from transformers import AutoModelForMaskedLM

from tf_family.data import load_text_datasets
from tf_family.training import (
    apply_lora,
    check_output_dir,
    configure_ddp,
    encoder,
    ending_run,
    make_accelerator,
    make_optimizer,
    parse_config_overrides,
    run_hyperparameters,
    save_run,
)
from tf_family.user_errors import run_main

logger = get_logger(__name__)

TASK = "masked_lm"
EVAL_EPOCH = -1  # the epoch the fixed validation masks are drawn for


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Train or fine-tune a masked language model (tf_family).")
    encoder.add_common_arguments(parser, TASK, default_dataset="sotu", max_length=512)
    data = parser.add_argument_group("masked-LM data")
    data.add_argument("--text_column", help="column holding the text (default: 'text' or the first string column)")
    data.add_argument(
        "--sample_by",
        choices=["document", "paragraph", "line"],
        help="how a .txt file is split into documents (default: by paragraph for a lone --train_file, else whole)",
    )
    data.add_argument("--validation_split_percentage", type=int, default=5)
    data.add_argument("--mlm_probability", type=float, default=0.15, help="fraction of the tokens to predict")
    return parser.parse_args(argv)


def validate_args(args: argparse.Namespace) -> None:
    encoder.validate_common_args(args, TASK)
    if not 0.0 < args.mlm_probability < 1.0:
        raise ValueError(f"--mlm_probability={args.mlm_probability} must be in (0, 1), e.g. 0.15.")


def make_blocks(documents: list[list[int]], max_length: int, cls_id: int, sep_id: int) -> list[list[int]]:
    """Documents end to end (each followed by ``sep_id``), cut into ``<cls> … <sep>`` blocks of at most
    ``max_length`` tokens; the last block may be shorter."""
    stream = [token for document in documents for token in (*document, sep_id)]
    body = max_length - 2
    return [[cls_id, *stream[i : i + body], sep_id] for i in range(0, len(stream), body)]


def mask_block(
    block: list[int], probability: float, seed: int, special_ids: set[int], mask_id: int, vocab: list[int]
) -> tuple[list[int], list[int]]:
    """The masked input and the labels (-100 where nothing is predicted) of one block, drawn from ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.tensor(block)
    candidates = torch.tensor([token not in special_ids for token in block])
    chosen = (torch.rand(len(block), generator=generator) < probability) & candidates
    if not chosen.any() and candidates.any():  # every block teaches something
        positions = candidates.nonzero().flatten()
        chosen[positions[torch.randint(len(positions), (1,), generator=generator)]] = True
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    action = torch.rand(len(block), generator=generator)
    replacement = torch.tensor(vocab)[torch.randint(len(vocab), (len(block),), generator=generator)]
    masked = torch.where(chosen & (action < 0.8), torch.full_like(ids, mask_id), ids)
    masked = torch.where(chosen & (action >= 0.8) & (action < 0.9), replacement, masked)
    return masked.tolist(), labels.tolist()


def block_seed(seed: int, epoch: int, index: int) -> int:
    return (seed * 1_000_003 + (epoch + 1) * 10_000_019 + index) % (2**63 - 1)


def evaluate(
    accelerator, model, masked_eval: list[tuple[list[int], list[int]]], args, pad_id: int
) -> dict[str, float]:
    """Cross-entropy, perplexity and top-1 accuracy of the predicted tokens of the validation blocks."""

    def collate(indices, train=False, **_):
        return encoder.pad_batch(
            [masked_eval[i][0] for i in indices], pad_id, {"labels": [masked_eval[i][1] for i in indices]}
        )

    def read(outputs, batch, indices):
        logits, labels = outputs.logits.float(), batch["labels"]
        nll = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100, reduction="none").sum(-1)
        scored = labels != -100
        correct = ((logits.argmax(-1) == labels) & scored).sum(-1)
        rows = zip(nll.tolist(), scored.sum(-1).tolist(), correct.tolist(), strict=True)
        return list(zip(indices, rows, strict=True))

    rows = encoder.predict(accelerator, model, len(masked_eval), args.per_device_eval_batch_size, collate, read)
    nll, count, correct = (sum(column) for column in zip(*rows, strict=True)) if rows else (0.0, 0, 0)
    loss = nll / max(count, 1)
    return {
        "eval_loss": loss,
        "perplexity": math.exp(min(loss, 50.0)),
        "masked_accuracy": correct / max(count, 1),
        "eval_masked_tokens": int(count),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    validate_args(args)
    args.output_dir = args.output_dir or encoder.default_output_dir(args, TASK)
    config_overrides = parse_config_overrides(args.config_overrides, args.arch)
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
    tokenizer = encoder.load_tokenizer(args, need_mask=True)

    # ---- model ------------------------------------------------------------------------------------------------
    model = encoder.build_model(args, TASK, tokenizer, config_overrides, AutoModelForMaskedLM)
    encoder.check_max_length(args, model)

    cls_id, sep_id, pad_id, mask_id = (
        tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id, tokenizer.mask_token_id,
    )  # fmt: skip
    special_ids = set(tokenizer.all_special_ids)
    vocab = [i for i in range(len(tokenizer)) if i not in special_ids]
    with accelerator.main_process_first():
        documents = {
            split: tokenizer(list(raw[split][text_column]), add_special_tokens=False)["input_ids"]
            for split in ("train", "validation")
        }
    train_blocks = make_blocks(documents["train"], args.max_length, cls_id, sep_id)
    eval_blocks = make_blocks(documents["validation"], args.max_length, cls_id, sep_id)
    masked_eval = [
        mask_block(b, args.mlm_probability, block_seed(args.seed, EVAL_EPOCH, i), special_ids, mask_id, vocab)
        for i, b in enumerate(eval_blocks)
    ]
    world = accelerator.num_processes
    updates_per_epoch = (
        len(train_blocks) // (world * args.per_device_train_batch_size) // args.gradient_accumulation_steps
    )
    if updates_per_epoch == 0:
        raise ValueError(
            f"the training data fills {len(train_blocks)} blocks of {args.max_length} tokens, fewer than one optimizer "
            f"step of {world} × {args.per_device_train_batch_size} × {args.gradient_accumulation_steps}; lower the "
            "batch size, --gradient_accumulation_steps or --max_length."
        )

    model = apply_lora(model, args)
    max_train_steps = args.max_train_steps or args.num_train_epochs * updates_per_epoch
    optimizer, scheduler = make_optimizer(model, args, max_train_steps, world)
    configure_ddp(accelerator, model)  # DDP searches for unused parameters only where a model can leave some
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    hyperparameters = run_hyperparameters(
        args, world, max_train_steps, max_length=args.max_length, mlm_probability=args.mlm_probability
    )
    if args.trackers:
        accelerator.init_trackers("tf_family_masked_lm", config=hyperparameters)

    def collate(indices, train=True, epoch=0, **_):
        pairs = [
            mask_block(
                train_blocks[i], args.mlm_probability, block_seed(args.seed, epoch, i), special_ids, mask_id, vocab
            )
            for i in indices
        ]
        return encoder.pad_batch([p[0] for p in pairs], pad_id, {"labels": [p[1] for p in pairs]})

    def run_evaluation() -> dict[str, float]:
        return evaluate(accelerator, model, masked_eval, args, pad_id)

    parameters = encoder.num_parameters(model)
    logger.info(
        f"{parameters:,} parameters, {len(train_blocks)} training blocks of up to {args.max_length} tokens, "
        f"{max_train_steps} steps on {world} process(es)",
        main_process_only=True,
    )
    completed_steps, history = encoder.train(
        accelerator, args, model, optimizer, scheduler, max_train_steps=max_train_steps, num_examples=len(train_blocks),
        collate=collate, evaluate=run_evaluation, output_dir=output_dir,
    )  # fmt: skip

    # ---- evaluate ---------------------------------------------------------------------------------------------
    metrics = run_evaluation()
    accelerator.log({f"eval/{k}": v for k, v in metrics.items()}, step=completed_steps)
    logger.info(f"validation: {metrics}", main_process_only=True)

    # ---- save -------------------------------------------------------------------------------------------------
    bundled = not args.train_file and args.dataset_name in ("sotu", "brown")
    titles = {
        "sotu": "State of the Union addresses 1790-2021 (bundled with tf_family)",
        "brown": "The Brown Corpus (bundled with tf_family)",
    }
    data = {
        "name": None if args.train_file else args.dataset_name,
        "title": titles[args.dataset_name]
        if bundled
        else (args.dataset_name if not args.train_file else "local files"),
        "on_hub": bool(not args.train_file and not bundled),
        "train_file": args.train_file,
        "validation_file": args.validation_file,
        "text_column": text_column,
        "train_documents": len(documents["train"]),
        "train_tokens": int(sum(map(len, documents["train"]))),
        "eval_documents": len(documents["validation"]),
        "eval_tokens": int(sum(map(len, documents["validation"]))),
        "eval_split": "validation",
    }
    summary = save_run(
        accelerator, args, model, output_dir, tokenizer, recipe="masked_lm", task=TASK, dataset=data,
        hyperparameters=hyperparameters, metrics=metrics, num_parameters=parameters, train_steps=completed_steps,
        history=history,
    )  # fmt: skip
    with ending_run(accelerator):
        model, optimizer, scheduler = accelerator.free_memory(model, optimizer, scheduler)  # DDP holds the group
    return summary


if __name__ == "__main__":
    raise SystemExit(run_main(main))
