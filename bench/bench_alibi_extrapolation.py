"""ALiBi's length extrapolation (issue 39, "Fidelity and speed": trained at 256 tokens, perplexity at 1,024 within 5 %
of its perplexity at 256, where absolute positions degrade; Press, Smith & Lewis 2022, arXiv:2108.12409).

The same Sparse Transformer causal LM (strided pattern, ``pattern_layout="heads"``: half the heads read the previous
``stride`` bytes, half every ``stride``-th earlier byte) is trained on 256-byte windows of the bundled State of the
Union corpus once per ``position_embedding_type`` (same init seed, batches and steps), then evaluated on the same
held-out bytes cut into non-overlapping windows of 256, 512 and 1,024 bytes (every position of a window scored, as in
the paper's non-overlapping evaluation).

How each option meets positions it never saw in training:

- ``absolute``: the learned table is sized for the longest evaluation (``max_position_embeddings`` = 1,024) but
  training only updates rows 0..255; rows 256.. stay at their initialisation (normal, std 0.02; no weight decay);
- ``rotary``: angles beyond 255 were never seen (no scaling, no interpolation);
- ``alibi``: no table; the per-head linear bias continues.

    python bench/bench_alibi_extrapolation.py --threads 1
    python bench/bench_alibi_extrapolation.py --quick   # a smoke run
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import markdown_table, setup_threads, write_results  # noqa: E402

OPTIONS = ("alibi", "absolute", "rotary")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--options", nargs="+", default=list(OPTIONS), choices=OPTIONS)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--train_length", type=int, default=256)
    parser.add_argument("--eval_lengths", type=int, nargs="+", default=[256, 512, 1024])
    parser.add_argument("--eval_bytes", type=int, default=16384, help="held-out bytes scored at every length")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--stride", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--name", default="alibi_extrapolation")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.eval_bytes = 5, 2048
        args.name = f"{args.name}_quick"
    return args


def build(args, option: str):
    from tf_family import create_model

    return create_model(
        "sparse_transformer",
        "causal_lm",
        "tiny",
        vocab_size=256,
        hidden_size=args.width,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        intermediate_size=4 * args.width,
        sparsity_pattern="strided",
        pattern_layout="heads",
        stride=args.stride,
        position_embedding_type=option,
        max_position_embeddings=max(args.eval_lengths),
    )


def byte_tensor(text: str):
    import torch

    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)


def train_one(args, option: str, train) -> tuple[object, float]:
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = build(args, option).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(0)
    span = args.train_length + 1
    start = time.perf_counter()
    for _ in range(args.steps):
        offsets = torch.randint(0, train.numel() - span, (args.batch,), generator=generator)
        rows = torch.stack([train[o : o + span] for o in offsets.tolist()])
        logits = model(rows[:, :-1]).logits
        loss = F.cross_entropy(logits.reshape(-1, 256), rows[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return model.eval(), time.perf_counter() - start


def evaluate(model, valid, length: int) -> float:
    """Mean cross-entropy (nats per byte) of every position of the non-overlapping ``length``-byte windows."""
    import torch
    import torch.nn.functional as F

    count = (valid.numel() - 1) // length
    inputs = valid[: count * length].view(count, length)
    targets = valid[1 : count * length + 1].view(count, length)
    total = 0.0
    with torch.no_grad():
        for first in range(0, count, 4):
            logits = model(inputs[first : first + 4]).logits
            total += float(
                F.cross_entropy(logits.reshape(-1, 256), targets[first : first + 4].reshape(-1), reduction="sum")
            )
    return total / (count * length)


def main(argv=None) -> None:
    args = parse_args(argv)
    setup_threads(args.threads)

    from tf_family.data import load_text_datasets

    datasets, column = load_text_datasets("sotu")
    train = byte_tensor("\n".join(datasets["train"][column]))
    valid = byte_tensor("\n".join(datasets["validation"][column]))[: args.eval_bytes + 1]
    results = {}
    for option in args.options:
        model, seconds = train_one(args, option, train)
        losses = {length: evaluate(model, valid, length) for length in args.eval_lengths}
        base = losses[args.train_length] if args.train_length in losses else losses[min(losses)]
        results[option] = {
            "train_seconds": seconds,
            "nats_per_byte": losses,
            "perplexity": {length: math.exp(loss) for length, loss in losses.items()},
            "bits_per_byte": {length: loss / math.log(2) for length, loss in losses.items()},
            "perplexity_ratio_to_train_length": {length: math.exp(loss - base) for length, loss in losses.items()},
        }
        print(option, results[option], flush=True)

    lengths = args.eval_lengths
    longest = max(lengths)
    table = markdown_table(
        [
            "positions",
            *(f"byte perplexity at {n}" for n in lengths),
            *(f"ratio {n} / {args.train_length}" for n in lengths if n != args.train_length),
        ],
        [
            [
                option,
                *(f"{r['perplexity'][n]:.3f}" for n in lengths),
                *(f"{r['perplexity_ratio_to_train_length'][n]:.3f}" for n in lengths if n != args.train_length),
            ]
            for option, r in results.items()
        ],
    )
    verdict = ""
    if "alibi" in results and longest in results["alibi"]["perplexity_ratio_to_train_length"]:
        ratio = results["alibi"]["perplexity_ratio_to_train_length"][longest]
        holds = "holds" if ratio <= 1.05 else "does not hold"
        verdict = (
            f"\n\nThe issue's claim (ALiBi's perplexity at {longest} within 5 % of its perplexity at "
            f"{args.train_length}): ratio {ratio:.3f}, the claim {holds} at this scale."
        )
    markdown = (
        f"# ALiBi extrapolation: trained at {args.train_length} bytes, evaluated at {', '.join(map(str, lengths))}\n\n"
        f"Sparse Transformer causal LM, strided pattern (stride {args.stride}, heads split between the two factors), "
        f"{args.layers} layers, width {args.width}, {args.heads} heads, vocabulary 256 (bytes). {args.steps} AdamW "
        f"steps (lr {args.lr}, clip 1, no weight decay) of {args.batch} x {args.train_length} bytes of the bundled "
        f"State of the Union corpus, the same init seed and batches for every option; evaluated on the first "
        f"{args.eval_bytes} held-out bytes cut into non-overlapping windows, every position scored. ``absolute``: a "
        f"table of {longest} learned rows of which training updates only 0..{args.train_length - 1} (the rest stay "
        f"at their initialisation); ``rotary``: unscaled angles; ``alibi``: the same linear bias at every length. "
        f"{args.threads} thread(s).\n\n{table}{verdict}\n"
    )
    write_results(args.name, {"args": vars(args), "results": results}, markdown)
    print(markdown)


if __name__ == "__main__":
    main()
