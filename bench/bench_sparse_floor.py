"""How fast could any implementation of the sparse attention be? A lower bound for the training step.

For each family (Longformer, BigBird) at one length, one process builds transformers' model and ours on the same
weights (the config of `bench_sparse_attention.py`) and times, alternating call by call, one training step
(forward + backward of the mean squared output) of

- tf_family's model;
- tf_family's model on its PyTorch path (``TF_FAMILY_NATIVE=0``: `masked_attention` instead of the native kernel);
- tf_family's model with its sparse attention kernel replaced by the identity on the values (every other op kept:
  projections, global attention, feed-forward, layer norms, dropout, embeddings, masks);
- transformers' model;
- tf_family's model with the native kernel forced wherever it runs (``TF_FAMILY_NATIVE=force``: what the dispatch
  would do without its calibration, `tf_family.attention.native.faster_than_pytorch`);
- tf_family's and transformers' models under bf16 autocast (a model that fails there is reported as such);
- a dense encoder of the same width with PyTorch's SDPA (`bench_sparse_attention`'s ``dense_sdpa``: BERT, the same
  dropout), in float32 and under bf16 autocast: what the sparse pattern has to beat.

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


def _calibration() -> dict:
    """The native kernel's calibration so far (shape -> both paths' times and the decision)."""
    from tf_family.attention import native

    return native._load_calibration() if native.extension() is not None else {}


def measure(family: str, length: int, rounds: int, folder: str) -> dict:

    import bench_sparse_attention as sparse
    import torch

    ours, theirs = sparse._build(f"tff_{family}", folder), sparse._build(f"hf_{family}", folder)
    if family == "longformer":
        import tf_family.models.longformer.modeling_longformer as module

        kernel_name = "sliding_window_attention"
    else:
        import tf_family.models.big_bird.modeling_big_bird as module

        kernel_name = "block_sparse_attention"
    kernel = getattr(module, kernel_name)
    inputs = sparse._inputs(f"tff_{family}", length)

    def step_of(model, attention, native="1", bf16=False, model_inputs=None):
        step = sparse._step(model, model_inputs or inputs, "train")
        if bf16:
            plain = step

            def step():
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    plain()

        def run():
            setattr(module, kernel_name, attention)
            os.environ["TF_FAMILY_NATIVE"] = native
            try:
                step()
            finally:
                setattr(module, kernel_name, kernel)
                os.environ["TF_FAMILY_NATIVE"] = "1"

        return run

    dense = sparse._build("dense_sdpa", folder)
    dense_inputs = sparse._inputs("dense_sdpa", length)
    steps = {
        "tf_family": step_of(ours, kernel),
        "native_forced": step_of(ours, kernel, native="force"),
        "pytorch_path": step_of(ours, kernel, native="0"),
        "identity": step_of(ours, _identity),
        "transformers": step_of(theirs, kernel),
        "dense_sdpa": step_of(dense, kernel, model_inputs=dense_inputs),
        "tf_family_bf16": step_of(ours, kernel, bf16=True),
        "transformers_bf16": step_of(theirs, kernel, bf16=True),
        "dense_sdpa_bf16": step_of(dense, kernel, bf16=True, model_inputs=dense_inputs),
    }
    failed = {}
    for name in ("transformers_bf16", "tf_family_bf16", "dense_sdpa_bf16"):
        try:
            steps[name]()
        except Exception as error:  # transformers' BigBird fails under bf16 autocast
            failed[name] = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:160]}"
            del steps[name]
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
        "failed": failed,
        "calibration": _calibration(),
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
    fmt = common.format_seconds
    rows, bf16_rows = [], []
    for r in records:
        m = r["medians_s"]
        rows.append([
            r["family"], r["length"], fmt(m["tf_family"]), fmt(m["native_forced"]), fmt(m["pytorch_path"]),
            fmt(m["identity"]), fmt(r["products_s"]), fmt(r["floor_s"]), f"{100 * r['floor_s'] / m['tf_family']:.0f} %",
            fmt(m["transformers"]), fmt(m["dense_sdpa"]), f"{r['speedup']:.2f}x", f"{r['best_possible_speedup']:.2f}x",
        ])  # fmt: skip

        def cell(name, r=r, m=m):
            return fmt(m[name]) if name in m else f"fails ({r['failed'].get(name, 'not run')})"

        bf16_rows.append([
            r["family"], r["length"], fmt(m["tf_family"]), cell("tf_family_bf16"), cell("transformers_bf16"),
            fmt(m["dense_sdpa"]), cell("dense_sdpa_bf16"),
        ])  # fmt: skip
    headers = ["family", "tokens", "tf_family step", "native kernel forced", "PyTorch path step",
               "identity-attention step", "attention products", "floor", "floor / tf_family",
               "transformers step", "dense SDPA step", "speed-up now", "best possible"]  # fmt: skip
    bf16_headers = ["family", "tokens", "tf_family fp32", "tf_family bf16", "transformers bf16", "dense SDPA fp32",
                    "dense SDPA bf16"]  # fmt: skip
    return (
        f"Training step (forward + backward), batch 1, medians of {rounds} interleaved rounds. tf_family step = the "
        "dispatch as shipped (the native kernel where its calibration measured it faster than the PyTorch path); "
        "native kernel forced = TF_FAMILY_NATIVE=force; PyTorch path = the native kernel off (TF_FAMILY_NATIVE=0). "
        "floor = the step with the sparse kernel replaced by the identity + the attention's six matrix products per "
        "layer at the exact pattern sizes; floor / tf_family = how close the step is to the floor (the issue's target "
        "is 90 %); best possible = transformers / floor. dense SDPA = a BERT encoder of the same width with "
        "PyTorch's SDPA, the same dropout.\n\n"
        + common.markdown_table(headers, rows)
        + "\n\nUnder bf16 autocast (`torch.autocast('cpu', dtype=torch.bfloat16)`), the same steps:\n\n"
        + common.markdown_table(bf16_headers, bf16_rows)
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
