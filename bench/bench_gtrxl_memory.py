"""GTrXL against Transformer-XL on a memory task, over seeds: mean and seed-to-seed spread (issue 41, item 4).

The task (generated locally): every row of the batch is a stream of episodes. An episode is ``n`` segments long
(``n`` drawn from ``--episode_segments``); its first token is a cue (one of ``--cues`` ids), its last token a query
token, and the model must answer the query with the cue; every token in between is a random distractor. The cue
lies one or more segments before the query, so only the memory carries it. Episodes start on segment boundaries and
the memory of a row is reset there (``reset_mems``), as GTrXL resets at episode boundaries. The loss is the
cross-entropy of the answer only (the distractors are unpredictable).

Three models of the same size and hyper-parameters, each trained from ``--seeds`` seeds (model init and data both
seeded): Transformer-XL with its post-norm residuals (the canonical TrXL of the paper), with pre-norm residuals
(TrXL-I, "identity map reordering") and GTrXL (``gating="gru"``, GRU gates in place of the residuals). Reported:
answer accuracy on held-out streams at the end and during training (the mean and the spread over seeds), and the
first evaluation at which a seed reaches ``--solved`` accuracy.

    python bench/bench_gtrxl_memory.py --seeds 5 --steps 600
    python bench/bench_gtrxl_memory.py --quick   # a smoke run
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import markdown_table, setup_threads, write_results  # noqa: E402

MODELS = {
    "Transformer-XL (post-norm)": {"pre_lnorm": False},
    "TrXL-I (pre-norm)": {"pre_lnorm": True},
    "GTrXL (gating='gru')": {"pre_lnorm": True, "gating": "gru"},
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=600, help="optimizer steps (one per segment)")
    parser.add_argument("--eval_every", type=int, default=100)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--segment", type=int, default=16)
    parser.add_argument("--episode_segments", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--cues", type=int, default=8)
    parser.add_argument("--distractors", type=int, default=16)
    parser.add_argument("--d_model", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument(
        "--gate_bias", type=float, default=2.0, help="GTrXL's b_g (2 in the paper; 0: a fresh gate passes half)"
    )
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads (1 on a shared machine)")
    parser.add_argument("--solved", type=float, default=0.9, help="accuracy that counts as solved")
    parser.add_argument("--eval_segments", type=int, default=60, help="segments of held-out streams")
    parser.add_argument("--quick", action="store_true", help="2 seeds, 40 steps: a smoke run")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--name", default="gtrxl_memory")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.steps, args.eval_every, args.eval_segments = 2, 40, 20, 12
        args.name = f"{args.name}_quick"
    if max(args.episode_segments) < 2:
        parser.error("--episode_segments needs a value >= 2: the cue must lie in an earlier segment than the query")
    return args


def make_streams(args, rows: int, segments: int, generator):
    """``(rows, segments * S)`` tokens, ``(rows, segments * S)`` answers (-100 except at the queries) and
    ``(rows, segments)`` episode starts."""
    import torch

    cue_base, query = args.distractors, args.distractors + args.cues
    size = segments * args.segment
    tokens = torch.randint(0, args.distractors, (rows, size), generator=generator)
    labels = torch.full((rows, size), -100)
    starts = torch.zeros(rows, segments, dtype=torch.bool)
    choices = torch.tensor(args.episode_segments)
    for row in range(rows):
        segment = 0
        while segment < segments:
            length = int(choices[torch.randint(len(choices), (1,), generator=generator)])
            if segment + length > segments:
                break  # the tail of the stream stays distractors (no query: no loss)
            first, last = segment * args.segment, (segment + length) * args.segment - 1
            cue = cue_base + int(torch.randint(args.cues, (1,), generator=generator))
            tokens[row, first], tokens[row, last - 1] = cue, query
            labels[row, last - 1] = cue  # the logits at the query token predict the cue
            starts[row, segment] = True
            segment += length
    return tokens, labels, starts


def transfo_xl_config(args, vocab_size: int, mem_len: int, overrides: dict):
    """The small Transformer-XL that both GTrXL benches train (this one and `bench_gtrxl_rl.py`): width
    ``args.d_model``, ``args.heads`` heads, ``args.layers`` layers, segments of ``args.segment``, no dropout, with
    ``overrides`` (one of `MODELS`) and, for GTrXL, the gate bias ``args.gate_bias``."""
    from tf_family import TffTransfoXLConfig

    return TffTransfoXLConfig(
        vocab_size=vocab_size,
        cutoffs=[],
        div_val=1,
        d_model=args.d_model,
        d_embed=args.d_model,
        n_head=args.heads,
        d_head=args.d_model // args.heads,
        d_inner=4 * args.d_model,
        n_layer=args.layers,
        mem_len=mem_len,
        clamp_len=mem_len + args.segment,
        same_length=False,
        dropout=0.0,
        dropatt=0.0,
        **({"gate_bias": args.gate_bias} if overrides.get("gating") == "gru" else {}),
        **overrides,
    )


def build(args, seed: int, overrides: dict):
    import torch

    from tf_family import TffTransfoXLLMHeadModel

    torch.manual_seed(seed)
    mem_len = (max(args.episode_segments) - 1) * args.segment
    return TffTransfoXLLMHeadModel(transfo_xl_config(args, args.distractors + args.cues + 1, mem_len, overrides))


def segment_loss(model, tokens, labels, mems, reset):
    import torch.nn.functional as F

    out = model(tokens, mems=mems, reset_mems=reset)
    vocab = out.logits.shape[-1]
    answered = labels != -100
    if not answered.any():
        return None, out
    return F.nll_loss(out.logits[answered].reshape(-1, vocab), labels[answered]), out  # log-probabilities


def evaluate(model, stream, segment: int) -> float:
    import torch

    tokens, labels, starts = stream
    model.eval()
    correct = total = 0
    mems = None
    with torch.no_grad():
        for index in range(starts.shape[1]):
            span = slice(index * segment, (index + 1) * segment)
            out = model(tokens[:, span], mems=mems, reset_mems=starts[:, index])
            answered = labels[:, span] != -100
            correct += int((out.logits.argmax(-1)[answered] == labels[:, span][answered]).sum())
            total += int(answered.sum())
            mems = out.mems
    model.train()
    return correct / max(total, 1)


def train_one(args, seed: int, overrides: dict, held_out) -> dict:
    import torch

    model = build(args, seed, overrides)
    generator = torch.Generator().manual_seed(1000 + seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    model.train()
    curve, mems, times = [], None, []
    chunk = 50  # segments generated at a time (streams continue across chunks)
    stream, position = make_streams(args, args.batch, chunk, generator), 0
    for step in range(1, args.steps + 1):
        if position == chunk:
            stream, position, mems = make_streams(args, args.batch, chunk, generator), 0, None
        tokens, labels, starts = stream
        span = slice(position * args.segment, (position + 1) * args.segment)
        start = time.perf_counter()
        loss, out = segment_loss(model, tokens[:, span], labels[:, span], mems, starts[:, position])
        if loss is not None:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
        mems, position = out.mems, position + 1
        if step % args.eval_every == 0 or step == args.steps:
            curve.append((step, evaluate(model, held_out, args.segment)))
    solved = next((step for step, accuracy in curve if accuracy >= args.solved), None)
    return {
        "seed": seed,
        "curve": curve,
        "final": curve[-1][1],
        "solved_at": solved,
        "step_s": statistics.median(times),
    }


def main(argv=None) -> None:
    args = parse_args(argv)
    setup_threads(args.threads)
    import torch

    held_out = make_streams(args, 64, args.eval_segments, torch.Generator().manual_seed(12345))
    results = {name: [] for name in args.models}
    for seed in range(args.seeds):  # interleaved: every model's seed s before seed s + 1
        for name in args.models:
            run = train_one(args, seed, MODELS[name], held_out)
            results[name].append(run)
            print(f"{name} seed {seed}: final accuracy {run['final']:.3f}, solved at {run['solved_at']}", flush=True)

    chance = 1 / args.cues
    rows = []
    for name, runs in results.items():
        finals = [run["final"] for run in runs]
        solved = [run["solved_at"] for run in runs if run["solved_at"] is not None]
        rows.append(
            [
                name,
                f"{statistics.mean(finals):.3f}",
                f"{statistics.stdev(finals):.3f}" if len(finals) > 1 else "-",
                f"{min(finals):.3f} / {max(finals):.3f}",
                f"{len(solved)}/{len(runs)}",
                f"{statistics.median(solved):.0f}" if solved else "-",
                f"{1000 * statistics.median(run['step_s'] for run in runs):.0f} ms",
            ]
        )
    table = markdown_table(
        [
            "model",
            "final accuracy (mean)",
            "std over seeds",
            "min / max",
            f"seeds reaching {args.solved:.0%}",
            "median step solved",
            "step time",
        ],
        rows,
    )
    curves = markdown_table(
        ["model", *[f"step {step}" for step, _ in results[args.models[0]][0]["curve"]]],
        [
            [
                name,
                *[
                    f"{statistics.mean(run['curve'][i][1] for run in runs):.2f} ± "
                    f"{statistics.pstdev(run['curve'][i][1] for run in runs):.2f}"
                    for i in range(len(runs[0]["curve"]))
                ],
            ]
            for name, runs in results.items()
        ],
    )
    markdown = (
        f"# GTrXL vs Transformer-XL on a memory task ({args.seeds} seeds, {args.steps} steps)\n\n"
        f"Recall a cue from {min(args.episode_segments) - 1}-{max(args.episode_segments) - 1} segments back "
        f"(segment {args.segment} tokens, memory {(max(args.episode_segments) - 1) * args.segment}), "
        f"{args.cues} cues: chance {chance:.3f}. Width {args.d_model}, {args.layers} layers, {args.heads} heads, "
        f"AdamW lr {args.lr}, batch {args.batch}, GTrXL gate bias b_g {args.gate_bias}, the same seeds for every "
        f"model.\n\n"
        f"{table}\n\nHeld-out accuracy during training (mean ± population std over seeds):\n\n{curves}\n"
    )
    payload = {"args": vars(args), "chance": chance, "results": results}
    json_path, md_path = write_results(args.name, payload, markdown)
    print(markdown)
    print(f"wrote {json_path} and {md_path}")


if __name__ == "__main__":
    main()
