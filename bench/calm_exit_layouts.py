"""Which exits to decode with, and which trained model to benchmark, chosen on the calibration prompts only.

For each CALM model folder and each exit layout (``first_exit``/``exit_interval`` pairs, the trained exits or
fewer), on the validation-address prompts that `bench_calm.py` calibrates on: Learn-then-Test at δ ∈ {0.1, 0.2}
(ε = 0.05, token consistency, Hoeffding–Bentkus) with the measure's default grid, then the share of generated
tokens leaving at each exit at the certified λ (on those same prompts: this picks a layout and a model, it is not
the held-out result). The held-out prompts are never read.

Run::

    cd bench && OMP_WAIT_POLICY=PASSIVE python calm_exit_layouts.py \\
        --models ../runs/calm-sotu-distill ../runs/calm-sotu-distill3 --layouts 2,2 2,6
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

from common import loadavg, markdown_table, setup_threads, write_results

setup_threads(2)

import torch  # noqa: E402  (after setup_threads: OpenMP reads OMP_WAIT_POLICY when torch loads)
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from transformers.utils import logging as transformers_logging  # noqa: E402

from tf_family.data import load_sotu  # noqa: E402
from tf_family.early_exit import calibrate_threshold  # noqa: E402
from tf_family.training.early_exit import DEFAULT_GRIDS, cut_prompts, generate_with_exits, score_grid  # noqa: E402

DELTAS = (0.1, 0.2)
EPSILON = 0.05


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", required=True, help="tff_calm folders")
    parser.add_argument(
        "--layouts", nargs="+", default=["2,2", "2,6"], help="first_exit,exit_interval pairs (2,6: exits 2 and 8)"
    )
    parser.add_argument("--measures", nargs="+", default=["restricted_softmax"], choices=list(DEFAULT_GRIDS))
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--prompt-length", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--restricted-vocab", type=int, default=256)
    parser.add_argument("--name", default="calm_exit_layouts")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    transformers_logging.set_verbosity_error()
    sotu = load_sotu()
    rows = []
    for folder in args.models:
        model = AutoModelForCausalLM.from_pretrained(folder).eval()
        tokenizer = AutoTokenizer.from_pretrained(folder)
        config = model.config

        def documents(split: str, tokenizer=tokenizer) -> list[list[int]]:
            return tokenizer(list(sotu[split]["text"]), add_special_tokens=False)["input_ids"]

        counts = Counter(token for document in documents("train") for token in document)
        restricted = sorted(token for token, _ in counts.most_common(args.restricted_vocab))
        prompts, gold = cut_prompts(documents("validation"), args.prompt_length, args.new_tokens)
        index = torch.linspace(0, prompts.shape[0] - 1, args.prompts).long()  # as bench_calm.py picks them
        prompts, gold = prompts[index], gold[index]
        full = generate_with_exits(model, prompts, args.new_tokens, 16, None)
        for layout in args.layouts:
            config.first_exit, config.exit_interval = (int(part) for part in layout.split(","))
            config.validate_architecture()
            for measure in args.measures:
                config.confidence_measure = measure
                config.restricted_vocab = restricted if measure == "restricted_softmax" else None
                # the sweep stops once the mean risk passes the largest δ: no lower threshold can be certified
                scores = score_grid(model, prompts, gold, DEFAULT_GRIDS[measure], "token", 16, full,
                                    lambda losses: float(losses.mean()) > max(DELTAS))  # fmt: skip
                for delta in DELTAS:
                    result = calibrate_threshold(scores.thresholds, scores.losses, delta, EPSILON)
                    shares = {}
                    if result.threshold is not None:
                        exits = generate_with_exits(model, prompts, args.new_tokens, 16, result.threshold)
                        flat = exits.exit_layers.flatten()
                        shares = {point: float((flat == point).double().mean()) for point in config.exit_points()}
                    row = {"model": folder, "exits": config.exit_points(), "measure": measure, "delta": delta,
                           "threshold": result.threshold,
                           "mean_exit_layer": (sum(p * s for p, s in shares.items()) if shares
                                               else float(config.num_hidden_layers)),
                           "exit_shares": shares}  # fmt: skip
                    rows.append(row)
                    print(row, flush=True)
    table = [
        [r["model"], str(r["exits"]), r["measure"], r["delta"], "none" if r["threshold"] is None else f"{r['threshold']:g}",
         f"{r['mean_exit_layer']:.2f}", ", ".join(f"{p}: {s:.3f}" for p, s in r["exit_shares"].items())]
        for r in rows
    ]  # fmt: skip
    markdown = (
        "# CALM exit layouts on the calibration prompts\n\n"
        f"{args.prompts} validation-address prompts of {args.prompt_length} tokens, {args.new_tokens} greedy tokens, "
        f"token consistency, Learn-then-Test (Hoeffding–Bentkus, ε = {EPSILON}); shares of the generated tokens per "
        "exit at the certified λ on the same prompts (for choosing, not a held-out result). "
        f"loadavg {loadavg()}.\n\n"
        + markdown_table(["model", "exits", "measure", "δ", "λ", "mean exit", "share per exit"], table)
        + "\n"
    )
    write_results(args.name, json.loads(json.dumps({"args": vars(args), "rows": rows})), markdown)
    print(markdown)


if __name__ == "__main__":
    main()
