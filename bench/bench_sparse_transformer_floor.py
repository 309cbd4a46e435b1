"""How close is the Sparse Transformer's efficient path to its floor? A lower bound for its training step.

One causal LM per pattern (``strided``, ``fixed``; heads split between the two factors) at one length, and the same
model with dense causal attention (``local_1d`` with one causal block of the whole length: every earlier position),
timed alternately, call by call, for one training step (forward + backward of the LM loss):

- the model as shipped (`tf_family.attention.factorized.factorized_attention`, under its default
  ``attn_implementation``);
- the same model with that kernel replaced by the identity on the values (every other op kept: projections,
  feed-forward, layer norms, embeddings, the LM head and its loss);
- the attention's matrix products alone at this machine's GEMM rate: six per head and layer (scores, weighted sum
  and four in the backward) for query blocks of 64 against ``K`` keys each, ``K`` the pattern's exact mean number of
  allowed keys per query (counted on its mask function: no wasted score).

``floor = identity step + products`` is what the step would cost if softmax, masking and the regrouping of the
sequence were free and no score were wasted; ``floor / step`` is how close the efficient path is (the issue's target
is 90 %). The bounds and the timing helpers are `bench_sparse_floor.py`'s.

    python bench/bench_sparse_transformer_floor.py                      # 4096 tokens, 5 rounds
    python bench/bench_sparse_transformer_floor.py --dry-run            # tiny, seconds
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's tf_family, not an installed one
from bench_sparse_floor import _identity, _product_time  # noqa: E402
from common import markdown_table, setup_threads, write_results  # noqa: E402

QUERY_BLOCK = 64  # query rows per product in the floor's GEMMs


def _config(pattern: str, length: int, width: int, layers: int, heads: int, stride: int):
    from tf_family.models.sparse_transformer.configuration_sparse_transformer import TffSparseTransformerConfig

    fields = {"sparsity_pattern": pattern, "stride": stride}
    if pattern == "dense":  # one causal block of the whole length, no memory: full causal attention
        fields = {"sparsity_pattern": "local_1d", "stride": length, "memory_length": 0}
    return TffSparseTransformerConfig(
        vocab_size=256,
        hidden_size=width,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * width,
        max_position_embeddings=length,
        **fields,
    )


def _products(config, length: int) -> tuple[float, list[float]]:
    """Seconds of the six attention products of every head and layer at the exact pattern sizes, and each distinct
    pattern's mean keys per query."""
    import torch

    from tf_family.models.sparse_transformer.modeling_sparse_transformer import _pattern_mask, layer_head_patterns

    positions = torch.arange(length)
    head_dim = config.hidden_size // config.num_attention_heads
    groups = max(1, length // QUERY_BLOCK)
    rows = min(QUERY_BLOCK, length)
    keys_of: dict = {}
    total = 0.0
    for layer in range(config.num_hidden_layers):
        for pattern in layer_head_patterns(config, layer):
            if pattern not in keys_of:
                allowed = int(_pattern_mask(pattern, positions, positions).sum())
                keys = max(1, round(allowed / length))
                time_of = (
                    2 * _product_time(groups, rows, keys, head_dim)  # scores; dP = dO V^T
                    + 2 * _product_time(groups, rows, head_dim, keys)  # P V; dQ = dS K
                    + 2 * _product_time(groups, keys, head_dim, rows)  # dV = P^T dO; dK = dS^T Q
                )
                keys_of[pattern] = (allowed / length, time_of)
            total += keys_of[pattern][1]
    return total, [keys for keys, _ in keys_of.values()]


def measure(pattern: str, args) -> dict:
    import torch

    import tf_family.models.sparse_transformer.modeling_sparse_transformer as module
    from tf_family.models.sparse_transformer.modeling_sparse_transformer import TffSparseTransformerForCausalLM

    config = _config(pattern, args.length, args.width, args.layers, args.heads, args.stride)
    torch.manual_seed(0)
    model = TffSparseTransformerForCausalLM(config).train()
    input_ids = torch.randint(0, 256, (1, args.length))
    kernel = module.factorized_attention

    def step():
        model.zero_grad(set_to_none=True)
        model(input_ids=input_ids, labels=input_ids).loss.backward()

    def identity_step():
        module.factorized_attention = _identity
        try:
            step()
        finally:
            module.factorized_attention = kernel

    runs = {"step": step} if pattern == "dense" else {"step": step, "identity": identity_step}
    for run in runs.values():  # warm-up
        run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.rounds):  # interleaved, call by call
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    result = {"pattern": pattern, "length": args.length, **{k: statistics.median(v) for k, v in times.items()}}
    if pattern != "dense":
        result["products"], result["keys_per_query"] = _products(config, args.length)
        result["floor"] = result["identity"] + result["products"]
        result["floor_over_step"] = result["floor"] / result["step"]
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--stride", type=int, default=64)
    parser.add_argument("--patterns", nargs="+", default=["strided", "fixed", "dense"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--name", default="sparse_transformer_floor")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes, one round: checks the script runs")
    args = parser.parse_args(argv)
    if args.dry_run:
        args.length, args.width, args.layers, args.heads, args.stride, args.rounds = 128, 32, 2, 2, 16, 1
        args.name = f"{args.name}_dry_run"
    setup_threads(args.threads)
    records = []
    for pattern in args.patterns:
        records.append(measure(pattern, args))
        print(records[-1], flush=True)
    dense = next((r["step"] for r in records if r["pattern"] == "dense"), None)

    def ms(seconds):
        return f"{seconds * 1e3:.0f} ms"

    rows = []
    for r in records:
        sparse = r["pattern"] != "dense"
        rows.append(
            [
                r["pattern"],
                ms(r["step"]),
                ms(r["identity"]) if sparse else "-",
                ms(r["products"]) if sparse else "-",
                ms(r["floor"]) if sparse else "-",
                f"{100 * r['floor_over_step']:.0f} %" if sparse else "-",
                ", ".join(f"{k:.0f}" for k in r["keys_per_query"]) if sparse else f"{(args.length + 1) / 2:.0f}",
                f"{dense / r['step']:.2f}x" if dense and sparse else "-",
            ]
        )
    header = ["pattern", "training step", "identity-attention step", "attention products", "floor"]
    header += ["floor / step", "keys per query (per factor)", "speed-up over dense"]
    intro = (
        f"Training step (forward + backward of the LM loss), batch 1 x {args.length} bytes, {args.layers} layers, width "
        f"{args.width}, {args.heads} heads, stride {args.stride} (heads split between the two factors), medians of "
        f"{args.rounds} interleaved rounds. dense = the same model with one causal block of the whole length. "
        "floor = identity-attention step + the six attention products per head and layer at the exact mean keys per "
        f"query (query blocks of {QUERY_BLOCK}); floor / step = how close the efficient path is (target 90 %)."
    )
    write_results(
        args.name,
        {"threads": args.threads, "records": records},
        "# Sparse Transformer: the efficient path against its floor\n\n"
        + intro
        + "\n\n"
        + markdown_table(header, rows),
    )


if __name__ == "__main__":
    main()
