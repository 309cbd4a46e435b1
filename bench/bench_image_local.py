"""Image Transformer local attention on scikit-learn's digits: bits per dimension of 1-D local (raster order) against
2-D local (block-raster order) at the same memory block size, the paper's ordering claim (Parmar et al. 2018,
section 5: 2-D local beats 1-D local).

The images ship with scikit-learn (nothing is downloaded): 1,797 grey 8x8 digits with 17 intensities, one token per
pixel. ``--size S`` (a multiple of 8) upsamples them to ``S x S`` (``--resize bilinear``, the default, or ``nearest``;
bilinear values rounded back to the 17 levels 0..16), so that a memory block of a given size covers less than an
image row: the paper's setting (CIFAR-10, 32 x 32 x 3 per row-major sequence, memory blocks of a few rows), where a
raster 1-D block misses the pixels above that a 2-D block of the same size reaches. Each model (``sparse_transformer``
with the registry variants ``image-local-1d`` / ``image-local-2d``'s sizes, their patterns set by the flags below)
trains on the same 1,500 images for the same steps and seed; bits per dimension are the held-out mean negative
log2-likelihood of pixels 2..S*S (the first pixel has no context in a causal LM without a start token; the same for
both: pixel (0, 0) is first in both orders).

Memory block sizes (positions a query block reads, the query block included): 1-D ``block_1d + memory_1d``; 2-D
``(block_height + memory_height) x (block_width + 2 memory_width)``. The defaults are the registry variants (32 and
32; on 8x8 images the 1-D block reaches three full rows back).

    python bench/bench_image_local.py [--steps 600] [--seeds 2]           # 8x8, the registry variants
    python bench/bench_image_local.py --size 16 --steps 300 --seeds 2 --block_1d 4 --memory_1d 12 \
        --block_2d 2 2 --memory_2d 2 1 --name image_local_digits16_m16   # memory block 16 < one 16-pixel row
    python bench/bench_image_local.py --size 32 --batch_size 8 --steps 300 --seeds 2 --block_1d 4 --memory_1d 12 \
        --block_2d 2 2 --memory_2d 2 1 --name image_local_digits32_m16   # two 1-D layers cannot reach the row above
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import loadavg, markdown_table, setup_threads, write_results  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--size", type=int, default=8, help="image side after upsampling (a multiple of 8)")
    parser.add_argument("--resize", choices=("bilinear", "nearest"), default="bilinear")
    parser.add_argument("--block_1d", type=int, default=8, help="1-D query block (stride)")
    parser.add_argument("--memory_1d", type=int, default=24, help="1-D memory_length before the block")
    parser.add_argument("--block_2d", type=int, nargs=2, default=(2, 4), metavar=("HEIGHT", "WIDTH"))
    parser.add_argument("--memory_2d", type=int, nargs=2, default=(2, 2), metavar=("ROWS_UP", "COLUMNS_EACH_SIDE"))
    parser.add_argument("--name", default="image_local_digits")
    args = parser.parse_args(argv)
    if args.size < 8 or args.size % 8:
        parser.error(f"--size must be a multiple of 8 (the digits are 8x8), got {args.size}.")
    return args


def digits(size: int, resize: str):
    """``(1797, size * size)`` long in raster order, intensities 0..16."""
    import torch
    import torch.nn.functional as F
    from sklearn.datasets import load_digits

    images = torch.tensor(load_digits().images, dtype=torch.float32)  # (1797, 8, 8), 0..16
    if size != 8:
        kwargs = {"align_corners": False} if resize == "bilinear" else {}
        images = F.interpolate(images[:, None], size=(size, size), mode=resize, **kwargs)[:, 0]
    return images.round().clamp(0, 16).long().flatten(1)


def pattern_fields(args) -> dict[str, dict]:
    (block_height, block_width), (memory_height, memory_width) = args.block_2d, args.memory_2d
    return {
        "local_1d": {"sparsity_pattern": "local_1d", "stride": args.block_1d, "memory_length": args.memory_1d},
        "local_2d": {
            "sparsity_pattern": "local_2d",
            "image_width": args.size,
            "block_height": block_height,
            "block_width": block_width,
            "memory_height": memory_height,
            "memory_width": memory_width,
        },
    }


def memory_block_sizes(args) -> dict[str, int]:
    (block_height, block_width), (memory_height, memory_width) = args.block_2d, args.memory_2d
    return {
        "local_1d": args.block_1d + args.memory_1d,
        "local_2d": (block_height + memory_height) * (block_width + 2 * memory_width),
    }


def main(argv=None) -> None:
    args = parse_args(argv)
    setup_threads()
    import torch

    from tf_family import create_model
    from tf_family.attention.image_local import block_raster_order

    images = digits(args.size, args.resize)
    train, test = images[:1500], images[1500:]
    sizes = memory_block_sizes(args)
    results: dict[str, list[float]] = {variant: [] for variant in pattern_fields(args)}
    for seed in range(args.seeds):  # seeds outer: a run cut short still compares the two at equal seeds
        for variant, fields in pattern_fields(args).items():
            torch.manual_seed(seed)
            model = create_model(
                "sparse_transformer",
                "causal_lm",
                "image-local-1d",  # the digits model's sizes; the pattern from the flags
                max_position_embeddings=args.size * args.size,
                **fields,
            )
            order = None
            if variant == "local_2d":
                order = block_raster_order(model.model.layers[0].self_attn.patterns[0], args.size)
            train_ids = train if order is None else train[:, order]
            test_ids = test if order is None else test[:, order]
            optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
            generator = torch.Generator().manual_seed(seed)
            model.train()
            for _ in range(args.steps):
                batch = train_ids[torch.randint(0, len(train_ids), (args.batch_size,), generator=generator)]
                loss = model(input_ids=batch, labels=batch).loss
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            model.eval()
            with torch.no_grad():
                nats = model(input_ids=test_ids, labels=test_ids).loss.item()
            results[variant].append(nats / math.log(2))
            print(variant, seed, results[variant][-1], flush=True)
    rows = [
        [variant, sizes[variant], f"{sum(scores) / len(scores):.4f}", ", ".join(f"{s:.4f}" for s in scores)]
        for variant, scores in results.items()
    ]
    native = os.environ.get("TF_FAMILY_NATIVE")  # 0: PyTorch's SDPA, not the native CPU kernel (same attention)
    winner = min(results, key=lambda v: sum(results[v]))
    (block_height, block_width), (memory_height, memory_width) = args.block_2d, args.memory_2d
    resized = "" if args.size == 8 else f", upsampled ({args.resize}, rounded to the 17 levels)"
    # a 1-D query at offset a of its block reads a + memory_1d positions back: the pixel above needs args.size
    reaching = sum(a + args.memory_1d >= args.size for a in range(args.block_1d))
    markdown = (
        f"# Image Transformer local attention on {args.size}x{args.size} digits (bits per dimension, lower is better)"
        f"\n\nscikit-learn's 8x8 digits{resized}; {args.steps} steps of batch {args.batch_size}, AdamW 3e-3, "
        f"{args.seeds} seeds; held-out 297 images. Model: the ``image-local-1d`` / ``image-local-2d`` sizes (2 layers, "
        f"width 64, 2 heads). 1-D: query blocks of {args.block_1d} in raster order, memory_length {args.memory_1d} "
        f"(the pixel directly above is {args.size} positions back: in one layer {reaching} of the {args.block_1d} "
        f"queries of a block reach it). 2-D: query blocks of "
        f"{block_height}x{block_width} in block-raster order, memory {memory_height} row(s) up and {memory_width} "
        f"column(s) left and right. The machine was shared while this ran (load average {loadavg()}): the quality "
        "figures do not depend on it."
        + ("" if native is None else f" Run with TF_FAMILY_NATIVE={native}.")
        + "\n\n"
        + markdown_table(["variant", "memory block (positions)", "bits/dim (mean)", "per seed"], rows)
        + f"\n\nLower: {winner}.\n"
    )
    payload = {"args": vars(args), "memory_block": sizes, "steps": args.steps, "seeds": args.seeds}
    payload["environment"] = {"TF_FAMILY_NATIVE": native}
    write_results(args.name, {**payload, "bits_per_dim": results}, markdown)
    print(markdown)


if __name__ == "__main__":
    main()
