"""tf_family Transformer-XL against transformers 4.35.2's TransfoXL on the same weights: eval and training speed.

transformers 5 removed TransfoXL, so its last runnable version lives in its own virtual environment:

    python3 -m venv .venvs/tf4 && .venvs/tf4/bin/pip install torch==2.13.0 \
        && .venvs/tf4/bin/pip install transformers==4.35.2 "numpy<2" "torch==2.13.0"
    .venv/bin/python bench/bench_transfo_xl_vs_4x.py --tf4-python .venvs/tf4/bin/python

A 4.35.2 worker builds a random model of the size used in the project's peer baselines (d_model 256, 4 layers,
4 heads x 64, d_inner 1024, vocabulary 32000 with a plain tied softmax) and saves it in the 4.x format; tf_family
loads that folder through `AutoModelForCausalLM` (the legacy ``transfo-xl`` path), so both sides run identical
weights. Every measurement runs in a fresh subprocess:

- eval: a random 4096-token stream, batch 1, segments of 128 tokens with ``mem_len=128`` carried, every segment
  scored with ``labels=``; both start from 4.x's zero memory so the summed losses must agree;
- train: batch 8, segments of 128, ``mem_len=128`` carried between steps, forward + backward + AdamW step,
  dropout 0.1 (two warm-up steps fill the memory).

tf_family runs with its default SDPA attention and with eager attention.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

CONFIG = dict(  # noqa: C408  (keyword form reads like the config)
    vocab_size=32000, cutoffs=[], div_val=1, d_model=256, d_embed=256, n_head=4, d_head=64, d_inner=1024, n_layer=4,
    mem_len=128, clamp_len=1000, same_length=False, dropout=0.1, dropatt=0.0,
)  # fmt: skip
TGT_LEN, EVAL_TOKENS, TRAIN_BATCH = 128, 4096, 8
RESULT_TAG = "RESULT_JSON "


# ------------------------------------------------------------------------------------------------------- workers
def _load(side: str, folder: str):
    import torch

    if side == "tf4":
        from transformers import TransfoXLLMHeadModel

        return TransfoXLLMHeadModel.from_pretrained(folder), torch
    from transformers import AutoModelForCausalLM

    import tf_family  # noqa: F401

    implementation = "eager" if side == "tff_eager" else "sdpa"
    return AutoModelForCausalLM.from_pretrained(folder, attn_implementation=implementation), torch


def worker_make(folder: str) -> dict:
    import torch
    from transformers import TransfoXLConfig, TransfoXLLMHeadModel

    torch.manual_seed(0)
    model = TransfoXLLMHeadModel(TransfoXLConfig(**CONFIG))
    model.save_pretrained(folder)
    return {"parameters": sum(p.numel() for p in model.parameters())}


def _zero_memory(side: str, torch, batch: int):
    if side == "tf4":
        return None  # 4.x turns mems=None into mem_len zero vectors per layer
    from tf_family import SegmentMemory

    states = [torch.zeros(batch, CONFIG["mem_len"], CONFIG["d_model"]) for _ in range(CONFIG["n_layer"])]
    return SegmentMemory.from_states(states)


def worker_eval(side: str, folder: str) -> dict:
    model, torch = _load(side, folder)
    model.eval()
    data = torch.randint(0, CONFIG["vocab_size"], (1, EVAL_TOKENS), generator=torch.Generator().manual_seed(1))
    result = {}

    def run():
        mems, total = _zero_memory(side, torch, 1), 0.0
        with torch.no_grad():
            for start in range(0, EVAL_TOKENS, TGT_LEN):
                segment = data[:, start : start + TGT_LEN]
                out = model(input_ids=segment, labels=segment, mems=mems)
                mems = out.mems
                total += float(out.losses.sum())
        result["summed_loss"] = total

    timing = common.time_callable(run)
    if side != "tf4":  # the output layer's product measured both ways (tf_family.layers.adaptive_kernels.measure)
        from tf_family.layers import adaptive_kernels

        hidden = torch.randn(TGT_LEN, CONFIG["d_model"])
        weight = torch.randn(CONFIG["vocab_size"], CONFIG["d_model"])
        result["output_product"] = adaptive_kernels.measure([(hidden, weight, torch.randn(CONFIG["vocab_size"]))])
    return {**timing.to_dict(), **result, "tokens_per_s": EVAL_TOKENS / timing.median_s}


def worker_train(side: str, folder: str) -> dict:
    model, torch = _load(side, folder)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(2)
    state = {"mems": None}

    def step():
        batch = torch.randint(0, CONFIG["vocab_size"], (TRAIN_BATCH, TGT_LEN), generator=generator)
        out = model(input_ids=batch, labels=batch, mems=state["mems"])
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        state["mems"] = out.mems

    for _ in range(2):
        step()
    timing = common.time_callable(step)
    return {**timing.to_dict(), "tokens_per_s": TRAIN_BATCH * TGT_LEN / timing.median_s}


# ---------------------------------------------------------------------------------------------------------- driver
def _pooled(records: list[dict]) -> dict:
    """One side's rounds as one record: every repeat's time pooled, their median and min."""
    import statistics

    times = [time for record in records for time in record["times_s"]]
    pooled = {**records[0], "times_s": times, "median_s": statistics.median(times), "min_s": min(times)}
    pooled["tokens_per_s"] = records[0]["tokens_per_s"] * records[0]["median_s"] / pooled["median_s"]
    return pooled


def run_worker(python: str, *args: str) -> dict:
    # tf_family's side imports this checkout (not an installed copy); the 4.35.2 side sees nothing of it
    pythonpath = str(Path(__file__).resolve().parent.parent) if python == sys.executable else ""
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "PYTHONPATH": pythonpath}
    proc = subprocess.run([python, __file__, "--worker", *args], capture_output=True, text=True, env=env, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG) :])
    raise RuntimeError(f"worker {args} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tf4-python", default=".venvs/tf4/bin/python", help="python of a transformers 4.35.2 venv")
    parser.add_argument(
        "--rounds", type=int, default=1, help="repeat every worker this many times, interleaved (a loaded machine)"
    )
    parser.add_argument("--modes", default="eval,train", help="comma-separated: eval, train")
    parser.add_argument("--name", default="transfo_xl_vs_4x")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    common.setup_threads()
    if args.worker:
        kind, *rest = args.worker
        result = worker_make(*rest) if kind == "make" else {"eval": worker_eval, "train": worker_train}[kind](*rest)
        print(RESULT_TAG + json.dumps({**result, "allocator": common.allocator()}))
        return
    if not Path(args.tf4_python).exists():
        raise SystemExit(f"--tf4-python {args.tf4_python} does not exist; create the venv as the docstring shows.")
    sides = {"tf4": args.tf4_python, "tff_sdpa": sys.executable, "tff_eager": sys.executable}
    with tempfile.TemporaryDirectory() as folder:
        made = run_worker(args.tf4_python, "make", folder)
        modes = [mode.strip() for mode in args.modes.split(",") if mode.strip()]
        rounds: dict = {mode: {side: [] for side in sides} for mode in modes}
        for round_index in range(args.rounds):  # the side order alternates from round to round
            for mode in modes:
                order = list(sides) if round_index % 2 == 0 else list(reversed(sides))
                for side in order:
                    rounds[mode][side].append(run_worker(sides[side], mode, side, folder))
        results = {
            mode: {side: _pooled(records) for side, records in by_side.items()} for mode, by_side in rounds.items()
        }
    names = {"tf4": "transformers 4.35.2 TransfoXL", "tff_sdpa": "tf_family (sdpa)", "tff_eager": "tf_family (eager)"}
    rows = []
    for mode, by_side in results.items():
        base = by_side["tf4"]["median_s"]
        for side, record in by_side.items():
            loss = f"{record['summed_loss']:.4f}" if "summed_loss" in record else ""
            rows.append([mode, names[side], f"{common.format_seconds(record['median_s'])} "
                         f"({common.format_seconds(record['min_s'])})", f"{record['tokens_per_s']:,.0f}",
                         f"{base / record['median_s']:.2f}x", loss])  # fmt: skip
    markdown = (
        f"Transformer-XL, {made['parameters']:,} parameters (d_model 256, 4 layers, vocab 32000, plain tied softmax), "
        f"identical weights on both sides. eval: {EVAL_TOKENS} tokens, batch 1, segments of {TGT_LEN}, mem_len "
        f"{CONFIG['mem_len']}, no_grad. train: batch {TRAIN_BATCH} x {TGT_LEN}, fwd + bwd + AdamW, memory carried. "
        f"speed-up = 4.35.2 median / this row's median. {args.rounds} round(s) of fresh workers, the sides "
        "interleaved; the times of all rounds pooled.\n\n"
        + common.markdown_table(
            ["mode", "implementation", "time median (min)", "tokens/s", "speed-up", "summed eval loss"], rows
        )
    )
    products = [  # the output layer's (128, 256) x (256, 32000) product, measured both ways in each tf_family worker
        f"{names[side]}: {'oneDNN' if d['onednn_faster'] else 'F.linear'} ({d['onednn_s'] * 1000:.1f} ms against "
        f"{d['aten_s'] * 1000:.1f} ms)"
        for side in ("tff_sdpa", "tff_eager")
        for record in rounds.get("eval", {}).get(side, [])
        for d in record.get("output_product", [])
    ]
    if products:
        markdown += (
            "\n\nOutput layer's product, faster path as each worker measured it (oneDNN against F.linear, fastest of "
            "5; `tf_family.layers.adaptive_kernels.measure`; the rule takes oneDNN at this size): "
            + "; ".join(products)
            + "."
        )
    common.write_results(args.name, {"config": CONFIG, "rounds": rounds, "results": results}, markdown)
    print(markdown)


if __name__ == "__main__":
    main()
