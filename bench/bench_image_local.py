"""Image Transformer local attention on scikit-learn's 8x8 digits: bits per dimension of 1-D local (raster order)
against 2-D local (block-raster order) at the same memory block size (32 positions), the paper's ordering claim
(Parmar et al. 2018, section 5: 2-D local beats 1-D local).

The images ship with scikit-learn (nothing is downloaded): 1,797 grey 8x8 digits with 17 intensities, one token per
pixel. Each model (registry variants ``image-local-1d`` and ``image-local-2d`` of ``sparse_transformer``) trains on
the same 1,500 images for the same steps and seed; bits per dimension are the held-out mean negative log2-likelihood
of pixels 2..64 (the first pixel has no context in a causal LM without a start token; the same for both).

    python bench/bench_image_local.py [--steps 600] [--seeds 2]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import loadavg, markdown_table, setup_threads, write_results  # noqa: E402


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--name", default="image_local_digits")
    args = parser.parse_args(argv)
    setup_threads()
    import torch
    from sklearn.datasets import load_digits

    from tf_family import create_model
    from tf_family.attention.image_local import block_raster_order

    images = torch.tensor(load_digits().images, dtype=torch.long).flatten(1)  # (1797, 64) raster order, 0..16
    train, test = images[:1500], images[1500:]
    rows, results = [], {}
    for variant in ("image-local-1d", "image-local-2d"):
        scores = []
        for seed in range(args.seeds):
            torch.manual_seed(seed)
            model = create_model("sparse_transformer", "causal_lm", variant)
            order = None
            if model.config.sparsity_pattern == "local_2d":
                order = block_raster_order(model.model.layers[0].self_attn.patterns[0], 8)
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
            scores.append(nats / math.log(2))
        results[variant] = scores
        rows.append([variant, f"{sum(scores) / len(scores):.4f}", ", ".join(f"{s:.4f}" for s in scores)])
    winner = min(results, key=lambda v: sum(results[v]))
    markdown = (
        f"# Image Transformer local attention on 8x8 digits (bits per dimension, lower is better)\n\n"
        f"{args.steps} steps of batch {args.batch_size}, AdamW 3e-3, {args.seeds} seeds; held-out 297 images; "
        f"memory block 32 positions for both. The machine was shared while this ran (load average {loadavg()}): "
        "the quality figures do not depend on it.\n\n"
        + markdown_table(["variant", "bits/dim (mean)", "per seed"], rows)
        + f"\n\nLower: {winner}.\n"
    )
    write_results(args.name, {"steps": args.steps, "seeds": args.seeds, "bits_per_dim": results}, markdown)
    print(markdown)


if __name__ == "__main__":
    main()
