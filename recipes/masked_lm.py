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
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from accelerate.logging import get_logger
from transformers import AutoModelForMaskedLM

from tf_family.training import apply_lora, encoder, parse_config_overrides
from tf_family.training.language_modeling import add_text_data_arguments, load_lm_datasets
from tf_family.training.run import prepare, start_run
from tf_family.utils.user_errors import run_main

logger = get_logger(__name__)

TASK = "masked_lm"
EVAL_EPOCH = -1  # the epoch the fixed validation masks are drawn for


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Train or fine-tune a masked language model (tf_family).")
    encoder.add_common_arguments(parser, TASK, default_dataset="sotu", max_length=512)
    data = parser.add_argument_group("masked-LM data")
    add_text_data_arguments(data, sources=False)  # --dataset_name and the files are the encoder recipes' own
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


def evaluate(accelerator, model, eval_dataloader) -> dict[str, float]:
    """Cross-entropy, perplexity and top-1 accuracy of the predicted tokens of the validation blocks (their
    prepared loader)."""

    def read(outputs, batch, indices):
        logits, labels = outputs.logits.float(), batch["labels"]
        nll = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100, reduction="none").sum(-1)
        scored = labels != -100
        correct = ((logits.argmax(-1) == labels) & scored).sum(-1)
        rows = zip(nll.tolist(), scored.sum(-1).tolist(), correct.tolist(), strict=True)
        return list(zip(indices, rows, strict=True))

    rows = encoder.gather_predictions(accelerator, model, eval_dataloader, read)
    nll, count, correct = (sum(column) for column in zip(*rows, strict=True)) if rows else (0.0, 0, 0)
    loss = nll / max(count, 1)
    return {
        "eval_loss": loss,
        "perplexity": math.exp(min(loss, 50.0)),
        "masked_accuracy": correct / max(count, 1),
        "eval_masked_tokens": int(count),
    }


def train(run, train_dataloader, run_evaluation, num_epochs: int, described: str) -> list[dict[str, float]]:
    """The training loop: epochs of micro-batches (`encoder.epoch_batches`, resumed with ``skip_first_batches``;
    the masks of an epoch drawn from ``(seed, epoch, block)``), each an `encoder.training_step`, and after each
    optimizer step the log, evaluations and checkpoints (`encoder.after_optimizer_step`); returns the logged
    history."""
    accumulation = run.args.gradient_accumulation_steps
    start_epoch, resume_update = encoder.resume_position(run)
    progress, log = run.start_training(
        "examples_per_second", f"{described}, {run.max_train_steps} steps on {run.world} process(es)"
    )
    for epoch in range(start_epoch, num_epochs):
        if run.completed_steps >= run.max_train_steps:
            break
        first_update = resume_update if epoch == start_epoch else 0
        batches, updates_in_epoch = encoder.epoch_batches(run, train_dataloader, epoch, first_update)
        for micro_index, batch in enumerate(batches, start=first_update * accumulation):
            loss, examples = encoder.training_step(run, batch)
            log.add(loss, 1, examples)
            if not run.accelerator.sync_gradients:
                continue
            run.completed_steps += 1
            progress.update(1)
            position = (epoch, (micro_index + 1) // accumulation, updates_in_epoch)
            record = encoder.after_optimizer_step(run, log, run_evaluation, position)
            if record is not None:
                progress.set_postfix(loss=f"{record['train_loss']:.3f}")
            if run.completed_steps >= run.max_train_steps:
                break
    progress.close()
    return log.history


def load_data(args: argparse.Namespace):
    """The train and validation splits (capped by --max_train_samples / --max_eval_samples) and the text column."""
    raw, text_column = load_lm_datasets(args)
    raw["train"] = encoder.first_rows(raw["train"], args.max_train_samples)
    raw["validation"] = encoder.first_rows(raw["validation"], args.max_eval_samples)
    return raw, text_column


@dataclass
class MaskedData:
    """The tokenized documents, their blocks, the fixed validation masks and the tokens masking draws from."""

    args: argparse.Namespace
    documents: dict[str, list[list[int]]]
    train_blocks: list[list[int]]
    masked_eval: list[tuple[list[int], list[int]]]
    special_ids: set[int]
    vocab: list[int]
    mask_id: int
    pad_id: int

    @classmethod
    def tokenize(cls, run, raw, text_column: str, tokenizer) -> MaskedData:
        args = run.args
        cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
        special_ids = set(tokenizer.all_special_ids)
        vocab = [i for i in range(len(tokenizer)) if i not in special_ids]
        with run.accelerator.main_process_first():
            documents = {
                split: tokenizer(list(raw[split][text_column]), add_special_tokens=False)["input_ids"]
                for split in ("train", "validation")
            }
        eval_blocks = make_blocks(documents["validation"], args.max_length, cls_id, sep_id)
        mask_id = tokenizer.mask_token_id
        masked_eval = [
            mask_block(b, args.mlm_probability, block_seed(args.seed, EVAL_EPOCH, i), special_ids, mask_id, vocab)
            for i, b in enumerate(eval_blocks)
        ]
        train_blocks = make_blocks(documents["train"], args.max_length, cls_id, sep_id)
        return cls(args, documents, train_blocks, masked_eval, special_ids, vocab, mask_id, tokenizer.pad_token_id)

    def collate(self, indices: list[int], epoch: int) -> dict:
        """The training blocks ``indices``, masked as drawn for ``epoch``, padded."""
        args = self.args
        pairs = [
            mask_block(
                self.train_blocks[i], args.mlm_probability, block_seed(args.seed, epoch, i), self.special_ids,
                self.mask_id, self.vocab,
            )
            for i in indices
        ]  # fmt: skip
        return encoder.pad_batch([p[0] for p in pairs], self.pad_id, {"labels": [p[1] for p in pairs]})

    def eval_collate(self, indices: list[int], epoch: int) -> dict:
        """The validation blocks ``indices`` with their fixed masks, padded."""
        return encoder.pad_batch(
            [self.masked_eval[i][0] for i in indices],
            self.pad_id,
            {"labels": [self.masked_eval[i][1] for i in indices]},
        )

    def describe(self, text_column: str) -> dict[str, Any]:
        """The data as the run record and model card state it."""
        args = self.args
        bundled = not args.train_file and args.dataset_name in ("sotu", "brown")
        titles = {
            "sotu": "State of the Union addresses 1790-2021 (bundled with tf_family)",
            "brown": "The Brown Corpus (bundled with tf_family)",
        }
        return {
            "name": None if args.train_file else args.dataset_name,
            "title": titles[args.dataset_name]
            if bundled
            else (args.dataset_name if not args.train_file else "local files"),
            "on_hub": bool(not args.train_file and not bundled),
            "train_file": args.train_file,
            "validation_file": args.validation_file,
            "text_column": text_column,
            "train_documents": len(self.documents["train"]),
            "train_tokens": int(sum(map(len, self.documents["train"]))),
            "eval_documents": len(self.documents["validation"]),
            "eval_tokens": int(sum(map(len, self.documents["validation"]))),
            "eval_split": "validation",
        }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse → data → model and blocks → train → evaluate → save (each step below)."""
    args = parse_args(argv)
    validate_args(args)
    config_overrides = parse_config_overrides(args.config_overrides, args.arch)
    run = start_run(args, lambda: encoder.default_output_dir(args, TASK))
    raw, text_column = load_data(args)
    tokenizer = encoder.load_tokenizer(args, need_mask=True)
    model = encoder.build_model(args, TASK, tokenizer, config_overrides, AutoModelForMaskedLM)
    encoder.check_max_length(args, model)
    data = MaskedData.tokenize(run, raw, text_column, tokenizer)
    updates = encoder.updates_per_epoch(
        run, len(data.train_blocks), f"the training data fills {len(data.train_blocks)} blocks of {args.max_length} "
        "tokens", "the batch size, --gradient_accumulation_steps or --max_length",
    )  # fmt: skip
    model = apply_lora(model, args)
    hyperparameters = {"max_length": args.max_length, "mlm_probability": args.mlm_probability}
    max_train_steps = args.max_train_steps or args.num_train_epochs * updates
    prepare(run, model, max_train_steps, f"tf_family_{TASK}", **hyperparameters)
    train_dataloader, eval_dataloaders = encoder.example_loaders(
        run, data.collate, len(data.train_blocks), {"validation": (data.eval_collate, len(data.masked_eval))}
    )

    def run_evaluation() -> dict[str, float]:
        return evaluate(run.accelerator, run.model, eval_dataloaders["validation"])

    described = f"{len(data.train_blocks)} training blocks of up to {args.max_length} tokens"
    history = train(run, train_dataloader, run_evaluation, math.ceil(max_train_steps / updates), described)
    metrics = run_evaluation()
    run.log_metrics(metrics)
    dataset = data.describe(text_column)
    return run.finish(tokenizer, recipe="masked_lm", task=TASK, dataset=dataset, metrics=metrics, history=history)


if __name__ == "__main__":
    raise SystemExit(run_main(main))
