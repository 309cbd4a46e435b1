"""kNN-LM with accelerate: build a datastore for any causal LM, then pick λ and k on validation and report test.

    accelerate launch recipes/knn_lm.py build --model_name_or_path runs/my-lm --output_dir runs/my-lm-datastore \\
        --index_types flat ivf_pq
    accelerate launch -m tf_family.recipes.knn_lm eval --model_name_or_path runs/my-lm \\
        --datastore runs/my-lm-datastore --lmbdas 0.1 0.25 0.5 --ks 16 64 256 --output_dir runs/my-knn-lm

``build`` runs the model over a split (default ``train``) of the data (the bundled State of the Union corpus, a Hub
dataset or local files, loaded as in `recipes/causal_lm.py`), storing the key at ``--key_point`` and the next token
of every scored position (`tf_family.retrieval.build_datastore`: float16 safetensors shards, a JSON description with
the model's and tokenizer's fingerprints), then optionally trains faiss indexes over the keys.

``eval`` runs the model once over validation (and test, when the data has one), searches the datastore once with
the largest k, and scores every (k, λ) of the grid from that one search (the neighbours are sorted, so the first
k of them are the k nearest). It reports the base LM's perplexity and the kNN-LM's for every grid point, picks the
best on validation, reports test with it, and (``--output_dir``) saves a `TffKNNLMForCausalLM` with the chosen
settings whose config points at the datastore, plus a model card and ``training_run.json``.

Blocks are read independently (no segment memory is carried), for every model, when building and when evaluating,
so keys and queries come from the same kind of context; each split is read in order through a `DataLoader` prepared
by accelerate (`sequential_block_loader`). One process: datastore building and the grid are not
split across processes (``accelerate launch --num_processes 1``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any

import datasets
import torch
import torch.nn.functional as F
import transformers
from accelerate import Accelerator
from accelerate.logging import get_logger
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer

import tf_family
from tf_family.data import SOTU_TOKENIZER_DIR, pack_into_blocks
from tf_family.data.packing import IGNORE_INDEX
from tf_family.data.sampling import sequential_block_loader
from tf_family.memory.knn import FAISS_INDEX_TYPES
from tf_family.memory.knn_lm import knn_target_log_probs
from tf_family.models.knn_lm.modeling_knn_lm import DATASTORE_FOLDER, TffKNNLMForCausalLM
from tf_family.retrieval.datastore import (
    KEY_POINTS,
    KNNDatastore,
    build_datastore,
    capture_module_inputs,
    resolve_key_module,
)
from tf_family.shipping.hub import hub_id_of, portable_reference
from tf_family.training import ending_run, publish_run, save_tokenizer
from tf_family.training.arguments import add_debug_argument, check_local_sources
from tf_family.training.language_modeling import (
    add_text_data_arguments,
    document_separator,
    language_model_metrics,
    load_lm_datasets,
)
from tf_family.utils.files import atomic_write_text
from tf_family.utils.user_errors import run_main

logger = get_logger(__name__)

DEFAULT_LMBDAS = [0.05, 0.1, 0.25, 0.4, 0.6]
DEFAULT_KS = [8, 32, 128, 512]


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model_name_or_path", required=True, help="saved folder or Hub id (any AutoModelForCausalLM)"
    )
    parser.add_argument("--tokenizer_name", help="tokenizer folder or Hub id (default: the model's, else the bundled)")
    data = parser.add_argument_group("data")
    add_text_data_arguments(data)
    data.add_argument("--block_size", type=int, default=128, help="tokens per block the model reads")
    data.add_argument("--max_samples", type=int, help="use only the first N documents of each split")
    data.add_argument("--per_device_batch_size", type=int, default=8)
    parser.add_argument("--key_point", choices=list(KEY_POINTS), default="lm_head_input")
    parser.add_argument("--module_path", help="dotted module whose input is the key (overrides --key_point)")
    parser.add_argument("--cpu", action="store_true", help="run on CPU even if a GPU is present")
    parser.add_argument("--seed", type=int, default=42)
    add_debug_argument(parser)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="kNN-LM: build a datastore, or evaluate a λ × k grid (tf_family).")
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="build a datastore of (key, next token) over a split")
    _add_common(build)
    build.add_argument("--split", default="train", help="the split whose tokens go into the datastore")
    build.add_argument("--output_dir", required=True, help="the datastore folder")
    build.add_argument("--overwrite_output_dir", action="store_true")
    build.add_argument("--key_dtype", choices=["float16", "float32"], default="float16")
    build.add_argument("--shard_size", type=int, default=1_000_000, help="keys per safetensors shard")
    build.add_argument("--index_types", nargs="*", default=[], choices=list(FAISS_INDEX_TYPES), help="faiss indexes")
    build.add_argument("--distance", choices=["l2", "ip"], default="l2")
    build.add_argument("--nlist", type=int, default=1024, help="IVF centroids (lowered to keys / 39 when fewer)")
    build.add_argument("--pq_m", type=int, default=16, help="IVF-PQ sub-quantizers (must divide the key width)")

    evaluate = commands.add_parser("eval", help="perplexity of the base LM and of the kNN-LM over a λ × k grid")
    _add_common(evaluate)
    evaluate.add_argument("--datastore", required=True, help="a datastore folder written by `build`")
    evaluate.add_argument("--lmbdas", type=float, nargs="+", default=DEFAULT_LMBDAS)
    evaluate.add_argument("--ks", type=int, nargs="+", default=DEFAULT_KS)
    evaluate.add_argument("--knn_temperature", type=float, default=1.0)
    evaluate.add_argument("--distance", choices=["l2", "ip"], default="l2")
    evaluate.add_argument("--index_type", choices=["exact", *FAISS_INDEX_TYPES], default="exact")
    evaluate.add_argument("--nprobe", type=int, help="IVF lists visited per query (overrides the saved value)")
    evaluate.add_argument("--no_recompute_distances", action="store_true", help="use an approximate index's scores")
    evaluate.add_argument("--force", action="store_true", help="use a datastore built by another model/tokenizer")
    evaluate.add_argument("--output_dir", help="save a TffKNNLMForCausalLM with the best λ and k here")
    evaluate.add_argument("--overwrite_output_dir", action="store_true")
    return parser.parse_args(argv)


def validate_args(args: argparse.Namespace) -> None:
    """Refuse, before any work, what cannot run; each message says what to change."""
    check_local_sources(args)  # --datastore has its own check ("not a datastore folder")
    for name in ("block_size", "per_device_batch_size", "max_samples"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name}={value} must be at least 1.")
    needs_faiss = args.index_types if args.command == "build" else [t for t in [args.index_type] if t != "exact"]
    if needs_faiss and importlib.util.find_spec("faiss") is None:
        raise ValueError(
            f'the faiss indexes {needs_faiss} need faiss: pip install "tf-family[faiss]" (faiss-cpu), or leave '
            "them out (exact search needs nothing)."
        )
    if args.command == "build":
        if args.shard_size < 1:
            raise ValueError(f"--shard_size={args.shard_size} must be at least 1.")
        if Path(args.output_dir, "datastore.json").exists() and not args.overwrite_output_dir:
            raise ValueError(
                f"--output_dir {args.output_dir} already holds a datastore; pass --overwrite_output_dir or another folder."
            )
        return
    if not Path(args.datastore, "datastore.json").is_file():
        raise ValueError(f"--datastore {args.datastore} is not a datastore folder (no datastore.json); run `build`.")
    bad = [x for x in args.lmbdas if not 0.0 <= x <= 1.0]
    if bad:
        raise ValueError(f"--lmbdas {bad} must lie in [0, 1].")
    if min(args.ks) < 1:
        raise ValueError(f"--ks {args.ks} must all be at least 1.")
    if not args.knn_temperature > 0:
        raise ValueError(f"--knn_temperature={args.knn_temperature} must be > 0.")
    if args.output_dir and Path(args.output_dir, "config.json").exists() and not args.overwrite_output_dir:
        raise ValueError(
            f"--output_dir {args.output_dir} holds a model; pass --overwrite_output_dir or another folder."
        )


def load_blocks(args: argparse.Namespace, tokenizer, splits: list[str]) -> dict[str, Any]:
    """The requested splits (those the data has) as `LMBlocks`, with their character counts."""
    raw, text_column = load_lm_datasets(args)
    separator_id = document_separator(tokenizer)
    out = {}
    for split in splits:
        if split not in raw:
            continue
        rows = raw[split]
        if args.max_samples:
            rows = rows.select(range(min(args.max_samples, len(rows))))
        texts = list(rows[text_column])
        documents = []
        for start in tqdm(
            range(0, len(texts), 16), desc=f"tokenizing {split}", disable=not getattr(args, "show_progress", False)
        ):
            documents += tokenizer(texts[start : start + 16], add_special_tokens=False)["input_ids"]
        out[split] = (pack_into_blocks(documents, args.block_size, separator_id), sum(map(len, texts)))
    return out


def load_model_and_tokenizer(args: argparse.Namespace, device: torch.device):
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_name or _tokenizer_source(args))
    model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path).to(device).eval()
    vocab = getattr(model.config, "vocab_size", None)
    if vocab is not None and len(tokenizer) > vocab:
        raise ValueError(f"the tokenizer has {len(tokenizer)} ids, the model embeds {vocab}; pass --tokenizer_name.")
    return model, tokenizer


def _tokenizer_source(args: argparse.Namespace) -> str:
    folder = Path(args.model_name_or_path)
    if folder.is_dir() and not any((folder / name).exists() for name in ("tokenizer.json", "tokenizer_config.json")):
        return str(SOTU_TOKENIZER_DIR)
    return args.model_name_or_path


# ------------------------------------------------------------------------------------------------------------ build
def build(args: argparse.Namespace, accelerator: Accelerator) -> dict[str, Any]:
    args.show_progress = accelerator.is_local_main_process
    model, tokenizer = load_model_and_tokenizer(args, accelerator.device)
    blocks = load_blocks(args, tokenizer, [args.split])
    if args.split not in blocks:
        raise ValueError(f"--split {args.split!r} is not a split of the data.")
    split_blocks, _ = blocks[args.split]
    dataloader = accelerator.prepare(sequential_block_loader(split_blocks, args.per_device_batch_size))
    started = time.perf_counter()
    datastore = build_datastore(
        model,
        dataloader,
        args.output_dir,
        tokenizer=tokenizer,
        key_point=args.key_point,
        module_path=args.module_path,
        key_dtype=getattr(torch, args.key_dtype),
        shard_size=args.shard_size,
        total=len(dataloader),
        show_progress=accelerator.is_local_main_process,
    )
    seconds = time.perf_counter() - started
    result = {
        "datastore": args.output_dir,
        "keys": datastore.size,
        "dim": datastore.dim,
        "build_seconds": seconds,
        "tokens_per_second": datastore.size / max(seconds, 1e-9),
        "indexes": {},
    }
    for index_type in args.index_types:
        params = {}
        if index_type.startswith("ivf"):
            params["nlist"] = max(1, min(args.nlist, datastore.size // 39))
        if index_type == "ivf_pq":
            params["pq_m"] = args.pq_m
            params["pq_bits"] = (
                8 if datastore.size >= 256 * 39 else max(1, int(math.log2(max(2, datastore.size // 39))))
            )
        started = time.perf_counter()
        datastore.build_index(index_type, args.distance, show_progress=accelerator.is_local_main_process, **params)
        result["indexes"][index_type] = {"seconds": time.perf_counter() - started, **params}
    logger.info(f"datastore: {json.dumps(result)}", main_process_only=True)
    sys.stdout.write(
        f"saved a datastore of {datastore.size} keys to {args.output_dir}; next: python recipes/knn_lm.py eval "
        f"--model_name_or_path {args.model_name_or_path} --datastore {args.output_dir} --output_dir OUTPUT\n"
    )
    return result


# ------------------------------------------------------------------------------------------------------------- eval
def score_grid(
    model, datastore: KNNDatastore, dataloader, args: argparse.Namespace, recompute: bool
) -> tuple[float, dict[tuple[int, float], float], int]:
    """Summed NLL of the base LM and of every (k, λ) over the scored tokens of the blocks ``dataloader`` reads
    (prepared: on the model's device), and the token count."""
    _, module = resolve_key_module(model, args.key_point, args.module_path)
    k_max = max(args.ks)
    base_total, count = 0.0, 0
    totals = {(k, lmbda): 0.0 for k in args.ks for lmbda in args.lmbdas}
    with torch.no_grad(), capture_module_inputs(module) as captured:
        for batch in tqdm(dataloader, desc="kNN-LM grid", disable=not args.show_progress):
            captured.clear()
            logits = model(input_ids=batch["input_ids"]).logits
            labels = batch["labels"]
            keep = labels != IGNORE_INDEX
            targets = labels[keep]  # (N,)
            lm = F.log_softmax(logits.float(), -1)[keep].gather(1, targets[:, None])[:, 0]  # (N,) log p_LM(target)
            queries = captured[-1].reshape(*labels.shape, -1)[keep]  # (N, D)
            scores, tokens = datastore.search(queries, k_max, args.distance, recompute)  # (N, K) sorted
            base_total -= lm.sum().item()
            count += targets.numel()
            for k in args.ks:
                knn = knn_target_log_probs(scores[:, :k], tokens[:, :k], targets, args.knn_temperature)  # (N,)
                for lmbda in args.lmbdas:
                    if lmbda == 0.0:
                        mixed = lm
                    elif lmbda == 1.0:
                        mixed = knn
                    else:
                        mixed = torch.logaddexp(lm + math.log1p(-lmbda), knn + math.log(lmbda))
                    totals[(k, lmbda)] -= mixed.sum().item()
    return base_total, totals, count


def metrics_of(nll: float, count: int, characters: int) -> dict[str, float]:
    return language_model_metrics(nll, count, characters)


def grid_table(results: dict[str, Any], ks: list[int], lmbdas: list[float]) -> str:
    """The evaluation as text: validation perplexity over λ (rows) × k (columns), the base LM's, and the best pair's
    on validation and test."""
    header = ["λ \\ k", *map(str, ks)]
    rows = [[f"{lmbda:g}", *(f"{results['grid'][f'k={k},lmbda={lmbda}']:.2f}" for k in ks)] for lmbda in lmbdas]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        f"kNN-LM validation perplexity ({results['validation_tokens']} tokens, {results['datastore_keys']} keys):"
    ]
    lines += [
        "  " + "  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)) for row in [header, *rows]
    ]
    best = results["best"]
    lines.append(
        f"base LM {results['validation_base']['perplexity']:.2f}; best k={best['k']}, λ={best['lmbda']:g}: "
        f"{results['validation_knn']['perplexity']:.2f}"
    )
    if "test_knn" in results:
        lines.append(
            f"test: base LM {results['test_base']['perplexity']:.2f}, kNN-LM {results['test_knn']['perplexity']:.2f}"
        )
    return "\n".join(lines)


def evaluate_grid(args: argparse.Namespace, accelerator: Accelerator) -> dict[str, Any]:
    model, tokenizer = load_model_and_tokenizer(args, accelerator.device)
    datastore = KNNDatastore.load(args.datastore, model=model, tokenizer=tokenizer, force=args.force)
    if args.index_type != "exact":
        search = {"nprobe": args.nprobe} if args.nprobe else {}
        datastore.load_index(args.index_type, **search)
    recompute = args.index_type not in ("exact", "flat") and not args.no_recompute_distances
    args.show_progress = accelerator.is_local_main_process
    blocks = load_blocks(args, tokenizer, ["validation", "test"])
    results: dict[str, Any] = {"datastore": args.datastore, "datastore_keys": datastore.size, "grid": {}}
    val_blocks, val_characters = blocks["validation"]
    started = time.perf_counter()
    val_loader = accelerator.prepare(sequential_block_loader(val_blocks, args.per_device_batch_size))
    base_nll, totals, count = score_grid(model, datastore, val_loader, args, recompute)
    results["validation_seconds"] = time.perf_counter() - started
    results["validation_tokens"] = count
    results["validation_base"] = metrics_of(base_nll, count, val_characters)
    for (k, lmbda), nll in totals.items():
        results["grid"][f"k={k},lmbda={lmbda}"] = metrics_of(nll, count, val_characters)["perplexity"]
    best_k, best_lmbda = min(totals, key=totals.get)
    results["best"] = {"k": best_k, "lmbda": best_lmbda}
    results["validation_knn"] = metrics_of(totals[(best_k, best_lmbda)], count, val_characters)
    grid_ks, grid_lmbdas = list(args.ks), list(args.lmbdas)
    if "test" in blocks:
        test_blocks, test_characters = blocks["test"]
        args.ks, args.lmbdas = [best_k], [best_lmbda]
        test_loader = accelerator.prepare(sequential_block_loader(test_blocks, args.per_device_batch_size))
        base_nll, totals, count = score_grid(model, datastore, test_loader, args, recompute)
        results["test_tokens"] = count
        results["test_base"] = metrics_of(base_nll, count, test_characters)
        results["test_knn"] = metrics_of(totals[(best_k, best_lmbda)], count, test_characters)
    if accelerator.is_main_process:
        sys.stdout.write(grid_table(results, grid_ks, grid_lmbdas) + "\n")

    if args.output_dir and accelerator.is_main_process:
        output_dir = Path(args.output_dir)
        knn_model = TffKNNLMForCausalLM.from_base(
            model.cpu(),
            k=best_k,
            lmbda=best_lmbda,
            knn_temperature=args.knn_temperature,
            distance=args.distance,
            index_type=args.index_type,
            recompute_distances=not args.no_recompute_distances,
            key_point=args.key_point,
            key_module_path=args.module_path,
            base_model_name_or_path=portable_reference(args.model_name_or_path),
        )
        # the datastore is copied into the folder (datastore/), which then loads from anywhere, copied or pushed
        knn_model.set_datastore(datastore, force=args.force)
        knn_model.save_pretrained(output_dir)
        save_tokenizer(tokenizer, output_dir)
        split = "test" if "test_knn" in results else "validation"
        run_info = {
            "recipe": "recipes/knn_lm.py",
            "task": "causal_lm",
            "tf_family_version": tf_family.__version__,
            "model_type": "tff_knn_lm",
            "base_model": portable_reference(args.model_name_or_path),
            "base_model_on_hub": hub_id_of(args.model_name_or_path) is not None,
            "datastore": {"folder": DATASTORE_FOLDER, "keys": datastore.size, "built_from": args.datastore},
            "dataset": {
                "name": args.train_file or args.dataset_name,
                "title": "State of the Union addresses"
                if args.dataset_name == "sotu" and not args.train_file
                else None,
                "eval_split": split,
                "on_hub": bool(args.dataset_name != "sotu" and not args.train_file),
                "description": f"The datastore ({datastore.size} keys, in `{DATASTORE_FOLDER}/`) was built by "
                f"`recipes/knn_lm.py build` from `{args.datastore}`.",
            },
            "hyperparameters": {"k": best_k, "lmbda": best_lmbda, "knn_temperature": args.knn_temperature},
            "metrics": {
                "perplexity": results[f"{split}_knn"]["perplexity"],
                "base_perplexity": results[f"{split}_base"]["perplexity"],
            },
            "knn_lm": {k: v for k, v in results.items() if k != "grid"},
            "grid": results["grid"],
        }
        run_info["dataset"] = {k: v for k, v in run_info["dataset"].items() if v is not None}
        publish_run(output_dir, run_info)
        atomic_write_text(output_dir / "knn_lm_results.json", json.dumps(results, indent=2) + "\n")
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    validate_args(args)
    accelerator = Accelerator(cpu=args.cpu)
    if accelerator.num_processes > 1:
        raise ValueError(
            f"recipes/knn_lm.py runs in one process (got {accelerator.num_processes}); launch it with "
            "`accelerate launch --num_processes 1` or plain `python`."
        )
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    datasets.utils.logging.set_verbosity_warning()
    transformers.utils.logging.set_verbosity_warning()
    torch.manual_seed(args.seed)
    result = build(args, accelerator) if args.command == "build" else evaluate_grid(args, accelerator)
    with ending_run(accelerator):  # as every recipe ends (one process here: no prepared model to let go of)
        pass
    return result


if __name__ == "__main__":
    raise SystemExit(run_main(main))
