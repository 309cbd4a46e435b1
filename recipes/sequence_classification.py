"""Train or fine-tune a sequence classifier with accelerate: any tf_family architecture with a
``sequence_classification`` head (Longformer, BigBird, …), or any saved ``AutoModelForSequenceClassification``.

    accelerate launch recipes/sequence_classification.py --arch longformer --variant small --max_length 4096
    accelerate launch -m tf_family.recipes.sequence_classification --model_name_or_path runs/my-mlm --lora_r 8

Default data: genre classification of the bundled Brown Corpus (`tf_family.data.load_brown`: 500 documents of about
2,000 words in 15 genres, a fixed stratified train / validation / test split). Each document is read whole, up to
``--max_length`` tokens (the Brown documents are about 2,500-3,500 tokens of the bundled tokenizer: ``--max_length
4096`` reads them whole, 512 truncates them); the run records how many inputs were truncated. Also a Hub dataset
(``--dataset_name``) or local files (``--train_file`` / ``--validation_file`` / ``--test_file``: JSON lines, CSV or
parquet) with a text column and a label column (class names or integers).

Inputs are ``<cls> text <sep>`` (see `tf_family.training.encoder` for the tokenizer and its special tokens).
Metrics (accuracy and macro-F1 over every class, `tf_family.metrics`) on the validation split, and on the test split
when the data has one. Same conventions as the causal-LM recipe: gradient accumulation, clipping, atomic checkpoints
with exact ``--resume_from_checkpoint``, LoRA, model card, push to the Hub.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from accelerate.logging import get_logger
from datasets import ClassLabel, DatasetDict, load_dataset
from transformers import AutoModelForSequenceClassification

from tf_family.data import load_brown
from tf_family.metrics import accuracy, macro_f1
from tf_family.training import apply_lora, check_lora_head, encoder, parse_config_overrides
from tf_family.training.run import prepare, start_run
from tf_family.utils.user_errors import run_main

logger = get_logger(__name__)

TASK = "sequence_classification"
BUNDLED = {"brown": (load_brown, "text", "genre")}
_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Train or fine-tune a sequence classifier (tf_family).")
    encoder.add_common_arguments(parser, TASK, default_dataset="brown", max_length=512)
    data = parser.add_argument_group("classification data")
    data.add_argument("--test_file", help="local test split (same format as --train_file)")
    data.add_argument("--text_column", help="column holding the text (default: 'text')")
    data.add_argument("--label_column", help="column holding the label (default: 'label', or 'genre' for brown)")
    return parser.parse_args(argv)


def validate_args(args: argparse.Namespace) -> None:
    encoder.validate_common_args(args, TASK)
    check_lora_head(args)
    for name in ("train_file", "validation_file", "test_file"):
        path = getattr(args, name)
        if path is not None and Path(path).suffix not in _BUILDERS:
            raise ValueError(f"--{name}={path!r}: use a {sorted(_BUILDERS)} file.")
    if args.test_file and not args.train_file:
        raise ValueError("--test_file needs --train_file too (local files replace --dataset_name).")


def load_data(args: argparse.Namespace) -> tuple[DatasetDict, str, str]:
    """Splits (train, validation, optional test), the text column and the label column."""
    text_column, label_column = args.text_column, args.label_column
    if args.train_file:
        files = {"train": args.train_file, "validation": args.validation_file, "test": args.test_file}
        files = {k: v for k, v in files.items() if v}
        raw = load_dataset(_BUILDERS[Path(args.train_file).suffix], data_files=files)
    elif args.dataset_name in BUNDLED:
        loader, default_text, default_label = BUNDLED[args.dataset_name]
        raw = loader()
        text_column, label_column = text_column or default_text, label_column or default_label
    else:
        raw = load_dataset(args.dataset_name, args.dataset_config_name)
    text_column, label_column = text_column or "text", label_column or "label"
    for split in ("train", "validation"):
        if split not in raw:
            raise ValueError(
                f"the data has no {split!r} split (it has {list(raw)}); pass --train_file and --validation_file."
            )
    columns = raw["train"].column_names
    for flag, column in (("--text_column", text_column), ("--label_column", label_column)):
        if column not in columns:
            raise ValueError(f"{flag}={column!r} is not a column of the data; its columns are {columns}.")
    return raw, text_column, label_column


def label_names(raw: DatasetDict, label_column: str) -> list[str]:
    feature = raw["train"].features[label_column]
    if isinstance(feature, ClassLabel):
        return list(feature.names)
    values = {value for split in raw.values() for value in split[label_column]}
    return [str(v) for v in sorted(values)]


def label_ids(raw: DatasetDict, label_column: str, names: list[str]) -> dict[str, list[int]]:
    if isinstance(raw["train"].features[label_column], ClassLabel):
        return {split: list(raw[split][label_column]) for split in raw}
    index = {name: i for i, name in enumerate(names)}
    return {split: [index[str(v)] for v in raw[split][label_column]] for split in raw}


def encode(texts: list[str], tokenizer, max_length: int) -> tuple[list[list[int]], int]:
    """``<cls> text <sep>`` token ids, the text cut to ``max_length - 2`` tokens; also how many texts were cut."""
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    body = max_length - 2
    encoded = [[tokenizer.cls_token_id, *row[:body], tokenizer.sep_token_id] for row in ids]
    return encoded, sum(len(row) > body for row in ids)


def evaluate(accelerator, model, eval_dataloader, labels: list[int], names: list[str]) -> dict[str, float]:
    """Accuracy and macro-F1 (over every class) of the argmax predictions on one split (its prepared loader)."""

    def read(outputs, batch, indices):
        return list(zip(indices, outputs.logits.argmax(-1).tolist(), strict=True))

    predictions = encoder.gather_predictions(accelerator, model, eval_dataloader, read)
    return {
        "accuracy": accuracy(predictions, labels),
        "macro_f1": macro_f1(predictions, labels, labels=list(range(len(names)))),
        "examples": len(labels),
    }


def train(run, train_dataloader, run_evaluation, num_epochs: int, described: str) -> list[dict[str, float]]:
    """The training loop: epochs of micro-batches (`encoder.epoch_batches`, resumed with ``skip_first_batches``),
    each an `encoder.training_step`, and after each optimizer step the log, evaluations and checkpoints
    (`encoder.after_optimizer_step`); returns the logged history."""
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


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse → data → model and inputs → train → evaluate (validation, test) → save."""
    args = parse_args(argv)
    validate_args(args)
    config_overrides = parse_config_overrides(args.config_overrides, args.arch)
    run = start_run(args, lambda: encoder.default_output_dir(args, TASK))
    raw, text_column, label_column = load_data(args)
    raw["train"] = encoder.first_rows(raw["train"], args.max_train_samples)
    for split in ("validation", "test"):
        if split in raw:
            raw[split] = encoder.first_rows(raw[split], args.max_eval_samples)
    names = label_names(raw, label_column)
    if len(names) < 2:
        raise ValueError(f"--label_column {label_column!r} holds {len(names)} class(es); classification needs 2+.")
    labels = label_ids(raw, label_column, names)
    tokenizer = encoder.load_tokenizer(args)
    head = {
        "num_labels": len(names),
        "id2label": dict(enumerate(names)),
        "label2id": {n: i for i, n in enumerate(names)},
    }
    model = encoder.build_model(args, TASK, tokenizer, config_overrides, AutoModelForSequenceClassification, **head)
    encoder.check_max_length(args, model)
    with run.accelerator.main_process_first():
        encoded, truncated = {}, {}
        for split in raw:
            encoded[split], truncated[split] = encode(list(raw[split][text_column]), tokenizer, args.max_length)
    train_examples, pad_id = encoded["train"], tokenizer.pad_token_id
    updates = encoder.updates_per_epoch(
        run, len(train_examples), f"{len(train_examples)} training examples make", "the batch size or "
        "--gradient_accumulation_steps",
    )  # fmt: skip
    model = apply_lora(model, args, train_head=True)
    max_train_steps = args.max_train_steps or args.num_train_epochs * updates
    prepare(run, model, max_train_steps, f"tf_family_{TASK}", max_length=args.max_length, num_labels=len(names))

    def collate(indices: list[int], epoch: int) -> dict:
        return encoder.pad_batch(
            [train_examples[i] for i in indices], pad_id, {"labels": [labels["train"][i] for i in indices]}
        )

    def eval_collate(split: str):
        return lambda indices, epoch: encoder.pad_batch([encoded[split][i] for i in indices], pad_id)

    eval_splits = [split for split in ("validation", "test") if split in encoded]
    train_dataloader, eval_dataloaders = encoder.example_loaders(
        run, collate, len(train_examples), {split: (eval_collate(split), len(encoded[split])) for split in eval_splits}
    )

    def run_evaluation(split: str = "validation") -> dict[str, float]:
        return evaluate(run.accelerator, run.model, eval_dataloaders[split], labels[split], names)

    described = (
        f"{len(train_examples)} training examples ({truncated['train']} cut to {args.max_length} tokens), "
        f"{len(names)} classes"
    )
    history = train(run, train_dataloader, run_evaluation, math.ceil(max_train_steps / updates), described)
    metrics = {f"eval_{k}": v for k, v in run_evaluation("validation").items()}
    if "test" in encoded:
        metrics.update({f"test_{k}": v for k, v in run_evaluation("test").items()})
    run.log_metrics(metrics, label="evaluation")
    data = describe_data(args, text_column, label_column, names, encoded, truncated)
    summary = run.finish(
        tokenizer, recipe="sequence_classification", task=TASK, dataset=data, metrics=metrics, history=history
    )
    return {**summary, "truncated_inputs": truncated}


def describe_data(args, text_column: str, label_column: str, names: list[str], encoded, truncated) -> dict[str, Any]:
    """The data as the run record and model card state it."""
    lengths = {split: [len(row) for row in rows] for split, rows in encoded.items()}
    bundled = not args.train_file and args.dataset_name in BUNDLED
    data = {
        "name": None if args.train_file else args.dataset_name,
        "title": "Brown Corpus genres (bundled with tf_family)"
        if bundled
        else (args.dataset_name if not args.train_file else "local files"),
        "on_hub": bool(not args.train_file and not bundled),
        "train_file": args.train_file,
        "validation_file": args.validation_file,
        "test_file": args.test_file,
        "text_column": text_column,
        "label_column": label_column,
        "labels": names,
        "train_documents": len(encoded["train"]),
        "eval_documents": len(encoded["validation"]),
        "test_documents": len(encoded.get("test", [])) or None,
        "truncated_inputs": truncated,
        "mean_input_tokens": {s: sum(v) / max(len(v), 1) for s, v in lengths.items()},
        "eval_split": "validation",
    }
    if bundled and args.dataset_name == "brown":
        data["description"] = (
            "Genre classification (15 genres) of the Brown Corpus documents, bundled with tf_family "
            "(`tf_family.data.load_brown`, fixed stratified split)."
        )
    return data


if __name__ == "__main__":
    raise SystemExit(run_main(main))
