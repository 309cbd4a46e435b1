"""How fast could any implementation of the sparse attention be? A lower bound for the training step.

For each family (Longformer, BigBird) at one length, one process builds transformers' model and ours on the same
weights (the config of `bench_sparse_attention.py`) and times, alternating call by call, one training step
(forward + backward of the mean squared output) of

- tf_family's model as shipped (the *dispatch*: the default ``attn_implementation="tff_native"``, the native kernel
  on tiles of at least `backend.NATIVE_MIN_ROWS` query rows, the PyTorch path below); which path each attention
  call of the step took is counted and reported;
- tf_family's model on its PyTorch path (``TF_FAMILY_NATIVE=0``: `masked_attention` instead of the native kernel);
- tf_family's model with its sparse attention kernel replaced by the identity on the values (every other op kept:
  projections, global attention, feed-forward, layer norms, dropout, embeddings, masks);
- transformers' model;
- tf_family's model with the native kernel on every tile (``NATIVE_MIN_ROWS = 1``);
- tf_family's and transformers' models under bf16 autocast (a model that fails there is reported as such);
- a dense encoder of the same width with PyTorch's SDPA (`bench_sparse_attention`'s ``dense_sdpa``: BERT, the same
  dropout), in float32 and under bf16 autocast: what the sparse pattern has to beat (up to ``--dense-max-length``
  tokens: its step is quadratic, about a minute at 16384 tokens here).

It then times the attention's matrix products alone at this machine's GEMM rate: six per layer (scores, weighted
sum, and four in the backward) at the exact sizes of the pattern -- for Longformer ``2w + 1`` keys per query (no
wasted score), for BigBird the ``3 + 2 + r`` key blocks of each middle query block plus the two global query blocks
against every key. ``floor = step with identity attention + products`` is what a kernel would cost if softmax,
masking and dropout were free and no score were wasted; ``transformers / floor`` bounds the speed-up any
implementation of the same attention, on the same linear algebra, can reach.

    python bench/bench_sparse_floor.py                             # 4096 tokens, 7 rounds: about 5 minutes
    python bench/bench_sparse_floor.py --lengths 16384 --rounds 3 --name sparse_floor_16384   # about 10 minutes

Reformer's floor (LSH and local attention) is measured by `bench_reformer.py`, whose training rows at
``--floor-lengths`` (default 4096 and 8192) have the same identity-attention + products floor:
``python bench/bench_reformer.py --lengths 8192 --floor-lengths 8192 --depths --name reformer_floor_8192``.
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


def _count_paths(step) -> dict[str, int]:
    """Run ``step`` once and count which function each attention call of the dispatch chose (``native``,
    ``masked``: the PyTorch path, ``sdpa``: PyTorch's SDPA), `backend.attention_backend`'s answer."""
    from collections import Counter

    from tf_family.attention import backend

    counts: Counter = Counter()
    real = backend.attention_backend

    def counting(*args, **kwargs):
        choice = real(*args, **kwargs)
        counts[choice] += 1
        return choice

    backend.attention_backend = counting
    try:
        step()
    finally:
        backend.attention_backend = real
    return dict(sorted(counts.items()))


def measure(family: str, length: int, rounds: int, folder: str, dense_max_length: int = 8192) -> dict:

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
            from tf_family.attention import backend

            setattr(module, kernel_name, attention)
            os.environ["TF_FAMILY_NATIVE"] = "1" if native == "force" else native
            rows = backend.NATIVE_MIN_ROWS
            backend.NATIVE_MIN_ROWS = 1 if native == "force" else rows  # the kernel on every tile
            try:
                step()
            finally:
                setattr(module, kernel_name, kernel)
                os.environ["TF_FAMILY_NATIVE"] = "1"
                backend.NATIVE_MIN_ROWS = rows

        return run

    steps = {
        "dispatch": step_of(ours, kernel),
        "native_forced": step_of(ours, kernel, native="force"),
        "pytorch_path": step_of(ours, kernel, native="0"),
        "identity": step_of(ours, _identity),
        "transformers": step_of(theirs, kernel),
        "dispatch_bf16": step_of(ours, kernel, bf16=True),
        "transformers_bf16": step_of(theirs, kernel, bf16=True),
    }
    failed = {}
    if length <= dense_max_length:
        dense = sparse._build("dense_sdpa", folder)
        dense_inputs = sparse._inputs("dense_sdpa", length)
        steps["dense_sdpa"] = step_of(dense, kernel, model_inputs=dense_inputs)
        steps["dense_sdpa_bf16"] = step_of(dense, kernel, bf16=True, model_inputs=dense_inputs)
    else:
        failed["dense_sdpa"] = failed["dense_sdpa_bf16"] = f"not run above --dense-max-length {dense_max_length}"
    for name in ("transformers_bf16", "dispatch_bf16", "dense_sdpa_bf16"):
        if name not in steps:
            continue
        try:
            steps[name]()
        except Exception as error:  # transformers' BigBird fails under bf16 autocast
            failed[name] = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:160]}"
            del steps[name]
    paths = {"dispatch": _count_paths(steps["dispatch"])}  # after the first call: calibrated by then
    if "dispatch_bf16" in steps:
        paths["dispatch_bf16"] = _count_paths(steps["dispatch_bf16"])
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
        "paths": paths,
        "family": family,
        "length": length,
        "times_s": times,
        "medians_s": medians,
        "products_per_layer_s": products,
        "products_s": products_s,
        "floor_s": floor,
        "speedup": medians["transformers"] / medians["dispatch"],
        "best_possible_speedup": medians["transformers"] / floor,
    }


def _paths_cell(counts: dict[str, int] | None) -> str:
    if not counts:
        return ""
    return ", ".join(f"{name} {count}" for name, count in counts.items())


def markdown(records: list[dict], rounds: int) -> str:
    fmt = common.format_seconds
    rows, bf16_rows = [], []
    for r in records:
        m = r["medians_s"]

        def cell(name, r=r, m=m):
            return fmt(m[name]) if name in m else f"{r['failed'].get(name, 'not run')}"

        rows.append([
            r["family"], r["length"], fmt(m["dispatch"]), fmt(m["native_forced"]), fmt(m["pytorch_path"]),
            f"{m['dispatch'] / min(m['native_forced'], m['pytorch_path']):.3f}", _paths_cell(r["paths"]["dispatch"]),
            fmt(m["identity"]), fmt(r["products_s"]), fmt(r["floor_s"]), f"{100 * r['floor_s'] / m['dispatch']:.0f} %",
            fmt(m["transformers"]), cell("dense_sdpa"), f"{r['speedup']:.2f}x", f"{r['best_possible_speedup']:.2f}x",
        ])  # fmt: skip
        bf16_rows.append([
            r["family"], r["length"], fmt(m["dispatch"]), cell("dispatch_bf16"),
            _paths_cell(r["paths"].get("dispatch_bf16")), cell("transformers_bf16"), cell("dense_sdpa"),
            cell("dense_sdpa_bf16"),
        ])  # fmt: skip
    headers = ["family", "tokens", "dispatch", "native kernel forced", "PyTorch path",
               "dispatch / faster of the two", "dispatch's calls", "identity-attention step", "attention products",
               "floor", "floor / dispatch", "transformers step", "dense SDPA step", "speed-up now",
               "best possible"]  # fmt: skip
    bf16_headers = ["family", "tokens", "dispatch fp32", "dispatch bf16", "dispatch's calls (bf16)",
                    "transformers bf16", "dense SDPA fp32", "dense SDPA bf16"]  # fmt: skip
    return (
        f"Training step (forward + backward), batch 1, medians of {rounds} interleaved rounds. dispatch = tf_family "
        "as shipped (attn_implementation='tff_native': the native kernel on tiles of >= 128 query rows, the PyTorch "
        "path below); native kernel forced = the kernel on every tile; PyTorch path = the native kernel "
        "off (TF_FAMILY_NATIVE=0); dispatch / faster of the two: 1.000 or less where the dispatch is never slower "
        "than the better fixed choice (identical choices differ only by the noise of the run); dispatch's calls = "
        "which function the attention calls of one step took (native kernel, masked = the PyTorch path, sdpa = "
        "PyTorch's SDPA). floor = the step with the sparse kernel replaced by the identity + the attention's six "
        "matrix products per layer at the exact pattern sizes; floor / dispatch = how close the step is to the "
        "floor (the issue's target is 90 %); best possible = transformers / floor. dense SDPA = a BERT encoder of "
        "the same width with PyTorch's SDPA, the same dropout.\n\n"
        + common.markdown_table(headers, rows)
        + "\n\nUnder bf16 autocast (`torch.autocast('cpu', dtype=torch.bfloat16)`), the same steps:\n\n"
        + common.markdown_table(bf16_headers, bf16_rows)
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", "--length", type=int, nargs="+", default=[4096])
    parser.add_argument(
        "--dense-max-length", type=int, default=8192, help="longest input of the dense SDPA rows (quadratic)"
    )
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
        for length in args.lengths:
            for family in args.families:
                record = measure(family, length, args.rounds, folder, args.dense_max_length)
                records.append(record)
                print(markdown([record], args.rounds).splitlines()[4], flush=True)
    json_path, md_path = common.write_results(
        args.name, {"args": vars(args), "records": records}, markdown(records, args.rounds)
    )
    print(f"wrote {json_path} and {md_path}")


if __name__ == "__main__":
    main()
