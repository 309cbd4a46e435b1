"""How fast could any implementation of the sparse attention be? A lower bound for the training step.

For each family (Longformer, BigBird) at one length, one process builds transformers' model and ours on the same
weights (the config of `bench_sparse_attention.py`) and times, alternating call by call, one training step
(forward + backward of the mean squared output) of

- tf_family's model;
- tf_family's model on its PyTorch path (``TF_FAMILY_NATIVE=0``: `masked_attention` instead of the native kernel);
- tf_family's model with its sparse attention kernel replaced by the identity on the values (every other op kept:
  projections, global attention, feed-forward, layer norms, dropout, embeddings, masks);
- transformers' model.

It then times the attention's matrix products alone at this machine's GEMM rate: six per layer (scores, weighted
sum, and four in the backward) at the exact sizes of the pattern -- for Longformer ``2w + 1`` keys per query (no
wasted score), for BigBird the ``3 + 2 + r`` key blocks of each middle query block plus the two global query blocks
against every key. ``floor = step with identity attention + products`` is what a kernel would cost if softmax,
masking and dropout were free and no score were wasted; ``transformers / floor`` bounds the speed-up any
implementation of the same attention, on the same linear algebra, can reach.

    .venv/bin/python bench/bench_sparse_floor.py                  # 4096 tokens, 7 rounds: about 3 minutes
    .venv/bin/python bench/bench_sparse_floor.py --length 8192
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's tf_family, not an installed one
import common  # noqa: E402


def _identity(query, key, value, *args, **kwargs):
    """Stands in for a sparse kernel: returns the values; query and key stay in the graph (two cheap sums)."""
    return value + 0 * (query.sum() + key.sum())


def _median_time(fn, calls: int = 10, rounds: int = 5) -> float:
    fn()
    fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)


def _product_time(batch: int, rows: int, cols: int, inner: int) -> float:
    """One ``(batch, rows, inner) @ (batch, inner, cols)`` product, computed in slabs of at most 8 MiB of output
    (fresh larger buffers are page-faulted in on every call on this machine, see `tf_family.attention.block_sparse`)."""
    import torch

    per_slab = max(1, (8 * 2**20) // (rows * cols * 4))
    left = torch.randn(min(batch, per_slab), rows, inner)
    right = torch.randn(min(batch, per_slab), inner, cols)
    slabs, rest = divmod(batch, per_slab)
    full = _median_time(lambda: torch.bmm(left, right))
    tail = _median_time(lambda: torch.bmm(left[:rest], right[:rest])) if rest else 0.0
    return slabs * full + tail


def measure(family: str, length: int, rounds: int, folder: str) -> dict:

    import bench_sparse_attention as sparse

    ours, theirs = sparse._build(f"tff_{family}", folder), sparse._build(f"hf_{family}", folder)
    if family == "longformer":
        import tf_family.models.longformer.modeling_longformer as module

        kernel_name = "sliding_window_attention"
    else:
        import tf_family.models.big_bird.modeling_big_bird as module

        kernel_name = "block_sparse_attention"
    kernel = getattr(module, kernel_name)
    inputs = sparse._inputs(f"tff_{family}", length)

    def step_of(model, attention, native="1"):
        step = sparse._step(model, inputs, "train")

        def run():
            setattr(module, kernel_name, attention)
            os.environ["TF_FAMILY_NATIVE"] = native
            try:
                step()
            finally:
                setattr(module, kernel_name, kernel)
                os.environ["TF_FAMILY_NATIVE"] = "1"

        return run

    steps = {
        "tf_family": step_of(ours, kernel),
        "pytorch_path": step_of(ours, kernel, native="0"),
        "identity": step_of(ours, _identity),
        "transformers": step_of(theirs, kernel),
    }
    times = common.time_interleaved(steps, rounds)

    body = sparse.BODY
    heads, layers = body["num_attention_heads"], body["num_hidden_layers"]
    head_dim = body["hidden_size"] // heads
    if family == "longformer":
        keys = 256 + 1  # window 256: 128 per side plus the query itself
        per_layer = _product_time(heads * length // 64, 64, keys, head_dim)  # 64 queries at a time
        products = {"window (2w + 1 keys per query)": per_layer}
    else:
        block, slots = 64, 3 + 2 + 3
        middle = length // block - 2
        products = {
            "middle blocks (8 key blocks each)": _product_time(heads * middle, block, slots * block, head_dim),
            "global blocks (every key)": _product_time(heads, 2 * block, length, head_dim),
        }
    # six products per layer of the same size class: QK^T, PV, and dV, dP, dQ, dK in the backward
    products_s = 6 * layers * sum(products.values())
    medians = {name: statistics.median(values) for name, values in times.items()}
    floor = medians["identity"] + products_s
    return {
        "family": family,
        "length": length,
        "times_s": times,
        "medians_s": medians,
        "products_per_layer_s": products,
        "products_s": products_s,
        "floor_s": floor,
        "speedup": medians["transformers"] / medians["tf_family"],
        "best_possible_speedup": medians["transformers"] / floor,
    }


def markdown(records: list[dict], rounds: int) -> str:
    rows = []
    for r in records:
        m = r["medians_s"]
        rows.append([
            r["family"], r["length"], common.format_seconds(m["tf_family"]), common.format_seconds(m["pytorch_path"]),
            common.format_seconds(m["identity"]),
            common.format_seconds(r["products_s"]), common.format_seconds(r["floor_s"]),
            common.format_seconds(m["transformers"]), f"{r['speedup']:.2f}x", f"{r['best_possible_speedup']:.2f}x",
        ])  # fmt: skip
    headers = ["family", "tokens", "tf_family step", "PyTorch path step", "identity-attention step", "attention products", "floor",
               "transformers step", "speed-up now", "best possible"]  # fmt: skip
    return (
        f"Training step (forward + backward), batch 1, medians of {rounds} interleaved rounds. PyTorch path = "
        "tf_family with its native attention kernel off (TF_FAMILY_NATIVE=0). floor = the step with "
        "the sparse kernel replaced by the identity + the attention's six matrix products per layer at the exact "
        "pattern sizes; best possible = transformers / floor.\n\n" + common.markdown_table(headers, rows)
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument(
        "--families", nargs="+", default=["longformer", "big_bird"], choices=["longformer", "big_bird"]
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--name", default="sparse_floor")
    args = parser.parse_args(argv)
    common.setup_threads()
    records = []
    import bench_sparse_attention as sparse

    with tempfile.TemporaryDirectory() as folder:
        sparse.make_checkpoints(folder)
        for family in args.families:
            record = measure(family, args.length, args.rounds, folder)
            records.append(record)
            print(markdown([record], args.rounds).splitlines()[-1], flush=True)
    json_path, md_path = common.write_results(
        args.name, {"args": vars(args), "records": records}, markdown(records, args.rounds)
    )
    print(f"wrote {json_path} and {md_path}")


if __name__ == "__main__":
    main()
