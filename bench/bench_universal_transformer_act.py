"""Universal Transformer with ACT on a copy task generated locally: how many steps each token ponders.

A causal language model reads ``x_1 .. x_n SEP`` and must write ``x_1 .. x_n`` again (the loss covers the copy only).
A tiny `TffUniversalTransformerForCausalLM` is trained on lengths ``--train_lengths`` and evaluated on those and on
``--eval_lengths`` (longer than any seen). Reported per evaluation length: copy accuracy (teacher-forced next-token
argmax), and the distribution of ponder steps ``N`` per token, separately over the input half and the copy half.

What it shows: whether the learned halting spends different amounts of computation on different tokens (the
distribution is not one value). It does not compare with a fixed-depth Transformer (the length-generalisation
comparison the paper makes); that bench is still to be written.

    python bench/bench_universal_transformer_act.py --steps 300
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import markdown_table, setup_threads, write_results  # noqa: E402

SEP = 1


def make_batch(batch: int, length: int, vocab: int, generator):
    import torch

    tokens = torch.randint(2, vocab, (batch, length), generator=generator)
    separator = torch.full((batch, 1), SEP)
    input_ids = torch.cat([tokens, separator, tokens], dim=1)  # (B, 2n + 1)
    labels = input_ids.clone()
    labels[:, : length + 1] = -100  # only the copy is scored
    return input_ids, labels


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--train_lengths", type=int, nargs="+", default=[4, 5, 6, 7, 8])
    parser.add_argument("--eval_lengths", type=int, nargs="+", default=[6, 8, 12, 16])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--act_loss_weight", type=float, default=0.01)
    args = parser.parse_args(argv)
    setup_threads(args.threads)
    import torch

    from tf_family import create_model

    torch.manual_seed(args.seed)
    vocab = 16
    model = create_model(
        "universal_transformer",
        "causal_lm",
        "tiny",
        vocab_size=vocab,
        hidden_size=64,
        num_attention_heads=4,
        intermediate_size=128,
        act_max_steps=8,
        act_loss_weight=args.act_loss_weight,
    ).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    generator = torch.Generator().manual_seed(args.seed)
    started = time.perf_counter()
    for step in range(args.steps):
        length = args.train_lengths[step % len(args.train_lengths)]
        input_ids, labels = make_batch(args.batch, length, vocab, generator)
        loss = model(input_ids, labels=labels, use_cache=False).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    train_seconds = time.perf_counter() - started

    model.eval()
    rows, payload = [], {"train_seconds": train_seconds, "final_train_loss": float(loss.detach()), "eval": {}}
    for length in args.eval_lengths:
        input_ids, labels = make_batch(256, length, vocab, torch.Generator().manual_seed(1000 + length))
        with torch.no_grad():
            outputs = model(input_ids, use_cache=False)
        predicted = outputs.logits[:, :-1].argmax(-1)
        target = labels[:, 1:]
        scored = target != -100
        accuracy = float((predicted[scored] == target[scored]).float().mean())
        steps = outputs.ponder_steps
        halves = {"input": steps[:, : length + 1], "copy": steps[:, length + 1 :]}
        histograms = {
            name: dict(sorted(collections.Counter(int(n) for n in half.flatten().tolist()).items()))
            for name, half in halves.items()
        }
        means = {name: float(half.mean()) for name, half in halves.items()}
        payload["eval"][length] = {"copy_accuracy": accuracy, "ponder_histogram": histograms, "mean_ponder": means}
        seen = "seen" if length in args.train_lengths else "longer than training"
        rows.append(
            [
                f"{length} ({seen})",
                f"{accuracy:.3f}",
                f"{means['input']:.2f}",
                f"{means['copy']:.2f}",
                " ".join(f"{k}:{v}" for k, v in histograms["input"].items()),
                " ".join(f"{k}:{v}" for k, v in histograms["copy"].items()),
            ]
        )
    table = markdown_table(
        ["length n", "copy accuracy", "mean N (input)", "mean N (copy)", "N histogram (input)", "N histogram (copy)"],
        rows,
    )
    markdown = (
        "# Universal Transformer + ACT: ponder steps on a copy task\n\n"
        f"Tiny causal UT (hidden 64, 4 heads, act_max_steps 8), {args.steps} Adam steps (lr {args.lr}, act_loss_weight {args.act_loss_weight}) at lengths "
        f"{args.train_lengths}, batch {args.batch}, trained in {train_seconds:.0f} s on a shared, loaded machine "
        f"(final training loss {float(loss.detach()):.3f}).\n\n{table}\n"
    )
    write_results("universal_transformer_act", payload, markdown)
    print(markdown)


if __name__ == "__main__":
    main()
