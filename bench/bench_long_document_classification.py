"""Brown Corpus genre classification: a small Longformer and BigBird reading the whole document against the same
models reading its first 512 tokens, trained by the sequence-classification recipe.

Every model is trained from scratch by ``recipes/sequence_classification.py`` (called in-process,
``sequence_classification.main([...])``) on the bundled Brown Corpus (`tf_family.data.load_brown`: 15 genres, train
396 / validation 52 / test 52 documents, a fixed stratified split), with the bundled SOTU BPE tokenizer: the
documents are 2,500-4,400 tokens long (mean about 3,260). For each architecture the two runs share everything (width,
depth, attention pattern, optimiser, schedule, epochs, batch, seed, data order) except ``--max_length``:

* **whole**: ``--max_length 4608``, no document is cut (the recipe counts the truncated inputs; 0 here);
* **first 512**: ``--max_length 512``, every document is cut to its first 510 tokens.

The models are small (``--hidden`` 128, ``--layers`` 2, 2 heads; Longformer windows of 128 tokens, BigBird blocks of
32 with 2 random blocks) and train for ``--epochs`` epochs: the point is the comparison at equal model and budget,
not the best genre classifier. Reported: validation and test accuracy and macro-F1 (over all 15 genres) of each run,
its training time, and the majority-class baseline. With 52 documents per split, one document is 1.9 points of
accuracy, and a single seed is used: differences of a few points are noise. The whole-document runs read about 6.4x
the tokens of the 512-token runs (5-7x the time measured).

Run: ``python bench/bench_long_document_classification.py`` (12 minutes measured on 2 shared cores with both
architectures; ``--archs longformer`` halves it), ``--quick`` for a smoke run under a minute. ``--seeds 0 1 2``
repeats every run with each seed and adds the mean and standard deviation over seeds.
"""

from __future__ import annotations

import argparse
import collections
import importlib
import itertools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TQDM_MININTERVAL", "20")

from common import format_seconds, markdown_table, setup_threads, write_results  # noqa: E402

setup_threads(2)

from tf_family.data import BROWN_GENRES, load_brown  # noqa: E402
from tf_family.metrics import accuracy, macro_f1  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
WHOLE, TRUNCATED = 4608, 512
ARCH_OVERRIDES = {
    "longformer": ["attention_window=128", f"max_position_embeddings={WHOLE + 2}"],
    "big_bird": ["block_size=32", "num_random_blocks=2", f"max_position_embeddings={WHOLE}"],
}


def load_recipe():
    """The recipe of this checkout (``recipes/``), else the installed ``tf_family.recipes`` one."""
    if (REPO_ROOT / "recipes" / "sequence_classification.py").is_file():
        sys.path.insert(0, str(REPO_ROOT))
        try:
            return importlib.import_module("recipes.sequence_classification")
        finally:
            sys.path.remove(str(REPO_ROOT))
    return importlib.import_module("tf_family.recipes.sequence_classification")


sequence_classification = load_recipe()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--archs", nargs="+", default=["longformer", "big_bird"], choices=sorted(ARCH_OVERRIDES))
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seeds", nargs="+", type=int, help="several seeds (overrides --seed): adds mean and spread")
    parser.add_argument("--lengths", nargs="+", type=int, default=[WHOLE, TRUNCATED])
    parser.add_argument("--quick", action="store_true", help="smoke run: 16 training documents, 1 epoch, 1024 tokens")
    parser.add_argument(
        "--name", default="long_document_classification", help="results file name in bench/results/ (without suffix)"
    )
    return parser.parse_args()


def majority_baseline() -> dict[str, float]:
    brown = load_brown()
    majority = collections.Counter(brown["train"]["genre"]).most_common(1)[0][0]
    result = {"majority_genre": BROWN_GENRES[majority]}
    for split in ("validation", "test"):
        labels = list(brown[split]["genre"])
        predictions = [majority] * len(labels)
        result[f"{split}_accuracy"] = accuracy(predictions, labels)
        result[f"{split}_macro_f1"] = macro_f1(predictions, labels, labels=list(range(len(BROWN_GENRES))))
    return result


def reset_accelerate() -> None:
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def main() -> None:
    args = parse_args()
    lengths = [1024, TRUNCATED] if args.quick else args.lengths
    runs = []
    baseline = majority_baseline()
    seeds = args.seeds or [args.seed]
    for arch, length, seed in itertools.product(args.archs, lengths, seeds):  # one run each
        overrides = [
            f"hidden_size={args.hidden}",
            f"num_hidden_layers={args.layers}",
            f"num_attention_heads={args.heads}",
            f"intermediate_size={4 * args.hidden}",
            *ARCH_OVERRIDES[arch],
        ]
        argv = [
            "--arch", arch, "--variant", "small", "--config_overrides", *overrides,
            "--dataset_name", "brown", "--max_length", str(length),
            "--num_train_epochs", str(1 if args.quick else args.epochs),
            "--per_device_train_batch_size", str(args.batch), "--per_device_eval_batch_size", str(args.batch),
            "--learning_rate", str(args.lr), "--num_warmup_steps", str(args.warmup), "--seed", str(seed),
            "--logging_steps", "25",
        ]  # fmt: skip
        if args.quick:
            argv += ["--max_train_samples", "16", "--max_eval_samples", "8"]
        with tempfile.TemporaryDirectory() as folder:
            reset_accelerate()
            start = time.perf_counter()
            result = sequence_classification.main([*argv, "--output_dir", folder])
            seconds = time.perf_counter() - start
        runs.append(
            {
                "arch": arch,
                "max_length": length,
                "seed": seed,
                "train_and_eval_s": seconds,
                "truncated_inputs": result["truncated_inputs"],
                **{k: result[k] for k in result if k.startswith(("eval_", "test_"))},
                "recipe_args": argv,
            }
        )
        print(f"{arch} max_length {length} seed {seed}: {runs[-1]}", flush=True)

    rows = [
        [
            r["arch"] + (f" (seed {r['seed']})" if len(seeds) > 1 else ""),
            f"{r['max_length']} ({'whole' if r['truncated_inputs']['train'] == 0 else 'cut'})",
            f"{r['truncated_inputs']['train']} / {r['truncated_inputs']['validation']} / {r['truncated_inputs']['test']}",
            f"{100 * r['eval_accuracy']:.1f}",
            f"{100 * r['eval_macro_f1']:.1f}",
            f"{100 * r['test_accuracy']:.1f}",
            f"{100 * r['test_macro_f1']:.1f}",
            format_seconds(r["train_and_eval_s"]),
        ]
        for r in runs
    ]
    rows.append(
        [
            f"majority class ({baseline['majority_genre']})",
            "-",
            "-",
            f"{100 * baseline['validation_accuracy']:.1f}",
            f"{100 * baseline['validation_macro_f1']:.1f}",
            f"{100 * baseline['test_accuracy']:.1f}",
            f"{100 * baseline['test_macro_f1']:.1f}",
            "-",
        ]
    )
    headers = ["model", "max_length", "cut docs (train/val/test)", "val acc %", "val macro-F1 %", "test acc %",
               "test macro-F1 %", "train + eval"]  # fmt: skip
    setting = (
        f"{'QUICK SMOKE RUN (16 training documents, 1 epoch): not a result. ' if args.quick else ''}"
        f"From scratch, hidden {args.hidden}, {args.layers} layers, {args.heads} heads, {args.epochs if not args.quick else 1} "
        f"epochs, batch {args.batch}, AdamW lr {args.lr} (linear, {args.warmup} warm-up steps), "
        f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}. "
        "52 documents per split: one document is 1.9 points of accuracy."
    )
    markdown = "# Brown Corpus genres: whole documents against the first 512 tokens\n\n" + setting + "\n\n"
    markdown += markdown_table(headers, rows)
    if len(seeds) > 1:
        summary = []
        for arch in args.archs:
            for length in lengths:
                group = [r for r in runs if r["arch"] == arch and r["max_length"] == length]
                cells = []
                for key in ("eval_accuracy", "eval_macro_f1", "test_accuracy", "test_macro_f1"):
                    values = [100 * r[key] for r in group]
                    cells.append(f"{statistics.mean(values):.1f} ± {statistics.stdev(values):.1f}")
                summary.append([arch, length, len(group), *cells])
        markdown += (
            f"\n\nMean ± standard deviation over seeds {', '.join(map(str, seeds))}:\n\n"
            + markdown_table(
                ["model", "max_length", "runs", "val acc %", "val macro-F1 %", "test acc %", "test macro-F1 %"],
                summary,
            )  # fmt: skip
        )
    name = args.name + ("_quick" if args.quick else "")
    payload = {"settings": vars(args), "runs": runs, "majority_baseline": baseline}
    json_path, md_path = write_results(name, payload, markdown)
    print(markdown)
    print(f"wrote {json_path} and {md_path}")


if __name__ == "__main__":
    main()
