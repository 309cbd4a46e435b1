"""The Reformer paper's duplication task (Kitaev et al. 2020, section 5, Table 2), at small scale.

Each sequence is ``0 w 0 w``: a separator, ``L/2 - 1`` random symbols, the separator again and the same symbols.
A causal LM learns to copy the first half; only the second half's symbols are scored ("masked accuracy", as in the
paper). Models are trained with LSH attention using 1 or 2 hashing rounds and evaluated with 1, 2, 4 and 8 rounds
(more rounds at evaluation make it more likely that a query meets the key it must copy).

    python bench/bench_reformer_duplication.py --length 64 --steps 300
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


def batch(size: int, length: int, vocab: int, generator):
    import torch

    half = length // 2
    symbols = torch.randint(1, vocab, (size, half - 1), generator=generator)
    zero = torch.zeros(size, 1, dtype=torch.long)
    ids = torch.cat([zero, symbols, zero, symbols], dim=1)  # (B, L)
    labels = ids.clone()
    labels[:, : half + 1] = -100  # score the copied symbols only
    return ids, labels


def masked_accuracy(model, length: int, vocab: int, num_hashes: int, batches: int = 8) -> float:
    import torch

    generator = torch.Generator().manual_seed(1234)
    correct = total = 0
    model.eval()
    with torch.no_grad():
        for _ in range(batches):
            ids, labels = batch(32, length, vocab, generator)
            predicted = model(input_ids=ids, num_hashes=num_hashes).logits[:, :-1].argmax(-1)
            target = labels[:, 1:]
            scored = target != -100
            correct += int((predicted[scored] == target[scored]).sum())
            total += int(scored.sum())
    return correct / total


def train(train_hashes: int, args) -> tuple[object, list[float], float]:
    import torch

    import tf_family

    torch.manual_seed(0)
    config = tf_family.TffReformerConfig(
        vocab_size=args.vocab, hidden_size=128, attn_layers=["lsh", "lsh"], num_attention_heads=2,
        attention_head_size=64, feed_forward_size=256, lsh_attn_chunk_length=args.chunk, num_hashes=train_hashes,
        num_buckets=None, position_embedding_type="absolute", max_position_embeddings=args.length,
        hidden_dropout_prob=0.0, lsh_attention_probs_dropout_prob=0.0, causal=True,
    )  # fmt: skip
    model = tf_family.TffReformerForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    generator = torch.Generator().manual_seed(0)
    losses, start = [], time.perf_counter()
    for step in range(args.steps):
        model.train()
        ids, labels = batch(args.batch_size, args.length, args.vocab, generator)
        loss = model(input_ids=ids, labels=labels, hash_seed=step).loss  # fresh rotations every step
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(round(loss.item(), 4))
    return model, losses, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=64)
    parser.add_argument("--chunk", type=int, default=8)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--train-hashes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--eval-hashes", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--name", default="reformer_duplication")
    args = parser.parse_args()
    common.setup_threads()

    rows, records = [], []
    for train_hashes in args.train_hashes:
        model, losses, seconds = train(train_hashes, args)
        accuracy = {n: masked_accuracy(model, args.length, args.vocab, n) for n in args.eval_hashes}
        print(train_hashes, accuracy, f"{seconds:.0f} s", flush=True)
        records.append({"train_hashes": train_hashes, "accuracy": accuracy, "train_seconds": round(seconds, 1),
                        "final_losses": losses[-10:]})  # fmt: skip
        rows.append([f"LSH-{train_hashes}", *(f"{100 * accuracy[n]:.1f} %" for n in args.eval_hashes),
                     f"{seconds:.0f} s"])  # fmt: skip
    markdown = (
        f"Duplication task (sequences `0 w 0 w`, length {args.length}, {args.vocab} symbols), 2 LSH layers, width "
        f"128, chunk {args.chunk}, automatic bucket count, {args.steps} steps of {args.batch_size}, lr {args.lr}. "
        "Masked accuracy on the copied half (8 x 32 fresh sequences), by hashing rounds at evaluation. The machine "
        "is shared (loadavg in the footer).\n\n"
        + common.markdown_table(
            ["trained with", *(f"eval {n} hash{'es' if n > 1 else ''}" for n in args.eval_hashes), "train time"],
            rows,
        )
    )
    common.write_results(args.name, {"args": vars(args), "results": records}, markdown)


if __name__ == "__main__":
    main()
