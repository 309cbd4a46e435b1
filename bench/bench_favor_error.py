"""FAVOR+ fidelity: relative error of the Performer's attention output against exact softmax attention, by number of
random features (16-256), orthogonal against i.i.d. features, averaged over draws of the projection. Also the same
error for performer-pytorch's orthogonal matrix (its QR without the sign correction), when it is installed.

Error figures, not timings: machine load does not change them.

    python bench/bench_favor_error.py --draws 16
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import markdown_table, write_results  # noqa: E402

from tf_family.attention.kernelized import (  # noqa: E402
    draw_random_projection,
    favor_key_features,
    favor_query_features,
    linear_attention,
)

FEATURES = (16, 32, 64, 128, 256)


def relative_error(query, key, value, projection) -> float:
    exact = (query @ key.transpose(-1, -2) / math.sqrt(query.shape[-1])).softmax(-1) @ value
    approx = linear_attention(favor_query_features(query, projection), favor_key_features(key, projection), value)
    return float((approx.double() - exact).norm() / exact.norm())


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=16)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--head_dim", type=int, default=64)
    parser.add_argument("--scale", type=float, default=0.3, help="std of the query and key entries")
    args = parser.parse_args(argv)
    generator = torch.Generator().manual_seed(0)
    # (B, H, T, Dh) queries, keys and values; --scale sets how peaked the softmax is
    query, key, value = (
        torch.randn(2, 4, args.length, args.head_dim, generator=generator, dtype=torch.float64) * args.scale
        for _ in range(3)
    )
    try:
        from performer_pytorch.performer_pytorch import gaussian_orthogonal_random_matrix
    except ImportError:
        gaussian_orthogonal_random_matrix = None
    rows, results = [], []
    for num_features in FEATURES:
        errors = {"orthogonal": [], "iid": [], "performer-pytorch orthogonal": []}
        for draw in range(args.draws):
            seed = torch.Generator().manual_seed(1000 * num_features + draw)
            errors["orthogonal"].append(
                relative_error(query, key, value, draw_random_projection(num_features, args.head_dim, seed).double())
            )
            seed = torch.Generator().manual_seed(1000 * num_features + draw)
            iid = draw_random_projection(num_features, args.head_dim, seed, orthogonal=False).double()
            errors["iid"].append(relative_error(query, key, value, iid))
            if gaussian_orthogonal_random_matrix is not None:
                torch.manual_seed(1000 * num_features + draw)
                theirs = gaussian_orthogonal_random_matrix(num_features, args.head_dim).double()
                errors["performer-pytorch orthogonal"].append(relative_error(query, key, value, theirs))
        means = {name: sum(values) / len(values) if values else None for name, values in errors.items()}
        results.append({"num_features": num_features, **means})
        rows.append([num_features, *(f"{value:.4f}" if value is not None else "-" for value in means.values())])
    markdown = (
        f"# FAVOR+ relative error against softmax attention\n\nMean over {args.draws} projections; T={args.length}, "
        f"Dh={args.head_dim}, query / key std {args.scale}, 2 x 4 heads, float64.\n\n"
        + markdown_table(["features", "orthogonal", "i.i.d.", "performer-pytorch orthogonal"], rows)
    )
    json_path, md_path = write_results("favor_error", {"args": vars(args), "results": results}, markdown)
    print(md_path.read_text())  # noqa: T201


if __name__ == "__main__":
    main()
