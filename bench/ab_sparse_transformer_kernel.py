"""The Sparse Transformer's training step under this checkout's factorised kernel against the same step under the
kernel of an earlier commit, timed alternately in one process, with the floor of `bench_sparse_transformer_floor.py`.

For a loaded machine, where wall-clock speed may not be claimed: with ``--clock cpu`` every time is the process's CPU
seconds (``time.process_time``, one thread), which the queue of a shared machine does not stretch; a figure from it
is still "measured under load, not a result". On an idle machine `bench_sparse_transformer_floor.py` is the
measurement. The older kernel is ``tf_family/attention/factorized.py`` as of ``--old`` (read with ``git show``),
loaded beside this checkout's; everything else (the model, its other kernels) is this checkout's.

    python bench/ab_sparse_transformer_kernel.py --old 8e7115e --pattern fixed --threads 1 --clock cpu
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's tf_family, not an installed one
from common import setup_threads, write_results  # noqa: E402

KERNEL_PATH = "tf_family/attention/factorized.py"


def _old_kernel(commit: str):
    """``factorized_attention`` of ``commit``'s ``factorized.py``, loaded as a sibling module of this checkout's."""
    root = Path(__file__).resolve().parents[1]
    source = subprocess.run(
        ["git", "show", f"{commit}:{KERNEL_PATH}"], cwd=root, capture_output=True, text=True, check=True
    ).stdout
    path = Path(tempfile.mkdtemp()) / "factorized_old.py"
    path.write_text(source)
    name = "tf_family.attention.factorized_old"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    old = module.factorized_attention
    per_head = hasattr(module, "head_patterns")  # the older kernel takes one pattern per head itself

    def as_old(pattern):  # the older module's own pattern class (its isinstance checks)
        return module.FactorizedPattern(**dataclasses.asdict(pattern))

    def one_pattern_per_call(query, key, value, pattern, slopes=None, *args):
        """Heads that the model now hands over in one call with one pattern each (the fixed pattern's summary
        heads): one call, or, for a kernel that took a single pattern, one call per head as the model made them."""
        if not isinstance(pattern, tuple):
            return old(query, key, value, as_old(pattern), slopes, *args)
        if per_head:
            return old(query, key, value, tuple(as_old(p) for p in pattern), slopes, *args)
        import torch

        return torch.cat(
            [
                old(
                    *(t[:, head : head + 1] for t in (query, key, value)),
                    as_old(head_pattern),
                    None if slopes is None else slopes[head : head + 1],
                    *args,
                )
                for head, head_pattern in enumerate(pattern)
            ],
            dim=1,
        )

    return one_pattern_per_call


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, help="the commit whose factorized.py is the baseline")
    parser.add_argument("--pattern", default="fixed", choices=["strided", "fixed"])
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--stride", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=["wall", "cpu"], default="cpu")
    parser.add_argument("--implementation", default=None, help="attn_implementation (default: the model's)")
    parser.add_argument("--name", default="sparse_transformer_kernel_ab")
    args = parser.parse_args(argv)
    if args.clock == "cpu" and args.threads != 1:
        parser.error("--clock cpu sums the CPU time of every thread: use --threads 1 with it.")
    setup_threads(args.threads)
    import bench_sparse_floor
    import torch
    from bench_sparse_floor import _identity
    from bench_sparse_transformer_floor import _config, _products

    import tf_family.models.sparse_transformer.modeling_sparse_transformer as module

    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    bench_sparse_floor.time = types.SimpleNamespace(perf_counter=clock)  # the products on the same clock
    config = _config(args.pattern, args.length, args.width, args.layers, args.heads, args.stride)
    torch.manual_seed(0)
    model = module.TffSparseTransformerForCausalLM(config).train()
    if args.implementation is not None:
        model.set_attn_implementation(args.implementation)
    input_ids = torch.randint(0, 256, (1, args.length))
    new = module.factorized_attention

    def step_with(kernel):
        def step():
            module.factorized_attention = kernel
            try:
                model.zero_grad(set_to_none=True)
                model(input_ids=input_ids, labels=input_ids).loss.backward()
            finally:
                module.factorized_attention = new

        return step

    runs = {"new": step_with(new), "old": step_with(_old_kernel(args.old)), "identity": step_with(_identity)}
    for run in runs.values():  # warm-up
        run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.rounds):  # interleaved, call by call
        for name, run in runs.items():
            start = clock()
            run()
            times[name].append(clock() - start)
    median = {name: statistics.median(values) for name, values in times.items()}
    products, keys = _products(config, args.length)
    floor = median["identity"] + products
    record = {
        "args": vars(args),
        "implementation": model.config._attn_implementation,
        "environment": {"TF_FAMILY_NATIVE": os.environ.get("TF_FAMILY_NATIVE")},
        "times_s": times,
        "median_s": median,
        "products_s": products,
        "keys_per_query": keys,
        "floor_s": floor,
        "floor_over_step": {"new": floor / median["new"], "old": floor / median["old"]},
    }
    seconds = "CPU seconds (process_time)" if args.clock == "cpu" else "seconds"
    markdown = (
        f"# Sparse Transformer ({args.pattern}): this checkout's factorised kernel against {args.old}'s\n\n"
        f"**Measured under load, not a result** unless the load average below is near 0 (then "
        f"`bench_sparse_transformer_floor.py` is the measurement). Training step, batch 1 x {args.length}, "
        f"{args.layers} layers, width {args.width}, {args.heads} heads, stride {args.stride}, "
        f"attn_implementation {record['implementation']!r}, TF_FAMILY_NATIVE="
        f"{record['environment']['TF_FAMILY_NATIVE']}; medians of {args.rounds} interleaved rounds in "
        f"{seconds}; floor = identity-attention step + the attention products at the pattern's exact keys per "
        f"query (`bench_sparse_transformer_floor.py`'s), on the same clock.\n\n"
        f"| kernel | training step | floor | floor / step |\n|---|---|---|---|\n"
        + "".join(
            f"| {name} | {median[name]:.3f} | {floor:.3f} | {100 * floor / median[name]:.0f} % |\n"
            for name in ("new", "old")
        )
        + f"\nidentity-attention step {median['identity']:.3f}, attention products {products:.3f}.\n"
    )
    write_results(args.name, record, markdown)
    print(markdown)


if __name__ == "__main__":
    main()
