"""Sparse Transformer against dense attention at 4,096 tokens (issue 39, "Fidelity and speed": bits per byte within
2 % of a dense model of the same size, at <= 1/4 of its attention memory at 4,096 tokens).

1. **Quality**: the Sparse Transformer with the ``strided`` and the ``fixed`` pattern (``pattern_layout="heads"``,
   ``stride`` = 64 = sqrt(4096)) against the same model with dense causal attention, trained at equal size, init seed,
   batches and steps on 4,096-byte windows of the bundled State of the Union corpus; held-out bits per byte. The dense
   model is our Sparse Transformer with ``sparsity_pattern="local_1d"``, one query block of 4,096 positions and no
   extra memory (``stride`` = 4096, ``memory_length`` = 0): full causal attention, the same parameters (absolute
   positions for all three).
2. **Attention memory**: one attention layer of each model (its projections included), a forward and a backward
   pass at batch 1 and 4,096 tokens, each in a fresh process: the rise of the process's peak resident memory (VmHWM,
   reset through ``/proc/self/clear_refs``; `tf_family.allocator` keeps freed memory in the heap, so the peak is
   the allocator's high-water mark; no warm-up pass, whose freed memory would be reused unseen) over the resident
   memory before the call, and the bytes the autograd graph keeps for the backward pass (``saved_tensors_hooks``,
   distinct storages). Three dense rows: the house's dense path above (SDPA with a boolean ``T x T`` mask), the same
   under ``attn_implementation="eager"`` (the ``T x T`` probabilities materialised) and PyTorch's ``scaled_dot_product_attention(is_causal=True)`` on the same
   projections (its CPU flash kernel keeps no ``T x T`` tensor).

    python bench/bench_sparse_vs_dense_4k.py --threads 1
    python bench/bench_sparse_vs_dense_4k.py --quick   # a smoke run
    # quality only, both layouts, 2 seeds, at 1,024 tokens (stride 32 = sqrt(1024)), where dense is cheap:
    python bench/bench_sparse_vs_dense_4k.py --length 1024 --stride 32 --steps 300 --seeds 2 --no_memory \
        --variants dense strided fixed strided-layers fixed-layers --name sparse_vs_dense_1024

``--variants``: ``dense``, ``strided``, ``fixed`` (the two factors split across each layer's heads,
``pattern_layout="heads"``) and ``strided-layers``, ``fixed-layers`` (interleaved across layers,
``pattern_layout="layers"``). ``--seeds N --first_seed F``: seeds ``F .. F + N - 1``, each its own init and batch
order (seed 0 is the default run's).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import markdown_table, setup_threads, write_results  # noqa: E402

VARIANTS = ("dense", "strided", "fixed")
QUALITY_VARIANTS = (*VARIANTS, "strided-layers", "fixed-layers")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--stride", type=int, default=64)
    parser.add_argument("--summary", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--eval_windows", type=int, default=4)
    parser.add_argument("--memory_width", type=int, default=256, help="width of the memory-probe attention layer")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seeds", type=int, default=1, help="seeds F .. F + N - 1 (init and batch order)")
    parser.add_argument("--first_seed", type=int, default=0, help="F")
    parser.add_argument("--variants", nargs="+", choices=QUALITY_VARIANTS, default=list(VARIANTS))
    parser.add_argument("--no_memory", action="store_true", help="quality only (no attention-memory probes)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--name", default="sparse_vs_dense_4k")
    parser.add_argument("--probe", choices=(*VARIANTS, "dense_eager", "dense_flash"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.length, args.stride, args.eval_windows = 3, 1024, 32, 1
        args.name = f"{args.name}_quick"
    return args


def build(args, variant: str, width: int, layers: int):
    from tf_family import create_model

    variant, _, layout = variant.partition("-")
    pattern = {"dense": {"sparsity_pattern": "local_1d", "stride": args.length, "memory_length": 0}}.get(
        variant, {"sparsity_pattern": variant, "stride": args.stride, "summary_size": args.summary}
    )
    return create_model(
        "sparse_transformer",
        "causal_lm",
        "tiny",
        vocab_size=256,
        hidden_size=width,
        num_hidden_layers=layers,
        num_attention_heads=args.heads,
        intermediate_size=4 * width,
        pattern_layout=layout or "heads",
        max_position_embeddings=args.length,
        **pattern,
    )


def byte_tensor(text: str):
    import torch

    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)


def seed_range(args) -> range:
    return range(args.first_seed, args.first_seed + args.seeds)


def quality(args, train, valid) -> dict:
    import torch
    import torch.nn.functional as F

    span, results = args.length + 1, {}
    inputs = valid[: args.eval_windows * args.length].view(args.eval_windows, args.length)
    targets = valid[1 : args.eval_windows * args.length + 1].view(args.eval_windows, args.length)
    for variant, seed in ((v, s) for v in args.variants for s in seed_range(args)):
        torch.manual_seed(seed)
        model = build(args, variant, args.width, args.layers).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
        generator = torch.Generator().manual_seed(seed)
        start = time.perf_counter()
        for _ in range(args.steps):
            offsets = torch.randint(0, train.numel() - span, (args.batch,), generator=generator)
            rows = torch.stack([train[o : o + span] for o in offsets.tolist()])
            loss = F.cross_entropy(model(rows[:, :-1]).logits.reshape(-1, 256), rows[:, 1:].reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        seconds = time.perf_counter() - start
        model.eval()
        total = 0.0
        with torch.no_grad():
            for row in range(args.eval_windows):
                logits = model(inputs[row : row + 1]).logits
                total += float(F.cross_entropy(logits.reshape(-1, 256), targets[row], reduction="sum"))
        bits = total / (args.eval_windows * args.length) / math.log(2)
        run = {
            "bits_per_byte": bits,
            "train_seconds": seconds,
            "parameters": sum(p.numel() for p in model.parameters()),
        }
        key = variant if args.seeds == 1 else f"{variant}/seed{seed}"
        results[key] = run
        print(key, run, flush=True)
    return results


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def probe(args) -> dict:
    """One attention layer's forward and backward in this (fresh) process: peak RSS rise and saved bytes."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    variant = "dense" if args.probe in ("dense_flash", "dense_eager") else args.probe
    model = build(args, variant, args.memory_width, 1)
    if args.probe == "dense_eager":
        model.config._attn_implementation = "eager"  # the probabilities materialised, as in the paper's baseline
    attention = model.model.layers[0].self_attn
    ids = torch.randint(0, 256, (1, args.length))
    with torch.no_grad():
        hidden, inputs = model.model.prepare(ids, None, None, None, None, False)
    hidden = hidden.detach().requires_grad_(True)

    def run():
        if args.probe != "dense_flash":
            return attention(hidden, inputs)[0]
        query, key, value = (
            attention._heads(p(hidden)) for p in (attention.q_proj, attention.k_proj, attention.v_proj)
        )
        out = F.scaled_dot_product_attention(query, key, value, is_causal=True)
        return attention.o_proj(out.transpose(1, 2).reshape(1, args.length, -1))

    saved: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    Path("/proc/self/clear_refs").write_text("5")  # peak RSS := current RSS
    before = _status_kib("VmRSS")
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = run()
    out.sum().backward()
    peak = _status_kib("VmHWM")
    parameters = sum(p.numel() * p.element_size() for p in attention.parameters())
    saved_bytes = sum(size for size in saved.values()) - parameters  # weights are saved too: not activations
    return {"peak_rise_mib": (peak - before) / 1024, "saved_for_backward_mib": max(saved_bytes, 0) / 2**20}


def memory(args) -> dict:
    results = {}
    for variant in (*VARIANTS, "dense_eager", "dense_flash"):
        command = [sys.executable, __file__, "--probe", variant, "--threads", str(args.threads)]
        command += ["--length", str(args.length), "--stride", str(args.stride), "--summary", str(args.summary)]
        command += ["--heads", str(args.heads), "--memory_width", str(args.memory_width)]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        results[variant] = json.loads(done.stdout.strip().splitlines()[-1])
        print(variant, results[variant], flush=True)
    return results


def quality_markdown(args, results: dict) -> str:
    """One row per variant (mean over seeds, the per-seed figures beside it), ``vs dense`` from the means."""
    by_variant: dict[str, list[dict]] = {}
    for key, run in results.items():
        by_variant.setdefault(key.split("/")[0], []).append(run)
    mean = {v: sum(r["bits_per_byte"] for r in runs) / len(runs) for v, runs in by_variant.items()}
    dense = mean.get("dense")
    rows = []
    for variant, runs in by_variant.items():
        row = [variant, runs[0]["parameters"], f"{mean[variant]:.4f}"]
        if args.seeds > 1:
            row.append(", ".join(f"{r['bits_per_byte']:.4f}" for r in runs))
        row.append("-" if dense is None else f"{100 * (mean[variant] / dense - 1):+.2f} %")
        row.append(f"{sum(r['train_seconds'] for r in runs) / len(runs):.0f}")
        rows.append(row)
    header = ["attention", "parameters", "held-out bits per byte" + (" (mean)" if args.seeds > 1 else "")]
    header += ["per seed"] * (args.seeds > 1) + ["vs dense", "training s"]
    return markdown_table(header, rows)


def environment() -> dict:
    return {"TF_FAMILY_NATIVE": os.environ.get("TF_FAMILY_NATIVE")}


def native_note() -> str:
    """The attention kernel when ``TF_FAMILY_NATIVE`` is set (``0``: PyTorch's SDPA instead of the native CPU kernel,
    the same attention up to float rounding)."""
    value = os.environ.get("TF_FAMILY_NATIVE")
    return "" if value is None else f" Run with TF_FAMILY_NATIVE={value}."


def quality_text(args, table: str) -> str:
    first, last = seed_range(args)[0], seed_range(args)[-1]
    seeds = f"seed {first}" if args.seeds == 1 else f"seeds {first} .. {last}"
    seeds += " (each seed: the same init and batches for every variant)"
    return (
        f"## Quality\n\n{args.layers} layers, width {args.width}, {args.heads} heads, vocabulary 256 (bytes), absolute "
        f"positions; strided / fixed: stride {args.stride}, {args.summary} summary columns (fixed), the two factors "
        f"split between each layer's heads (``-layers``: interleaved across layers instead); dense: the same model with "
        f"one causal block of {args.length} positions. {args.steps} AdamW steps (lr {args.lr}, clip 1) of "
        f"{args.batch} x {args.length} bytes of the bundled State of the Union corpus, {seeds}; held-out: "
        f"{args.eval_windows} windows of {args.length} bytes, every position scored. A tiny scale: the issue's 2 % "
        f"target is read at this scale only. Training seconds were measured on a shared machine: not a result."
        f"{native_note()}"
        f"\n\n{table}"
    )


def main(argv=None) -> None:
    args = parse_args(argv)
    setup_threads(args.threads)
    if args.probe:
        print(json.dumps(probe(args)))
        return

    from tf_family.data import load_text_datasets

    datasets, column = load_text_datasets("sotu")
    train = byte_tensor("\n".join(datasets["train"][column]))
    valid = byte_tensor("\n".join(datasets["validation"][column]))
    memory_results = {} if args.no_memory else memory(args)
    quality_results = quality(args, train, valid)
    quality_table = quality_markdown(args, quality_results)
    markdown = f"# Sparse Transformer against dense attention at {args.length} tokens\n\n" + quality_text(
        args, quality_table
    )
    if args.no_memory:
        write_results(
            args.name, {"args": vars(args), "environment": environment(), "quality": quality_results}, markdown
        )
        print(markdown)
        return
    dense_peak = memory_results["dense"]["peak_rise_mib"]
    dense_saved = memory_results["dense"]["saved_for_backward_mib"]
    memory_table = markdown_table(
        ["attention", "peak rise MiB", "/ house dense", "saved for backward MiB", "/ house dense"],
        [
            [
                name,
                f"{r['peak_rise_mib']:.1f}",
                f"{r['peak_rise_mib'] / dense_peak:.3f}",
                f"{r['saved_for_backward_mib']:.1f}",
                f"{r['saved_for_backward_mib'] / dense_saved:.3f}",
            ]
            for name, r in memory_results.items()
        ],
    )
    markdown += (
        f"\n\n## Attention memory\n\nOne attention layer (width {args.memory_width}, {args.heads} heads, projections "
        f"included), forward + backward of ``out.sum()`` at batch 1 x {args.length} tokens, float32, each variant in a "
        f"fresh process (no warm-up pass: the first pass's one-off allocations, a few MiB, are counted): the rise of peak resident memory over the resident memory before the "
        f"pass, and the activations autograd saves for the backward pass (weights excluded). ``dense``: the house's "
        f"dense path (a boolean {args.length} x {args.length} mask into SDPA); ``dense_eager``: the same model with ``attn_implementation='eager'`` (the "
        f"{args.length} x {args.length} probabilities materialised, the paper's dense baseline); ``dense_flash``: "
        f"``scaled_dot_product_attention(is_causal=True)``, no mask. {args.threads} thread(s).\n\n{memory_table}\n"
    )
    write_results(
        args.name,
        {"args": vars(args), "environment": environment(), "quality": quality_results, "memory": memory_results},
        markdown,
    )
    print(markdown)


if __name__ == "__main__":
    main()
