"""The Routing Transformer's fidelity and speed (issue 39, item 3).

1. **Quality**: on byte windows of the bundled State of the Union corpus, the Routing Transformer (two local and two
   routing heads per layer, nearest-centroid clusters, then the reference's balanced clusters) against the same model
   made local only (``sparsity_skip_first`` = every layer, so the routing heads attend locally too), at equal size,
   batches and steps: held-out bits per byte.
2. **Speed**: a training step (forward and backward of the language-model loss) of tf_family's model with balanced
   clusters against routing-transformer 1.6.1's ``RoutingTransformerLM`` on the same config (what the parity test
   compares), interleaved rounds, medians.

    python bench/bench_routing_transformer.py
    python bench/bench_routing_transformer.py --quick   # a smoke run
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import markdown_table, setup_threads, time_interleaved, write_results  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--length", type=int, default=512, help="training window in bytes")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--window", type=int, default=64, help="local block, and the cluster size")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--speed_lengths", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--name", default="routing_transformer")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.length, args.speed_lengths, args.rounds = 5, 128, [256], 2
        args.name = f"{args.name}_quick"
    return args


def ours(args, length: int, **overrides):
    from tf_family import create_model

    heads = 4
    return create_model(
        "routing_transformer",
        "causal_lm",
        "tiny",
        vocab_size=256,
        hidden_size=args.width,
        num_hidden_layers=args.layers,
        num_attention_heads=heads,
        intermediate_size=4 * args.width,
        num_local_heads=2,
        local_window=args.window,
        num_clusters=max(1, length // args.window),
        cluster_size=args.window,
        **overrides,
    )


def reference(args, length: int):
    from routing_transformer import RoutingTransformerLM

    return RoutingTransformerLM(
        num_tokens=256,
        dim=args.width,
        depth=args.layers,
        max_seq_len=length,
        heads=4,
        dim_head=args.width // 4,
        window_size=args.window,
        local_attn_window_size=args.window,
        causal=True,
        n_local_attn_heads=2,
        tie_embedding=True,
    )


def byte_windows(text: str, length: int):
    import torch

    data = torch.tensor(list(text.encode("utf-8")), dtype=torch.long)
    count = data.numel() // (length + 1)
    return data[: count * (length + 1)].view(count, length + 1)


def quality(args, train, valid) -> dict:
    import torch
    import torch.nn.functional as F

    settings = {
        "routing, nearest clusters": {},
        "routing, balanced clusters": {"routing_membership": "balanced"},
        "local only (sparsity_skip_first = all layers)": {"sparsity_skip_first": args.layers},
    }
    results = {}
    for name, overrides in settings.items():
        torch.manual_seed(0)
        model = ours(args, args.length, **overrides).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
        generator = torch.Generator().manual_seed(0)
        for _ in range(args.steps):
            rows = train[torch.randint(0, train.shape[0], (args.batch,), generator=generator)]
            logits = model(rows[:, :-1]).logits
            loss = F.cross_entropy(logits.reshape(-1, 256), rows[:, 1:].reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        model.eval()
        with torch.no_grad():
            logits = model(valid[:, :-1]).logits
            bits = float(F.cross_entropy(logits.reshape(-1, 256), valid[:, 1:].reshape(-1))) / math.log(2)
        results[name] = {"bits_per_byte": bits, "parameters": sum(p.numel() for p in model.parameters())}
        print(name, results[name], flush=True)
    return results


def speed(args) -> list[dict]:
    import torch
    import torch.nn.functional as F

    rows = []
    for length in args.speed_lengths:
        torch.manual_seed(0)
        mine = ours(args, length, routing_membership="balanced").train()
        theirs = reference(args, length).train()
        tokens = torch.randint(0, 256, (1, length + 1))
        inputs, targets = tokens[:, :-1], tokens[:, 1:]

        def step_ours(model=mine, inputs=inputs, targets=targets):
            model.zero_grad(set_to_none=True)
            F.cross_entropy(model(inputs).logits.reshape(-1, 256), targets.reshape(-1)).backward()

        def step_reference(model=theirs, inputs=inputs, targets=targets):
            model.zero_grad(set_to_none=True)
            logits, _ = model(inputs)  # the commitment loss is left out, as in the parity test
            F.cross_entropy(logits.reshape(-1, 256), targets.reshape(-1)).backward()

        times = time_interleaved({"ours": step_ours, "reference": step_reference}, rounds=args.rounds)
        medians = {name: statistics.median(values) for name, values in times.items()}
        rows.append(
            {
                "length": length,
                "times": times,
                "medians": medians,
                "reference_over_ours": medians["reference"] / medians["ours"],
            }
        )
        print(rows[-1]["length"], medians, flush=True)
    return rows


def main(argv=None) -> None:
    args = parse_args(argv)
    setup_threads(args.threads)

    from tf_family.data import load_text_datasets

    datasets, column = load_text_datasets("sotu")
    train = byte_windows("\n".join(datasets["train"][column]), args.length)
    valid = byte_windows("\n".join(datasets["validation"][column]), args.length)[:32]
    quality_results = quality(args, train, valid)
    speed_results = speed(args)

    quality_table = markdown_table(
        ["model", "parameters", "held-out bits per byte"],
        [[name, r["parameters"], f"{r['bits_per_byte']:.3f}"] for name, r in quality_results.items()],
    )
    speed_table = markdown_table(
        ["tokens", "tf_family (balanced) ms", "routing-transformer ms", "reference / ours"],
        [
            [
                r["length"],
                f"{1000 * r['medians']['ours']:.0f}",
                f"{1000 * r['medians']['reference']:.0f}",
                f"{r['reference_over_ours']:.2f}",
            ]
            for r in speed_results
        ],
    )
    markdown = (
        f"# Routing Transformer: quality against local-only, speed against routing-transformer 1.6.1\n\n"
        f"{args.layers} layers, width {args.width}, 4 heads (2 local, 2 routing), local block and cluster size "
        f"{args.window}, vocabulary 256 (bytes). The local-only model has slightly more parameters: its two routing "
        "heads become local heads, which project keys apart from queries.\n\n"
        f"## Quality\n\n{args.steps} AdamW steps (lr {args.lr}, clip 1) of {args.batch} x {args.length} bytes of the "
        f"bundled corpus, the same batches and init seed for every model; held-out: {valid.shape[0]} windows.\n\n"
        f"{quality_table}\n\n## Training step (batch 1, {args.rounds} interleaved rounds, medians, "
        f"{args.threads} threads)\n\n{speed_table}\n"
    )
    write_results(args.name, {"args": vars(args), "quality": quality_results, "speed": speed_results}, markdown)
    print(markdown)


if __name__ == "__main__":
    main()
