"""Depth-Adaptive Transformer exits against CALM's on the same model: quality against average exit depth
(issue 41, item 3).

1. One byte-level CALM decoder (``--layers`` layers, exits after every layer) is trained on the bundled State of the
   Union corpus with the anytime loss; its measure is ``"halting"``, so the same run trains CALM's meta classifier and
   the Depth-Adaptive geometric-like halting classifier (both on detached states: neither changes the model).
2. The multinomial halting classifier is then trained on the frozen model (the same detached states, so this is
   what joint training would give it).
3. On held-out prompts, greedy continuations at full depth and, per measure and threshold, with early exit:
   CALM's ``softmax_diff`` and ``meta``, the Depth-Adaptive ``halting`` (geometric-like) and ``multinomial``. Reported
   per point: the mean exit layer of the generated tokens and the consistency with the full model's tokens
   (1 - the fraction of differing tokens; CALM's quality measure), plus the held-out bits per byte of the full model
   and of each exit (what exiting early costs in likelihood at a fixed depth).

    python bench/bench_depth_adaptive.py --steps 1500
    python bench/bench_depth_adaptive.py --quick   # a smoke run
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import markdown_table, setup_threads, write_results  # noqa: E402

MEASURES = {
    "softmax_diff": "CALM softmax top-1 minus top-2",
    "meta": "CALM meta classifier",
    "halting": "Depth-Adaptive geometric-like",
    "multinomial": "Depth-Adaptive multinomial",
}
THRESHOLDS = [0.9, 0.7, 0.5, 0.3, 0.1]  # every measure is a probability-like score in [0, 1]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--halting_steps", type=int, default=300, help="steps of the multinomial classifier")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--block", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--depth_penalty", type=float, default=0.02, help="λ of the likelihood oracle (nats/layer)")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--prompt_length", type=int, default=32)
    parser.add_argument("--new_tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--name", default="depth_adaptive")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.halting_steps, args.prompts, args.new_tokens = 30, 10, 4, 8
        args.name = f"{args.name}_quick"
    return args


def byte_blocks(text: str, block: int):
    import torch

    data = torch.tensor(list(text.encode("utf-8")), dtype=torch.long)
    count = data.numel() // block
    return data[: count * block].view(count, block)


def build(args):
    import torch

    from tf_family import TffCalmConfig, TffCalmForCausalLM

    torch.manual_seed(args.seed)
    config = TffCalmConfig(
        vocab_size=256,
        hidden_size=args.width,
        intermediate_size=int(2.75 * args.width),
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        max_position_embeddings=args.prompt_length + args.new_tokens + args.block,
        confidence_measure="halting",
        halting_depth_penalty=args.depth_penalty,
        aggregation="uniform",
        position_temperature=0.0,  # the threshold as given (no position decay): the Depth-Adaptive paper's rule
    )
    return TffCalmForCausalLM(config)


def train(model, blocks, args, steps: int, parameters=None, objective: str = "loss") -> float:
    """``steps`` AdamW steps on random blocks, minimising ``out.<objective>`` over ``parameters`` (all by default)."""
    import torch

    parameters = list(parameters if parameters is not None else model.parameters())
    optimizer = torch.optim.AdamW(parameters, lr=args.lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(args.seed)
    model.train()
    start = time.perf_counter()
    for _ in range(steps):
        rows = torch.randint(0, blocks.shape[0], (args.batch,), generator=generator)
        out = model(blocks[rows], labels=blocks[rows])
        getattr(out, objective).backward()
        torch.nn.utils.clip_grad_norm_(parameters, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    model.eval()
    return time.perf_counter() - start


def bits_per_byte_by_exit(model, blocks) -> list[float]:
    """Held-out bits per byte when every token is read at exit ``n`` (teacher forcing)."""
    import torch
    import torch.nn.functional as F

    with torch.no_grad():
        out = model(blocks, output_hidden_states=True)
        targets = blocks[:, 1:].reshape(-1)
        result = []
        for point in model.config.exit_points():
            logits = model.lm_head(model.model.norm(out.hidden_states[point]))[:, :-1]
            result.append(float(F.cross_entropy(logits.reshape(-1, 256), targets)) / math.log(2))
    return result


def main(argv=None) -> None:
    args = parse_args(argv)
    setup_threads()
    import torch

    from tf_family.data import load_text_datasets
    from tf_family.training.early_exit import generate_with_exits

    datasets, column = load_text_datasets("sotu")
    train_blocks = byte_blocks("\n".join(datasets["train"][column]), args.block)
    valid_text = "\n".join(datasets["validation"][column])
    valid_blocks = byte_blocks(valid_text, args.block)[:64]
    prompt_blocks = byte_blocks(valid_text[len(valid_text) // 2 :], args.prompt_length)
    prompts = prompt_blocks[:: max(1, prompt_blocks.shape[0] // args.prompts)][: args.prompts]

    model = build(args)
    train_seconds = train(model, train_blocks, args, args.steps)
    bpb = bits_per_byte_by_exit(model, valid_blocks)
    multinomial = copy.deepcopy(model)
    multinomial.config.confidence_measure = "multinomial"
    multinomial.requires_grad_(False)
    multinomial.halting_classifier.requires_grad_(True)
    with torch.no_grad():  # a fresh classifier: the geometric one's rows mean something else
        multinomial.halting_classifier.reset_parameters()
    train(
        multinomial,
        train_blocks,
        args,
        args.halting_steps,
        multinomial.halting_classifier.parameters(),
        "halting_loss",
    )

    full = generate_with_exits(model, prompts, args.new_tokens, batch_size=len(prompts), threshold=None)
    rows, points = [], {}
    for measure, title in MEASURES.items():
        runner = multinomial if measure == "multinomial" else model
        runner.config.confidence_measure = measure
        points[measure] = []
        for threshold in THRESHOLDS:
            early = generate_with_exits(runner, prompts, args.new_tokens, batch_size=len(prompts), threshold=threshold)
            consistency = float((early.tokens == full.tokens).float().mean())
            depth = early.mean_exit_layer
            points[measure].append({"threshold": threshold, "mean_exit": depth, "consistency": consistency})
            rows.append([title, f"`{measure}`", threshold, f"{depth:.2f}", f"{consistency:.3f}"])
        print(f"{title}: {points[measure]}", flush=True)
    model.config.confidence_measure = "halting"

    table = markdown_table(["exit rule", "measure", "threshold", "mean exit layer", "consistency"], rows)
    bpb_table = markdown_table(
        ["exit after layers", *[str(p) for p in model.config.exit_points()]],
        [["held-out bits per byte", *[f"{b:.3f}" for b in bpb]]],
    )
    markdown = (
        f"# Depth-Adaptive exits vs CALM's, on one model\n\n"
        f"Byte-level CALM decoder, {args.layers} layers of width {args.width}, exits after every layer, trained "
        f"{args.steps} steps (batch {args.batch} x {args.block} bytes, AdamW {args.lr}, {train_seconds:.0f} s) on the "
        f"bundled State of the Union corpus; the multinomial classifier {args.halting_steps} more steps on the frozen "
        f"model. Likelihood oracle with λ = {args.depth_penalty} nats per layer. {len(prompts)} held-out prompts of "
        f"{args.prompt_length} bytes, {args.new_tokens} greedy bytes each; consistency = the fraction of generated "
        f"tokens equal to the full model's (full depth = {args.layers}).\n\n{table}\n\n"
        f"Teacher-forced held-out bits per byte at each exit:\n\n{bpb_table}\n"
    )
    write_results(args.name, {"args": vars(args), "points": points, "bits_per_byte": bpb}, markdown)
    print(markdown)


if __name__ == "__main__":
    main()
