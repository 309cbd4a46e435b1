"""kNN-LM on the bundled State of the Union corpus: perplexity with and without kNN, datastore build throughput,
and search latency per token of the exact PyTorch store and of each faiss index.

1. **Model**: a small GPT-2 (transformers' own class, defaults: 4 layers, width 128, 4 heads, 128 positions, the
   bundled 8k BPE tokenizer) trained from scratch by `recipes/causal_lm.py` on the corpus's train split (addresses
   1790-1994) for ``--train-steps`` steps of 16 blocks of 128 tokens. The trained folder is cached in
   ``bench/data/`` keyed by the settings (``--retrain`` trains again).
2. **Datastore** (`tf_family.retrieval.build_datastore`): keys at the input of the LM head, float16, over the last
   ``--datastore-tokens`` tokens of the train split (its latest addresses, the nearest in time to validation /
   test); build throughput in tokens per second (one timed run, after a warm-up on a few blocks).
3. **Perplexity**: the first ``--eval-tokens`` scored tokens of validation (1995-2009) pick λ and k from a grid
   (exact search, one search at the largest k; `recipes/knn_lm.py score_grid`); the first ``--eval-tokens`` of
   test (2010 on) are scored by the base LM and by the kNN-LM with the chosen λ, k, with the exact store and with
   each faiss index (approximate ones rescored with exact distances from the stored keys, as in the paper).
4. **Search latency**: a batch of ``--latency-queries`` test queries, k = the chosen k, median of >= 3 timed runs,
   per query (= per token), plus recall@k of each faiss index against the exact search, and build (train + add)
   time of each index.

Run: ``.venv/bin/python bench/bench_knn_lm.py`` (about 15 minutes on 2 shared cores, most of it training; the trained
model is reused after), or ``--quick`` for a smoke run of about a minute.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import shutil
import time
from pathlib import Path

from common import DATA_DIR, format_seconds, markdown_table, setup_threads, time_callable, write_results

setup_threads(2)

import torch  # noqa: E402  (after setup_threads: OpenMP reads OMP_WAIT_POLICY when torch loads)
from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel  # noqa: E402
from transformers.utils import logging as transformers_logging  # noqa: E402

from tf_family.data import SOTU_TOKENIZER_DIR, load_sotu, pack_into_blocks  # noqa: E402
from tf_family.data.packing import LMBlocks  # noqa: E402
from tf_family.retrieval.datastore import build_datastore, capture_module_inputs, resolve_key_module  # noqa: E402

transformers_logging.disable_progress_bar()
REPO = Path(__file__).resolve().parents[1]


def load_recipe(name: str):
    """A recipe from this checkout's ``recipes/`` (what ``tf_family.recipes`` installs)."""
    spec = importlib.util.spec_from_file_location(f"recipe_{name}", REPO / "recipes" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke setting (about a minute)")
    parser.add_argument("--retrain", action="store_true")
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--block-size", type=int, default=128)
    parser.add_argument("--train-steps", type=int, default=500)
    parser.add_argument("--datastore-tokens", type=int, default=1_000_000)
    parser.add_argument("--eval-tokens", type=int, default=8192)
    parser.add_argument("--lmbdas", type=float, nargs="+", default=[0.05, 0.1, 0.2, 0.3, 0.4, 0.5])
    parser.add_argument("--ks", type=int, nargs="+", default=[8, 32, 128, 512])
    parser.add_argument("--latency-queries", type=int, default=512)
    parser.add_argument("--nlist", type=int, default=1024)
    parser.add_argument("--nprobe", type=int, default=32)
    parser.add_argument("--pq-m", type=int, default=32)
    args = parser.parse_args()
    if args.quick:
        args.width, args.layers, args.train_steps = 64, 2, 40
        args.datastore_tokens, args.eval_tokens, args.latency_queries = 40_000, 1024, 128
        args.nlist, args.nprobe, args.pq_m, args.ks = 64, 8, 16, [8, 32]
    return args


# ----------------------------------------------------------------------------------------------------------- model
def train_model(args: argparse.Namespace) -> tuple[Path, dict]:
    settings = {k: getattr(args, k) for k in ("width", "layers", "block_size", "train_steps")}
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    folder = DATA_DIR / f"knn_lm_gpt2_{key}"
    record_path = folder / "bench_training.json"
    if record_path.is_file() and not args.retrain:
        return folder / "model", json.loads(record_path.read_text())
    shutil.rmtree(folder, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(SOTU_TOKENIZER_DIR)
    separator = tokenizer.eos_token_id
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_embd=args.width,
        n_layer=args.layers,
        n_head=max(1, args.width // 32),
        n_positions=args.block_size,
        bos_token_id=separator,
        eos_token_id=separator,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    torch.manual_seed(0)
    GPT2LMHeadModel(config).save_pretrained(folder / "init")
    tokenizer.save_pretrained(folder / "init")
    causal_lm = load_recipe("causal_lm")
    started = time.perf_counter()
    metrics = causal_lm.main(
        [
            "--model_name_or_path", str(folder / "init"),
            "--block_size", str(args.block_size),
            "--per_device_train_batch_size", "16",
            "--max_train_steps", str(args.train_steps),
            "--learning_rate", "2e-3",
            "--num_warmup_steps", str(max(1, args.train_steps // 20)),
            "--output_dir", str(folder / "model"),
            "--overwrite_output_dir",
            "--cpu",
            "--seed", "0",
        ]
    )  # fmt: skip
    record = {
        "settings": settings,
        "train_seconds": time.perf_counter() - started,
        "validation_perplexity": metrics.get("perplexity"),
        "train_steps": metrics.get("train_steps"),
        "parameters": sum(p.numel() for p in GPT2LMHeadModel(config).parameters()),
    }
    record_path.write_text(json.dumps(record, indent=2))
    return folder / "model", record


# ------------------------------------------------------------------------------------------------------------ data
def split_blocks(tokenizer, split: str, block_size: int) -> LMBlocks:
    texts = list(load_sotu()[split]["text"])
    documents = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return pack_into_blocks(documents, block_size, tokenizer.eos_token_id)


def first_blocks(blocks: LMBlocks, tokens: int, from_end: bool = False) -> LMBlocks:
    """The first (or last) blocks holding about ``tokens`` scored tokens."""
    count = max(1, min(len(blocks), math.ceil(tokens / blocks.block_size)))
    rows = slice(len(blocks) - count, len(blocks)) if from_end else slice(0, count)
    return LMBlocks(blocks.input_ids[rows], blocks.labels[rows], blocks.starts_document[rows], blocks.pad_token_id)


def batches(blocks: LMBlocks, size: int = 16):
    return [blocks.batch(range(i, min(i + size, len(blocks)))) for i in range(0, len(blocks), size)]


# ------------------------------------------------------------------------------------------------------------- main
def main() -> None:
    args = parse_args()
    knn_lm = load_recipe("knn_lm")
    model_dir, training = train_model(args)
    print(f"model: {model_dir} ({training})", flush=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    train = split_blocks(tokenizer, "train", args.block_size)
    store_blocks = first_blocks(train, args.datastore_tokens, from_end=True)

    # ---- datastore build throughput
    folder = DATA_DIR / f"knn_lm_datastore_{model_dir.parent.name}_{args.datastore_tokens}"
    shutil.rmtree(folder, ignore_errors=True)
    build_datastore(model, batches(first_blocks(store_blocks, 4 * args.block_size)), None, show_progress=False)
    started = time.perf_counter()
    datastore = build_datastore(model, batches(store_blocks), folder, tokenizer=tokenizer, show_progress=False)
    build_seconds = time.perf_counter() - started
    print(f"datastore: {datastore.size} keys in {build_seconds:.1f} s", flush=True)

    # ---- λ, k on validation (exact search)
    grid_args = argparse.Namespace(
        key_point="lm_head_input", module_path=None, ks=args.ks, lmbdas=args.lmbdas, knn_temperature=1.0,
        distance="l2", per_device_batch_size=16, show_progress=False,
    )  # fmt: skip
    validation = first_blocks(split_blocks(tokenizer, "validation", args.block_size), args.eval_tokens)
    started = time.perf_counter()
    base_nll, totals, count = knn_lm.score_grid(model, datastore, validation, grid_args, torch.device("cpu"), False)
    grid_seconds = time.perf_counter() - started
    best_k, best_lmbda = min(totals, key=totals.get)
    grid = {f"k={k},lmbda={x}": math.exp(nll / count) for (k, x), nll in totals.items()}
    validation_result = {
        "tokens": count,
        "base_perplexity": math.exp(base_nll / count),
        "knn_perplexity": math.exp(totals[(best_k, best_lmbda)] / count),
        "grid": grid,
        "seconds": grid_seconds,
    }
    print(f"validation: {validation_result['base_perplexity']:.2f} -> {validation_result['knn_perplexity']:.2f} "
          f"(k={best_k}, lambda={best_lmbda})", flush=True)  # fmt: skip

    # ---- test perplexity and search latency per backend
    test = first_blocks(split_blocks(tokenizer, "test", args.block_size), args.eval_tokens)
    best_args = argparse.Namespace(**{**vars(grid_args), "ks": [best_k], "lmbdas": [best_lmbda]})
    queries = []
    with torch.no_grad(), capture_module_inputs(resolve_key_module(model)[1]) as captured:
        for batch in batches(test):
            model(input_ids=batch["input_ids"])
            queries.append(captured[-1][batch["labels"] != -100])
    queries = torch.cat(queries)[: args.latency_queries].float()
    exact_scores, exact_ids = datastore.exact_store().search(queries, best_k)

    backends = {"exact": {}}
    faiss_available = importlib.util.find_spec("faiss") is not None
    if faiss_available:
        nlist = max(1, min(args.nlist, datastore.size // 39))
        backends.update(
            {
                "flat": {},
                "ivf_flat": {"nlist": nlist, "nprobe": args.nprobe},
                "ivf_pq": {"nlist": nlist, "nprobe": args.nprobe, "pq_m": args.pq_m, "pq_bits": 8},
                "hnsw": {"hnsw_m": 32, "ef_search": 128, "ef_construction": 64},
            }
        )
    rows, records = [], {}
    for name, params in backends.items():
        record = {"params": params}
        if name == "exact":
            datastore.index = None
            store = datastore.exact_store()
            record["build_seconds"] = 0.0
        else:
            started = time.perf_counter()
            store = datastore.build_index(name, "l2", max_training_keys=200_000, save=False, show_progress=False,
                                          **params)  # fmt: skip
            record["build_seconds"] = time.perf_counter() - started
        timing = time_callable(lambda store=store: store.search(queries, best_k), cap_s=60.0)
        record["search"] = timing.to_dict()
        record["ms_per_token"] = 1000 * timing.median_s / queries.shape[0]
        _, ids = store.search(queries, best_k)
        hits = sum(len(set(a.tolist()) & set(b.tolist())) for a, b in zip(ids, exact_ids, strict=True))
        record["recall_at_k"] = hits / exact_ids.numel()
        recompute = name not in ("exact", "flat")
        started = time.perf_counter()
        base_nll, totals, count = knn_lm.score_grid(model, datastore, test, best_args, torch.device("cpu"), recompute)
        record["test_eval_seconds"] = time.perf_counter() - started
        record["test_tokens"] = count
        record["test_base_perplexity"] = math.exp(base_nll / count)
        record["test_knn_perplexity"] = math.exp(totals[(best_k, best_lmbda)] / count)
        records[name] = record
        print(f"{name}: {record['ms_per_token']:.3f} ms/token, recall {record['recall_at_k']:.3f}, test ppl "
              f"{record['test_base_perplexity']:.2f} -> {record['test_knn_perplexity']:.2f}", flush=True)  # fmt: skip
        rows.append(
            [
                name,
                f"{record['build_seconds']:.1f} s",
                f"{record['ms_per_token']:.3f} ({1000 * timing.min_s / queries.shape[0]:.3f})"
                + (f" {timing.flag}" if timing.flag else ""),
                f"{record['recall_at_k']:.3f}",
                f"{record['test_knn_perplexity']:.2f}",
            ]
        )
    base_test = records["exact"]["test_base_perplexity"]
    knn_test = records["exact"]["test_knn_perplexity"]
    payload = {
        "args": vars(args),
        "training": training,
        "datastore": {
            "keys": datastore.size,
            "dim": datastore.dim,
            "key_dtype": datastore.description["key_dtype"],
            "build_seconds": build_seconds,
            "tokens_per_second": datastore.size / build_seconds,
        },
        "best": {"k": best_k, "lmbda": best_lmbda},
        "validation": validation_result,
        "test": {"base_perplexity": base_test, "knn_perplexity": knn_test, "change": knn_test / base_test - 1},
        "backends": records,
        "faiss": faiss_available,
    }
    summary = markdown_table(
        ["", "value"],
        [
            ["model", f"GPT-2, {args.layers} layers, width {args.width}, {training['parameters']:,} parameters, "
                      f"{training['train_steps']} steps ({format_seconds(training['train_seconds'])})"],
            ["datastore", f"{datastore.size:,} keys x {datastore.dim} (float16), train split's last addresses"],
            ["build throughput", f"{datastore.size / build_seconds:,.0f} tokens/s"],
            ["chosen on validation", f"k={best_k}, lambda={best_lmbda} ({validation_result['base_perplexity']:.2f} -> "
                                     f"{validation_result['knn_perplexity']:.2f})"],
            ["test perplexity", f"{base_test:.2f} -> {knn_test:.2f} ({100 * (knn_test / base_test - 1):+.1f}%), "
                                f"{records['exact']['test_tokens']} tokens"],
        ],
    )  # fmt: skip
    backends_table = markdown_table(
        ["search", "index build", "ms / token, median (min)", f"recall@{best_k} vs exact", "test ppl (kNN-LM)"], rows
    )
    name = "knn_lm_quick" if args.quick else "knn_lm"
    markdown = f"# kNN-LM on the State of the Union corpus\n\n{summary}\n\n{backends_table}\n"
    json_path, md_path = write_results(name, payload, markdown)
    print(md_path.read_text())
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
