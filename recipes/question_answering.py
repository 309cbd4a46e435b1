"""Train or fine-tune an extractive question-answering model with accelerate: any tf_family architecture with a
``question_answering`` head (Longformer, BigBird, …), or any saved ``AutoModelForQuestionAnswering``.

    accelerate launch recipes/question_answering.py --model_name_or_path runs/my-mlm --dataset_name rajpurkar/squad
    accelerate launch -m tf_family.recipes.question_answering --arch longformer --variant tiny \\
        --train_file train.json --validation_file dev.json --max_length 1024

Data in the SQuAD (v1.1) format: a Hub dataset (``--dataset_name``, e.g. ``rajpurkar/squad``) or local files
(``--train_file`` / ``--validation_file``): either the official nested JSON (``{"data": [{"paragraphs": [{"context",
"qas": [{"id", "question", "answers": [{"text", "answer_start"}]}]}]}]}``) or flat rows (JSON lines, JSON, CSV,
parquet) with ``id``, ``question``, ``context`` and ``answers`` = ``{"text": [...], "answer_start": [...]}``, as on
the Hub. Every question has at least one answer (v1.1; unanswerable questions are refused).

Features: ``<cls> question <sep> context window <sep>``, the question cut to ``--max_question_length`` tokens, the
context cut into windows of the remaining length that overlap by ``--doc_stride`` tokens. Training targets the first
gold answer in each window holding it whole, and the ``<cls>`` token in the others. Prediction takes, over all windows
of a question, the span (at most ``--max_answer_length`` tokens, inside the context) with the highest start + end
logit. Metrics: SQuAD's exact match and F1 (percent, best over the gold answers; `tf_family.metrics`). Longformer
gives the tokens before the first ``<sep>`` (``<cls>`` and the question) global attention, as in transformers.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import torch
from accelerate.logging import get_logger
from datasets import Dataset, DatasetDict, load_dataset
from transformers import AutoModelForQuestionAnswering

from tf_family.metrics import squad_scores
from tf_family.training import apply_lora, check_lora_head, encoder, parse_config_overrides
from tf_family.training.run import prepare, start_run
from tf_family.utils.user_errors import run_main

logger = get_logger(__name__)

TASK = "question_answering"
_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
COLUMNS = ("question", "context", "answers")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Train or fine-tune an extractive QA model (tf_family).")
    encoder.add_common_arguments(parser, TASK, default_dataset=None, max_length=512)
    data = parser.add_argument_group("question-answering data")
    data.add_argument("--max_question_length", type=int, default=64, help="question tokens kept")
    data.add_argument("--doc_stride", type=int, default=128, help="tokens shared by consecutive context windows")
    data.add_argument("--max_answer_length", type=int, default=30, help="longest predicted answer, in tokens")
    data.add_argument("--n_best_size", type=int, default=20, help="start / end candidates per window")
    return parser.parse_args(argv)


def validate_args(args: argparse.Namespace) -> None:
    encoder.validate_common_args(args, TASK, min_length=8)
    check_lora_head(args)
    if not args.train_file and not args.dataset_name:
        raise ValueError("No data: pass --dataset_name (a Hub id such as rajpurkar/squad) or --train_file.")
    for name in ("train_file", "validation_file"):
        path = getattr(args, name)
        if path is not None and Path(path).suffix not in _BUILDERS:
            raise ValueError(f"--{name}={path!r}: use a {sorted(_BUILDERS)} file.")
    for name in ("max_question_length", "max_answer_length", "n_best_size"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name}={getattr(args, name)} must be at least 1.")
    if args.doc_stride < 0:
        raise ValueError(f"--doc_stride={args.doc_stride} must be >= 0.")
    room = args.max_length - args.max_question_length - 3
    if args.doc_stride >= room:
        raise ValueError(
            f"--doc_stride={args.doc_stride} must be smaller than the context room of a window ({room} = --max_length "
            f"{args.max_length} - --max_question_length {args.max_question_length} - 3 special tokens); lower it or "
            "raise --max_length."
        )


def read_squad_json(path: str) -> Dataset | None:
    """The official nested SQuAD JSON as flat rows, or None when ``path`` is not in that format."""
    if Path(path).suffix != ".json":
        return None
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return None  # JSON lines
    if not isinstance(document, dict) or "data" not in document:
        return None
    rows = []
    for article in document["data"]:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                rows.append(
                    {
                        "id": str(qa["id"]),
                        "title": article.get("title", ""),
                        "context": paragraph["context"],
                        "question": qa["question"],
                        "answers": {
                            "text": [a["text"] for a in qa.get("answers", [])],
                            "answer_start": [int(a["answer_start"]) for a in qa.get("answers", [])],
                        },
                    }
                )
    return Dataset.from_list(rows)


def load_data(args: argparse.Namespace) -> DatasetDict:
    if args.train_file:
        files = {"train": args.train_file, **({"validation": args.validation_file} if args.validation_file else {})}
        nested = {split: read_squad_json(path) for split, path in files.items()}
        if all(d is not None for d in nested.values()):
            raw = DatasetDict(nested)
        elif any(d is not None for d in nested.values()):
            raise ValueError("--train_file and --validation_file must both be nested SQuAD JSON, or both flat rows.")
        else:
            raw = load_dataset(_BUILDERS[Path(args.train_file).suffix], data_files=files)
    else:
        raw = load_dataset(args.dataset_name, args.dataset_config_name)
    for split in ("train", "validation"):
        if split not in raw:
            raise ValueError(f"the data has no {split!r} split (it has {list(raw)}); pass --validation_file.")
        missing = [c for c in COLUMNS if c not in raw[split].column_names]
        if missing:
            raise ValueError(
                f"the {split} data lacks the SQuAD columns {missing} (it has {raw[split].column_names}); see "
                "recipes/question_answering.py for the format."
            )
    return raw


def build_features(examples: Dataset, tokenizer, args: argparse.Namespace, train: bool) -> list[dict[str, Any]]:
    """Windows of every example: input ids, the example index, the character offsets of its context tokens and
    (for training) the answer's start / end token (0, the cls token, when the window does not hold it whole)."""
    questions = tokenizer(list(examples["question"]), add_special_tokens=False)["input_ids"]
    contexts = tokenizer(list(examples["context"]), add_special_tokens=False, return_offsets_mapping=True)
    features = []
    for index, answers in enumerate(examples["answers"]):
        if not answers["text"]:
            raise ValueError(
                f"example {examples[index].get('id', index)!r} has no answer; this recipe scores SQuAD v1.1 "
                "(every question answerable): drop unanswerable questions."
            )
        question = questions[index][: args.max_question_length]
        ids, offsets = contexts["input_ids"][index], contexts["offset_mapping"][index]
        room = args.max_length - len(question) - 3
        step = room - args.doc_stride  # > 0: validate_args checked the shortest room
        answer_start = int(answers["answer_start"][0])
        answer_end = answer_start + len(answers["text"][0])
        start = 0
        while True:
            end = min(start + room, len(ids))
            window = ids[start:end]
            prefix = len(question) + 2
            feature = {
                "example": index,
                "input_ids": [
                    tokenizer.cls_token_id,
                    *question,
                    tokenizer.sep_token_id,
                    *window,
                    tokenizer.sep_token_id,
                ],
                "context_start": prefix,
                "offsets": [tuple(o) for o in offsets[start:end]],
            }
            if train:
                first = next((i for i, (a, b) in enumerate(feature["offsets"]) if b > answer_start), None)
                last = next((i for i in reversed(range(len(window))) if feature["offsets"][i][0] < answer_end), None)
                holds = (
                    first is not None
                    and last is not None
                    and feature["offsets"][0][0] <= answer_start
                    and feature["offsets"][-1][1] >= answer_end
                    and first <= last
                )
                feature["start_positions"] = prefix + first if holds else 0
                feature["end_positions"] = prefix + last if holds else 0
            features.append(feature)
            if end >= len(ids):
                break
            start += step
    return features


def best_answers(
    examples: Dataset, features: list[dict], logits: list[tuple[list[float], list[float]]], args
) -> list[str]:
    """For every example, the highest-scoring span over all of its windows (start + end logit)."""
    best: dict[int, tuple[float, str]] = {}
    for feature, (start_logits, end_logits) in zip(features, logits, strict=True):
        context = examples[feature["example"]]["context"]
        starts = torch.tensor(start_logits).topk(min(args.n_best_size, len(start_logits))).indices.tolist()
        ends = torch.tensor(end_logits).topk(min(args.n_best_size, len(end_logits))).indices.tolist()
        for s in starts:
            for e in ends:
                if e < s or e - s + 1 > args.max_answer_length:
                    continue
                score = start_logits[s] + end_logits[e]
                if feature["example"] not in best or score > best[feature["example"]][0]:
                    text = context[feature["offsets"][s][0] : feature["offsets"][e][1]]
                    best[feature["example"]] = (score, text)
    return [best.get(i, (0.0, ""))[1] for i in range(len(examples))]


def evaluate(accelerator, model, eval_dataloader, examples: Dataset, features: list[dict], args) -> dict[str, float]:
    """SQuAD exact match and F1 of the best spans (the windows read through their prepared loader)."""

    def read(outputs, batch, indices):
        items = []
        for row, index in enumerate(indices):
            first = features[index]["context_start"]
            last = first + len(features[index]["offsets"])
            items.append(
                (
                    index,
                    (
                        outputs.start_logits[row, first:last].float().tolist(),
                        outputs.end_logits[row, first:last].float().tolist(),
                    ),
                )
            )
        return items

    logits = encoder.gather_predictions(accelerator, model, eval_dataloader, read)
    predictions = best_answers(examples, features, logits, args)
    scores = squad_scores(predictions, [a["text"] for a in examples["answers"]])
    return {**scores, "eval_examples": len(examples), "eval_features": len(features)}


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
    """Parse → data → model and windows → train → evaluate → save."""
    args = parse_args(argv)
    validate_args(args)
    config_overrides = parse_config_overrides(args.config_overrides, args.arch)
    run = start_run(args, lambda: encoder.default_output_dir(args, TASK))
    raw = load_data(args)
    raw["train"] = encoder.first_rows(raw["train"], args.max_train_samples)
    raw["validation"] = encoder.first_rows(raw["validation"], args.max_eval_samples)
    tokenizer = encoder.load_tokenizer(args)
    model = encoder.build_model(args, TASK, tokenizer, config_overrides, AutoModelForQuestionAnswering)
    encoder.check_max_length(args, model)
    with run.accelerator.main_process_first():
        train_features = build_features(raw["train"], tokenizer, args, train=True)
        eval_features = build_features(raw["validation"], tokenizer, args, train=False)
    updates = encoder.updates_per_epoch(
        run, len(train_features), f"{len(train_features)} training windows make", "the batch size or "
        "--gradient_accumulation_steps",
    )  # fmt: skip
    model = apply_lora(model, args, train_head=True)
    pad_id = tokenizer.pad_token_id
    max_train_steps = args.max_train_steps or args.num_train_epochs * updates
    prepare(
        run, model, max_train_steps, f"tf_family_{TASK}", max_length=args.max_length, doc_stride=args.doc_stride,
        max_question_length=args.max_question_length, max_answer_length=args.max_answer_length,
    )  # fmt: skip

    def collate(indices: list[int], epoch: int) -> dict:
        rows = [train_features[i] for i in indices]
        targets = {
            "start_positions": [r["start_positions"] for r in rows],
            "end_positions": [r["end_positions"] for r in rows],
        }
        return encoder.pad_batch([r["input_ids"] for r in rows], pad_id, targets)

    def eval_collate(indices: list[int], epoch: int) -> dict:
        return encoder.pad_batch([eval_features[i]["input_ids"] for i in indices], pad_id)

    train_dataloader, eval_dataloaders = encoder.example_loaders(
        run, collate, len(train_features), {"validation": (eval_collate, len(eval_features))}
    )

    def run_evaluation() -> dict[str, float]:
        return evaluate(
            run.accelerator, run.model, eval_dataloaders["validation"], raw["validation"], eval_features, args
        )

    described = f"{len(raw['train'])} training questions in {len(train_features)} windows"
    history = train(run, train_dataloader, run_evaluation, math.ceil(max_train_steps / updates), described)
    metrics = run_evaluation()
    run.log_metrics(metrics)
    data = {
        "name": None if args.train_file else args.dataset_name,
        "title": "local files" if args.train_file else args.dataset_name,
        "on_hub": not args.train_file,
        "train_file": args.train_file,
        "validation_file": args.validation_file,
        "train_examples": len(raw["train"]),
        "train_windows": len(train_features),
        "eval_examples": len(raw["validation"]),
        "eval_windows": len(eval_features),
        "eval_split": "validation",
    }
    return run.finish(
        tokenizer, recipe="question_answering", task=TASK, dataset=data, metrics=metrics, history=history
    )


if __name__ == "__main__":
    raise SystemExit(run_main(main))
