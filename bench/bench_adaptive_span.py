"""Adaptive Attention Span (Sukhbaatar et al. 2019) against a fixed span, character-level, on the bundled corpus.

Two Transformer-XL models of the same size train on the same byte streams of the bundled State of the Union corpus
(`tf_family.data`, ``sotu``; the last 5 % of the addresses held out), reading contiguous segments and carrying their
memory from step to step:

* ``fixed``: every head attends over the whole memory (``mem_len = S``);
* ``adaptive``: ``adaptive_span=True`` with the largest span ``S`` (``adaptive_span_max = mem_len = S``), the ramp
  ``R`` and the span penalty; the memory read and kept is trimmed to the learned spans.

Reported: validation bits per character (every byte of the held-out streams scored, memory carried), the learned
mean span per layer (and its largest head) against ``S``, the memory slots each layer reads at the end, the median
training step time of the last half of the steps (when the spans have settled), and, measured after training on one
segment with the memory of the one before, the cost of a training step (forward and backward): its median time and
the bytes autograd saves for the backward pass (the activation memory; distinct storages counted once, the weights
included). For the adaptive model that cost is measured twice: with the banded in-segment attention (queries in
chunks, each reading only the keys within the widest learned span behind it; the default) and with its dense twin
(every query against the whole segment and the trimmed memory).

    python bench/bench_adaptive_span.py            # the full run (see --help for its size)
    python bench/bench_adaptive_span.py --quick    # a dry run of a few steps, to check the script
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
from common import markdown_table, setup_threads, write_results  # noqa: E402

setup_threads(2)

import torch  # noqa: E402  (after setup_threads: OpenMP reads OMP_WAIT_POLICY when torch loads)
import torch.nn.functional as F  # noqa: E402

from tf_family import TffTransfoXLConfig, TffTransfoXLLMHeadModel  # noqa: E402
from tf_family.data import load_text_datasets  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--streams", type=int, default=8, help="batch rows, each a contiguous stream")
    parser.add_argument("--segment", type=int, default=64, help="T: bytes per segment")
    parser.add_argument("--max_span", type=int, default=512, help="S: mem_len and adaptive_span_max")
    parser.add_argument("--ramp", type=int, default=32, help="R")
    parser.add_argument("--span_loss", type=float, default=2e-5, help="adaptive_span_loss")
    parser.add_argument("--round", type=int, default=64, help="adaptive_span_round")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d_model", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--eval_bytes", type=int, default=32768, help="held-out bytes scored (per run)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default=None, help="results/<name>.{json,md} (default adaptive_span[_quick])")
    parser.add_argument("--quick", action="store_true", help="a dry run: a few steps of a smaller model")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.max_span, args.segment, args.eval_bytes, args.round = 30, 128, 32, 2048, 16
        args.ramp, args.layers, args.d_model = 16, 2, 64
    return args


def byte_streams(text: str, streams: int) -> torch.Tensor:
    """``(streams, N)`` bytes: the text cut into ``streams`` contiguous pieces."""
    data = torch.tensor(list(text.encode("utf-8")), dtype=torch.long)
    length = data.numel() // streams
    return data[: streams * length].view(streams, length)


def build(args, adaptive: bool) -> TffTransfoXLLMHeadModel:
    torch.manual_seed(args.seed)
    config = TffTransfoXLConfig(
        vocab_size=256,
        cutoffs=[],
        div_val=1,
        d_model=args.d_model,
        n_head=args.heads,
        d_head=args.d_model // args.heads,
        d_inner=4 * args.d_model,
        n_layer=args.layers,
        mem_len=args.max_span,
        clamp_len=args.max_span + args.segment,
        same_length=False,
        pre_lnorm=True,  # post-LN trains slowly at this size (bench_transfo_xl_memory.py)
        dropout=0.0,
        adaptive_span=adaptive,
        adaptive_span_ramp=args.ramp,
        adaptive_span_loss=args.span_loss,
        adaptive_span_round=args.round,
    )
    return TffTransfoXLLMHeadModel(config)


def train(model, data: torch.Tensor, args) -> list[float]:
    """Contiguous segments of every stream, memory carried; AdamW with warm-up then cosine. Returns step times."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    warmup = max(1, args.steps // 20)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, args.steps - warmup)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    model.train()
    mems, position, times = None, 0, []
    for _ in range(args.steps):
        if position + args.segment + 1 > data.shape[1]:
            mems, position = None, 0  # back to the start of the streams
        inputs = data[:, position : position + args.segment]  # (B, T)
        targets = data[:, position + 1 : position + args.segment + 1]  # (B, T): the next bytes
        start = time.perf_counter()
        out = model(inputs, mems=mems)
        loss = F.nll_loss(out.logits.reshape(-1, 256), targets.reshape(-1))  # logits are log-probabilities
        if out.span_loss is not None:
            loss = loss + out.span_loss  # the penalty, as the model adds it with labels
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
        mems, position = out.mems, position + args.segment
    return times


def step_cost(model, data: torch.Tensor, args, repeats: int = 3) -> tuple[float, float]:
    """``(median seconds, MiB saved for backward)`` of a training step on the second segment of ``data``, the first
    one's memory carried. Saved tensors are counted by storage (a view of a kept tensor costs nothing more)."""
    model.train()
    with torch.no_grad():
        mems = model(data[:, : args.segment]).mems
    inputs = data[:, args.segment : 2 * args.segment]
    targets = data[:, args.segment + 1 : 2 * args.segment + 1]
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    times = []
    for _ in range(repeats):
        storages.clear()
        start = time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            out = model(inputs, mems=mems)
            loss = F.nll_loss(out.logits.reshape(-1, 256), targets.reshape(-1))
        loss.backward()
        times.append(time.perf_counter() - start)
        model.zero_grad(set_to_none=True)
    return statistics.median(times), sum(storages.values()) / 2**20


def set_banded(model, banded: bool | None) -> None:
    """None: each adaptive-span attention chooses (banded where it reads fewer keys); False: the dense twin."""
    for layer in model.transformer.layers:
        if hasattr(layer.attention, "banded"):
            layer.attention.banded = banded


@torch.no_grad()
def bits_per_character(model, data: torch.Tensor, args) -> float:
    """Every next byte of the streams scored, segment after segment, the memory carried."""
    model.eval()
    total, count, mems = 0.0, 0, None
    for position in range(0, data.shape[1] - 1, args.segment):
        inputs = data[:, position : position + args.segment]
        targets = data[:, position + 1 : position + args.segment + 1]
        out = model(inputs[:, : targets.shape[1]], mems=mems)
        total += float(F.nll_loss(out.logits.reshape(-1, 256), targets.reshape(-1), reduction="sum"))
        count += targets.numel()
        mems = out.mems
    return total / count / math.log(2)


def main(argv=None) -> None:
    args = parse_args(argv)
    datasets, column = load_text_datasets("sotu")
    train_text = "\n".join(datasets["train"][column])
    valid_text = "\n".join(datasets["validation"][column])
    train_data = byte_streams(train_text, args.streams)
    valid_data = byte_streams(valid_text, args.streams)[:, : args.eval_bytes // args.streams]
    rows, payload = [], {"args": vars(args), "runs": {}}
    for name in ("fixed", "adaptive"):
        model = build(args, adaptive=name == "adaptive")
        times = train(model, train_data, args)
        bpc = bits_per_character(model, valid_data, args)
        step = statistics.median(times[len(times) // 2 :])
        spans = [span.spans().detach() for span in model.transformer.adaptive_spans()]
        if spans:
            reads = [min(args.max_span, limit) for limit in model.transformer._span_limits()]
            per_layer = ", ".join(f"{float(s.mean()):.0f} (max {float(s.max()):.0f})" for s in spans)
        else:
            reads, per_layer = [args.max_span] * args.layers, "-"
        costs = {"": step_cost(model, train_data, args)}
        if spans:
            set_banded(model, False)
            costs[" (dense twin)"] = step_cost(model, train_data, args)
            set_banded(model, None)
        for label, (seconds, mebibytes) in costs.items():
            rows.append(
                [
                    name + label,
                    f"{bpc:.3f}",
                    per_layer,
                    ", ".join(map(str, reads)),
                    f"{step * 1000:.0f} ms" if not label else "-",
                    f"{seconds * 1000:.0f} ms",
                    f"{mebibytes:.0f} MiB",
                ]
            )
        payload["runs"][name] = {
            "bpc": bpc,
            "spans": [s.tolist() for s in spans],
            "memory_read": reads,
            "median_step_s": step,
            "step_cost": {label.strip(" ()") or "default": list(cost) for label, cost in costs.items()},
        }
    table = markdown_table(
        [
            "model",
            "valid bpc",
            f"mean span per layer (of S = {args.max_span})",
            "memory slots read",
            "training step",
            "measured step",
            "saved for backward",
        ],
        rows,
    )
    heading = (
        f"# Adaptive span vs fixed span (bundled sotu corpus, bytes)\n\n{args.steps} steps of {args.streams} "
        f"streams x {args.segment} bytes, {args.layers} layers, d_model {args.d_model}, {args.heads} heads, "
        f"R = {args.ramp}, adaptive_span_loss = {args.span_loss}, rounded to {args.round}; step: median of the last "
        "half; measured step and saved for backward: one training step after training (see the module docstring).\n\n"
    )
    name = args.name or ("adaptive_span_quick" if args.quick else "adaptive_span")
    json_path, md_path = write_results(name, payload, heading + table)
    sys.stdout.write(heading + table + f"\n\nwrote {md_path} and {json_path}\n")


if __name__ == "__main__":
    main()
