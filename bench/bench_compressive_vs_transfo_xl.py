"""Compressive Transformer against Transformer-XL at equal attention cost, trained by the causal-LM recipe.

Both models are trained from scratch by ``recipes/causal_lm.py`` (called in-process, ``causal_lm.main([...])``) on the
bundled State of the Union corpus (train: the addresses 1790-1994, validation: 1995-2009; long documents, about
7,500 BPE tokens each), reading ordered document streams with the memory carried from step to step and reset where
a document starts, with the same budget: same variant and layer sizes, steps, batch, segment length, learning rate
and schedule, seed and data order. The only differences are the memory settings, given as ``--config_overrides``:

* **Transformer-XL** (Dai et al. 2019): ``mem_len = m``.
* **Compressive Transformer** (Rae et al. 2019): ``mem_len = n_m`` and ``cmem_len = n_cm`` with ``n_m + n_cm = m``
  and compression rate ``c``, for each compression function asked for (``--compressions``, default ``conv`` and
  ``mean_pool``). It adds the attention-reconstruction loss (``outputs.aux_loss``, which trains only the
  compression network) to the language-model loss, as the recipe does for every model that returns one.

Equal attention cost: every query attends to the same number of slots, ``m`` memory slots (plus the segment), so the
attention and the memory footprint are the same; the compressive model pays extra for compressing the states that
leave its memory (every segment) and, in training only, for its auxiliary loss. What differs is the temporal range,
the distance back that the top layer can reach: ``L * m`` tokens for Transformer-XL, ``L * (n_m + c * n_cm)`` for
the Compressive Transformer (the paper's definition, ``L`` layers).

Reported:

* per model, validation perplexity (per BPE token), bits per token and bits per character (the recipe's
  `evaluate`, over every token of the validation documents, memory carried), the temporal range, and the recipe's
  own training tokens/s (median over its logging windows, the first, which holds the warm-up, left out) and
  evaluation tokens/s (its final evaluation, timed by wrapping `evaluate`). The models train one after the other,
  so these move with the machine's load;
* throughput under the same conditions: the trained models take turns, a few training steps (the recipe's step:
  memory, loss plus ``aux_loss``, clipping, AdamW) and evaluation steps each per round;
* a memory ablation: the validation pass again with part of the memory taken away (Transformer-XL with ``m / 2``,
  the Compressive models without their compressed memory), which shows how much of its range a model uses. The
  full Transformer-XL is re-evaluated first through the same code and must reproduce the recipe's loss.

One seed: a perplexity difference of about a percent may be within what another seed gives (not measured here).

Trained models and their records are kept in ``bench/data/<name>/`` and reused when the recipe arguments are the
same (``--retrain`` trains again); the tables then say so.

Run: ``python bench/bench_compressive_vs_transfo_xl.py`` (about 22 minutes of training and evaluation plus 3-5 for
the throughput rounds and the ablation on 2 shared cores), ``--quick`` for a smoke run under a minute.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

# the recipe's progress bar: a line every 20 s, not every step (tqdm reads this when it is first imported)
os.environ.setdefault("TQDM_MININTERVAL", "20")

from common import DATA_DIR, format_seconds, loadavg, markdown_table, setup_threads, write_results  # noqa: E402

setup_threads(2)

import datasets  # noqa: E402  (after setup_threads: OpenMP reads OMP_WAIT_POLICY when torch loads)
import transformers  # noqa: E402

from tf_family.shipping.cards import RUN_INFO_FILE  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
BENCH_RECORD = "bench_record.json"


def load_recipe():
    """The recipe of this checkout (``recipes/causal_lm.py``), else the installed ``tf_family.recipes.causal_lm``."""
    if (REPO_ROOT / "recipes" / "causal_lm.py").is_file():
        sys.path.insert(0, str(REPO_ROOT))
        try:
            return importlib.import_module("recipes.causal_lm")
        finally:
            sys.path.remove(str(REPO_ROOT))
    return importlib.import_module("tf_family.recipes.causal_lm")


causal_lm = load_recipe()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--dataset_name", default="sotu", help="the recipe's --dataset_name (default: sotu)")
    parser.add_argument("--variant", default="small", help="registry variant of both models (default small)")
    parser.add_argument("--n-layer", type=int, default=4, help="layers L (default 4)")
    parser.add_argument("--d-model", type=int, default=None, help="width (default: the variant's)")
    parser.add_argument(
        "--model-overrides",
        nargs="*",
        default=["pre_lnorm=true", "dropout=0.0"],
        help="further config overrides for both models (default: pre_lnorm=true dropout=0.0)",
    )
    parser.add_argument("--attended", type=int, default=128, help="attended memory slots m (default 128)")
    parser.add_argument("--cmem-len", type=int, default=64, help="compressed slots n_cm; n_m = m - n_cm (default 64)")
    parser.add_argument("--rate", type=int, default=4, help="compression rate c (default 4)")
    parser.add_argument(
        "--compressions",
        nargs="+",
        default=["conv", "mean_pool"],
        help="compression functions, one Compressive model each (default: conv mean_pool)",
    )
    parser.add_argument("--segment", type=int, default=64, help="segment (block) length T (default 64)")
    parser.add_argument("--batch", type=int, default=8, help="training streams per batch (default 8)")
    parser.add_argument(
        "--eval-batch",
        type=int,
        default=4,
        help="validation streams (default 4: the 15 validation documents fill 4 rows evenly; a row with no "
        "document left still runs, so wide batches waste work)",
    )
    parser.add_argument("--steps", type=int, default=560, help="optimizer steps per model (default 560)")
    parser.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default 1e-3, cosine)")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up steps (default: 10 %% of --steps)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--logging-steps", type=int, default=None, help="recipe logging window (default steps/14)")
    parser.add_argument("--max-train-samples", type=int, default=None, help="first N training documents only")
    parser.add_argument("--max-eval-samples", type=int, default=None, help="first N validation documents only")
    parser.add_argument("--retrain", action="store_true", help="train again even if a run with these settings exists")
    parser.add_argument(
        "--rounds", type=int, default=5, help="interleaved throughput rounds after a warm-up round (default 5)"
    )
    parser.add_argument("--round-steps", type=int, default=4, help="training / evaluation steps per round (default 4)")
    parser.add_argument("--quick", action="store_true", help="smoke setting: tiny model, a few steps, < 1 minute")
    parser.add_argument("--name", default=None, help="results name (default compressive_vs_transfo_xl[_quick])")
    args = parser.parse_args()
    if args.quick:
        args.model_overrides = [*args.model_overrides, "d_model=64", "n_head=2", "d_head=32", "d_inner=128"]
        args.n_layer, args.attended, args.cmem_len, args.rate, args.segment, args.batch = 2, 16, 8, 2, 16, 4
        args.eval_batch, args.rounds, args.round_steps = 2, 2, 2
        args.steps, args.max_train_samples, args.max_eval_samples = 12, 8, 2
    if args.d_model is not None:
        args.model_overrides = [*args.model_overrides, f"d_model={args.d_model}"]
    args.warmup = args.warmup if args.warmup is not None else max(1, args.steps // 10)
    args.logging_steps = args.logging_steps or max(1, args.steps // 14)
    if not 0 < args.cmem_len < args.attended:
        raise SystemExit(f"--cmem-len {args.cmem_len} must be in (0, --attended {args.attended}).")
    if args.segment % args.rate:
        raise SystemExit(
            f"--segment {args.segment} must be a multiple of --rate {args.rate}, so that the memory evicts whole "
            "groups and holds exactly n_m states between segments."
        )
    args.name = args.name or ("compressive_vs_transfo_xl_quick" if args.quick else "compressive_vs_transfo_xl")
    return args


def model_runs(args: argparse.Namespace) -> list[dict]:
    """One entry per model: its label, architecture, memory overrides and temporal range."""
    mem_len = args.attended - args.cmem_len
    runs = [
        {
            "label": "Transformer-XL",
            "arch": "transfo_xl",
            "overrides": [f"mem_len={args.attended}"],
            "mem_len": args.attended,
            "cmem_len": 0,
            "rate": None,
            "compression": None,
            "temporal_range": args.n_layer * args.attended,
        }
    ]
    for compression in args.compressions:
        runs.append(
            {
                "label": f"Compressive ({compression})",
                "arch": "compressive",
                "overrides": [
                    f"mem_len={mem_len}",
                    f"cmem_len={args.cmem_len}",
                    f"compression_rate={args.rate}",
                    f"compression={compression}",
                ],
                "mem_len": mem_len,
                "cmem_len": args.cmem_len,
                "rate": args.rate,
                "compression": compression,
                "temporal_range": args.n_layer * (mem_len + args.rate * args.cmem_len),
            }
        )
    return runs


def recipe_argv(args: argparse.Namespace, run: dict, output_dir: Path) -> list[str]:
    argv = [
        "--arch", run["arch"], "--variant", args.variant,
        "--config_overrides", f"n_layer={args.n_layer}", *args.model_overrides, *run["overrides"],
        "--dataset_name", args.dataset_name,
        "--block_size", str(args.segment),
        "--per_device_train_batch_size", str(args.batch), "--per_device_eval_batch_size", str(args.eval_batch),
        "--max_train_steps", str(args.steps),
        "--learning_rate", str(args.lr), "--lr_scheduler_type", "cosine", "--num_warmup_steps", str(args.warmup),
        "--seed", str(args.seed),
        "--logging_steps", str(args.logging_steps),
        "--output_dir", str(output_dir), "--overwrite_output_dir",
        "--cpu",
    ]  # fmt: skip
    if args.max_train_samples:
        argv += ["--max_train_samples", str(args.max_train_samples)]
    if args.max_eval_samples:
        argv += ["--max_eval_samples", str(args.max_eval_samples)]
    return argv


def train_and_evaluate(args: argparse.Namespace, run: dict) -> dict:
    """Run the recipe for one model; time its final evaluation by wrapping the recipe's `evaluate`."""
    output_dir = DATA_DIR / args.name / run["label"].lower().replace(" ", "_").replace("(", "").replace(")", "")
    argv = recipe_argv(args, run, output_dir)
    evaluations: list[dict] = []
    evaluate = causal_lm.evaluate

    def timed_evaluate(*positional, **keywords):
        start = time.perf_counter()
        metrics = evaluate(*positional, **keywords)
        evaluations.append({"seconds": time.perf_counter() - start, "tokens": metrics["scored_tokens"]})
        return metrics

    cache = output_dir / BENCH_RECORD
    if cache.is_file() and not args.retrain:
        result = json.loads(cache.read_text())
        if result.get("recipe_argv") == argv:
            print(
                f"\n== {run['label']}: trained on {result['trained_at']}, reusing {cache} (--retrain to train again)"
            )
            return {**result, "reused": True}

    print(f"\n== {run['label']}: causal_lm.main({' '.join(argv)})", flush=True)
    causal_lm.evaluate = timed_evaluate
    start = time.perf_counter()
    try:
        metrics = causal_lm.main(argv)
    finally:
        causal_lm.evaluate = evaluate
    wall = time.perf_counter() - start
    record = json.loads((output_dir / RUN_INFO_FILE).read_text())
    windows = [w["tokens_per_second"] for w in record["train_history"]]
    steady = windows[1:] or windows  # the first window holds the warm-up (first calls, allocator)
    final_eval = evaluations[-1]
    result = {
        **run,
        "recipe_argv": argv,
        "num_parameters": record["num_parameters"],
        "train_steps": record["train_steps"],
        "effective_batch_tokens": record["hyperparameters"]["effective_batch_tokens"],
        "eval_loss": metrics["eval_loss"],
        "perplexity": metrics["perplexity"],
        "bits_per_token": metrics["bits_per_token"],
        "bits_per_character": metrics["bits_per_character"],
        "eval_tokens": metrics["scored_tokens"],
        "unigram_perplexity": metrics["unigram_perplexity"],
        "final_train_loss": record["train_history"][-1]["train_loss"],
        "train_tokens_per_s_median": statistics.median(steady),
        "train_tokens_per_s_min": min(steady),
        "train_tokens_per_s_windows": [round(w, 1) for w in windows],
        "train_history": record["train_history"],
        "eval_seconds": final_eval["seconds"],
        "eval_tokens_per_s": final_eval["tokens"] / final_eval["seconds"],
        "recipe_wall_seconds": wall,
        "dataset": record["dataset"],
        "output_dir": str(output_dir),
        "trained_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "loadavg_after": loadavg(),
    }
    cache.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"   {run['label']}: ppl {result['perplexity']:.2f}, {result['bits_per_character']:.4f} bpc, train "
        f"{result['train_tokens_per_s_median']:.0f} tok/s, eval {result['eval_tokens_per_s']:.0f} tok/s, "
        f"{wall:.0f} s",
        flush=True,
    )
    return result


def interleaved_throughput(args: argparse.Namespace, results: list[dict]) -> list[dict]:
    """Training and evaluation tokens/s of the trained models under the same conditions: rounds of
    ``round_steps`` steps per model, the models taking turns (a warm-up round first), so that a change in the
    machine's load reaches every model alike. A training step is the recipe's (memory carried, next-token loss plus
    ``aux_loss``, clipping, AdamW); an evaluation step is a no-grad forward with memory. Token ids are random (the
    cost does not depend on them)."""
    import torch
    from transformers import AutoModelForCausalLM

    generator = torch.Generator().manual_seed(args.seed)
    train_ids = torch.randint(0, 8192, (args.round_steps, args.batch, args.segment + 1), generator=generator)
    eval_ids = torch.randint(0, 8192, (args.round_steps, args.eval_batch, args.segment), generator=generator)
    states = []
    for result in results:
        model = AutoModelForCausalLM.from_pretrained(result["output_dir"])
        vocab = model.config.vocab_size
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
        states.append({"model": model, "optimizer": optimizer, "train_mems": None, "eval_mems": None})
    train_ids, eval_ids = train_ids % vocab, eval_ids % vocab

    def train_round(state: dict) -> None:
        model, optimizer = state["model"], state["optimizer"]
        model.train()
        for step in range(args.round_steps):
            outputs = model(input_ids=train_ids[step, :, :-1], mems=state["train_mems"])
            nll, count = causal_lm.next_token_loss(outputs.logits, train_ids[step, :, 1:])
            loss = nll / count
            if getattr(outputs, "aux_loss", None) is not None:
                loss = loss + outputs.aux_loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
            state["train_mems"] = outputs.mems

    def eval_round(state: dict) -> None:
        model = state["model"]
        model.eval()
        with torch.no_grad():
            for step in range(args.round_steps):
                state["eval_mems"] = model(input_ids=eval_ids[step], mems=state["eval_mems"]).mems

    times = [{"train": [], "eval": []} for _ in states]
    for round_index in range(args.rounds + 1):  # round 0 is the warm-up
        for state, timing in zip(states, times, strict=True):
            for mode, fn in (("train", train_round), ("eval", eval_round)):
                start = time.perf_counter()
                fn(state)
                if round_index > 0:
                    timing[mode].append(time.perf_counter() - start)
    train_tokens = args.round_steps * args.batch * args.segment
    eval_tokens = args.round_steps * args.eval_batch * args.segment
    measured = []
    for result, timing in zip(results, times, strict=True):
        entry = {"label": result["label"], "train_times_s": timing["train"], "eval_times_s": timing["eval"]}
        for mode, tokens in (("train", train_tokens), ("eval", eval_tokens)):
            entry[f"{mode}_tokens_per_call"] = tokens
            entry[f"{mode}_median_s"] = statistics.median(timing[mode])
            entry[f"{mode}_min_s"] = min(timing[mode])
            entry[f"{mode}_tokens_per_s"] = tokens / entry[f"{mode}_median_s"]
        measured.append(entry)
        print(
            f"   {result['label']}: train {entry['train_tokens_per_s']:.0f} tok/s, eval "
            f"{entry['eval_tokens_per_s']:.0f} tok/s (interleaved)",
            flush=True,
        )
    for entry in measured:
        for mode in ("train", "eval"):
            entry[f"{mode}_relative_to_first"] = measured[0][f"{mode}_median_s"] / entry[f"{mode}_median_s"]
    return measured


def memory_ablation(args: argparse.Namespace, results: list[dict]) -> list[dict]:
    """How much of its memory each trained model uses: the validation metrics again with part of the memory taken
    away at evaluation (Transformer-XL with ``mem_len = m / 2``; the Compressive models without their compressed
    memory, ``cmem_len = 0``, keeping ``mem_len = n_m``). The full Transformer-XL is evaluated again too, through
    the same code, and must reproduce the recipe's figures: that checks this evaluation is the recipe's."""
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tf_family.data import build_document_streams, load_text_datasets
    from tf_family.data.sampling import DocumentStreamSampler, block_loader

    raw, column = load_text_datasets(args.dataset_name)
    texts = list(raw["validation"][column])[: args.max_eval_samples or None]
    tokenizer = AutoTokenizer.from_pretrained(results[0]["output_dir"])
    documents = tokenizer(texts, add_special_tokens=False)["input_ids"]
    blocks, document_blocks = build_document_streams(documents, args.segment, tokenizer.eos_token_id)
    accelerator = Accelerator(cpu=True)
    loader = accelerator.prepare(
        block_loader(blocks, DocumentStreamSampler(document_blocks, args.eval_batch, shuffle=False))
    )
    characters = sum(map(len, texts))

    def evaluate(folder: str, **overrides) -> dict:
        verbosity = transformers.logging.get_verbosity()
        transformers.logging.set_verbosity_error()  # cmem_len=0 leaves the compression weights unused: expected
        try:
            model = AutoModelForCausalLM.from_pretrained(folder, **overrides)
        finally:
            transformers.logging.set_verbosity(verbosity)
        return causal_lm.evaluate(model, loader, accelerator, args.eval_batch, True, characters)

    baseline = results[0]
    check = evaluate(baseline["output_dir"])
    difference = abs(check["eval_loss"] - baseline["eval_loss"])
    if difference > 1e-6:
        raise SystemExit(
            f"re-evaluating {baseline['label']} gives a loss {check['eval_loss']} != the recipe's "
            f"{baseline['eval_loss']}: this evaluation is not the recipe's."
        )
    ablations = []
    for result in results:
        if result["cmem_len"]:
            overrides, memory = {"cmem_len": 0}, f"mem_len {result['mem_len']}, no compressed memory"
            attended = result["mem_len"]
        else:
            overrides, memory = {"mem_len": result["mem_len"] // 2}, f"mem_len {result['mem_len'] // 2}"
            attended = result["mem_len"] // 2
        metrics = evaluate(result["output_dir"], **overrides)
        ablations.append(
            {
                "label": result["label"],
                "evaluated_with": memory,
                "overrides": overrides,
                "attended": attended,
                "temporal_range": args.n_layer * attended,
                "perplexity": metrics["perplexity"],
                "bits_per_character": metrics["bits_per_character"],
                "full_memory_perplexity": result["perplexity"],
                "perplexity_increase_pct": 100 * (metrics["perplexity"] / result["perplexity"] - 1),
            }
        )
        print(f"   {result['label']} evaluated with {memory}: ppl {metrics['perplexity']:.2f}", flush=True)
    return ablations


def verdict(results: list[dict], throughput: list[dict], ablations: list[dict]) -> str:
    """One sentence per compressive model, from the numbers: lower or not lower perplexity than Transformer-XL."""
    baseline = results[0]
    sentences = []
    for result, speed in zip(results[1:], throughput[1:], strict=True):
        change = 100 * (result["perplexity"] / baseline["perplexity"] - 1)
        better = result["perplexity"] < baseline["perplexity"]
        sentences.append(
            f"{result['label']} {'reaches a lower' if better else 'does not reach a lower'} validation perplexity "
            f"than Transformer-XL at equal attention cost: {result['perplexity']:.2f} against "
            f"{baseline['perplexity']:.2f} ({change:+.2f} %), {result['bits_per_character']:.4f} against "
            f"{baseline['bits_per_character']:.4f} bits per character, with a temporal range of "
            f"{result['temporal_range']} tokens against {baseline['temporal_range']}, and "
            f"{speed['train_relative_to_first']:.2f}x Transformer-XL's training tokens/s"
            + (" (a difference under 1 %, not conclusive from one seed)." if abs(change) < 1 else ".")
        )
    sentences.append(
        "With part of the memory taken away at evaluation, the perplexities change by "
        + ", ".join(f"{a['perplexity_increase_pct']:+.2f} % ({a['label']}, {a['evaluated_with']})" for a in ablations)
        + "."
    )
    return " ".join(sentences)


def main() -> None:
    args = parse_args()
    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    started = time.perf_counter()
    results = [train_and_evaluate(args, run) for run in model_runs(args)]
    print("\n== Throughput, the models taking turns", flush=True)
    throughput = interleaved_throughput(args, results)
    print("\n== Memory ablation: evaluating with part of the memory taken away", flush=True)
    ablations = memory_ablation(args, results)
    total = time.perf_counter() - started

    headers = [
        "model", "memory (attended slots)", "temporal range", "parameters", "val ppl", "bits/token", "bpc",
        "last train loss", "recipe train tok/s median (min)", "recipe eval tok/s",
    ]  # fmt: skip
    rows = []
    for r in results:
        memory = (
            f"mem_len {r['mem_len']}"
            if r["cmem_len"] == 0
            else f"mem_len {r['mem_len']} + cmem_len {r['cmem_len']} (c = {r['rate']})"
        )
        rows.append(
            [
                r["label"], f"{memory} = {r['mem_len'] + r['cmem_len']}", f"{r['temporal_range']:,}",
                f"{r['num_parameters']:,}", f"{r['perplexity']:.2f}", f"{r['bits_per_token']:.4f}",
                f"{r['bits_per_character']:.4f}", f"{r['final_train_loss']:.3f}",
                f"{r['train_tokens_per_s_median']:,.0f} ({r['train_tokens_per_s_min']:,.0f})",
                f"{r['eval_tokens_per_s']:,.0f}",
            ]
        )  # fmt: skip
    speed_headers = [
        "model", "train: time median (min)", "train tok/s", "vs Transformer-XL", "eval: time median (min)",
        "eval tok/s", "vs Transformer-XL",
    ]  # fmt: skip
    speed_rows = [
        [
            t["label"],
            f"{format_seconds(t['train_median_s'])} ({format_seconds(t['train_min_s'])})",
            f"{t['train_tokens_per_s']:,.0f}", f"{t['train_relative_to_first']:.2f}x",
            f"{format_seconds(t['eval_median_s'])} ({format_seconds(t['eval_min_s'])})",
            f"{t['eval_tokens_per_s']:,.0f}", f"{t['eval_relative_to_first']:.2f}x",
        ]
        for t in throughput
    ]  # fmt: skip
    first = results[0]
    data = first["dataset"]
    intro = (
        f"Trained by `recipes/causal_lm.py` on {data.get('title', args.dataset_name)}: {data['train_documents']} "
        f"training documents ({data['train_tokens']:,} tokens), {data['eval_documents']} validation documents "
        f"({first['eval_tokens']:,} scored tokens; the add-one unigram perplexity is "
        f"{first['unigram_perplexity']:.0f}). Every model: variant `{args.variant}`, {args.n_layer} layers, "
        f"overrides `{' '.join(args.model_overrides)}`; {first['train_steps']} steps of {args.batch} streams x "
        f"{args.segment} tokens ({first['effective_batch_tokens']:,} tokens a step, "
        f"{first['train_steps'] * first['effective_batch_tokens']:,} in all), AdamW lr {args.lr} (cosine, "
        f"{args.warmup} warm-up steps), seed {args.seed}, memory carried and reset at document starts; validation "
        f"in {args.eval_batch} streams with memory. Equal attention cost: every query attends to {args.attended} "
        "memory slots plus the segment. Temporal range: L x mem_len (Transformer-XL), L x (mem_len + c x "
        "cmem_len) (Compressive). Recipe tok/s: training, median (min) over the recipe's logging windows after the "
        "first; evaluation, the final validation pass. The models trained one after the other, "
        + ", ".join(f"{r['label']} at {r['trained_at']} ({r['recipe_wall_seconds'] / 60:.1f} min)" for r in results)
        + ", on a machine shared with other work (2 cores), so these tok/s are indicative only."
    )
    speed_intro = (
        f"Throughput under the same conditions: the trained models take turns, {args.rounds} rounds (after a "
        f"warm-up round) of {args.round_steps} training steps ({args.batch} x {args.segment} tokens, the recipe's "
        f"step with the auxiliary loss) and {args.round_steps} evaluation steps ({args.eval_batch} x "
        f"{args.segment}, no grad), memory carried; vs Transformer-XL = its median time / this row's."
    )
    ablation_intro = (
        "How much memory the trained models use: the same validation pass with part of the memory taken away "
        "(the models were trained with their full memory). A small change means the model gets little from that "
        "part at this training budget."
    )
    ablation_table = markdown_table(
        ["model", "evaluated with", "temporal range", "val ppl", "bpc", "ppl with full memory", "change"],
        [
            [
                a["label"], a["evaluated_with"], f"{a['temporal_range']:,}", f"{a['perplexity']:.2f}",
                f"{a['bits_per_character']:.4f}", f"{a['full_memory_perplexity']:.2f}",
                f"{a['perplexity_increase_pct']:+.2f} %",
            ]
            for a in ablations
        ],
    )  # fmt: skip
    table = markdown_table(headers, rows)
    speed_table = markdown_table(speed_headers, speed_rows)
    summary = verdict(results, throughput, ablations)
    markdown = (
        f"{intro}\n\n{table}\n\n{speed_intro}\n\n{speed_table}\n\n{ablation_intro}\n\n{ablation_table}\n\n"
        f"{summary}\n\n"
        f"Wall time of this invocation {total / 60:.1f} min"
        + (" (training reused from the runs above)." if any(r.get("reused") for r in results) else ".")
    )
    json_path, md_path = write_results(
        args.name,
        {
            "args": vars(args),
            "results": results,
            "throughput": throughput,
            "memory_ablation": ablations,
            "verdict": summary,
            "total_seconds": round(total, 1),
        },  # fmt: skip
        markdown,
    )
    print()
    print(table)
    print()
    print(speed_table)
    print()
    print(ablation_table)
    print()
    print(summary)
    print(f"\nwrote {json_path} and {md_path} ({total:.0f} s)")


if __name__ == "__main__":
    main()
