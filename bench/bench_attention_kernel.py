"""tf_family's native CPU attention kernel against its parts: the matrix products alone and the unfused PyTorch path.

At the tile shapes the sparse models train with at 4096 tokens (hidden 256, 4 heads of 64, dropout 0.1), one
process times, taking turns call by call:

- the native kernel (`tf_family.attention.native.fused_attention`), forward and backward separately;
- the unfused path (`masked_attention` with a `dropout_mask` and the mask as a ``-inf`` bias), forward + backward;
- one ``torch.bmm`` of the scores' size, the rate the products can run at: the forward has two such products, the
  native backward five (it recomputes the scores), the unfused backward four.

Shapes: Longformer, chunks of 128 queries against 385 keys (window 256 plus one global token), 32 chunks x 4 heads;
BigBird, a slab of 16 middle query blocks of 64 queries against 8 key blocks (512 keys), x 4 heads.

    .venv/bin/python bench/bench_attention_kernel.py            # about a minute
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's tf_family, not an installed one
import common  # noqa: E402

SHAPES = {  # name: (tiles A, heads H, queries T, keys S, head width Dh)
    "longformer chunks": (32, 4, 128, 385, 64),
    "big_bird slab": (16, 4, 64, 512, 64),
}


def measure(name: str, shape: tuple[int, ...], rounds: int, dropout_p: float) -> dict:
    import torch

    from tf_family.attention import dropout_mask, masked_attention, native
    from tf_family.attention.dropout import _dropout_levels

    a, h, t, s, d = shape
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(a, h, t, d, generator=generator)
    key, value = (torch.randn(a, h, s, d, generator=generator) for _ in range(2))
    allowed = torch.rand(a, 1, t, s, generator=generator) > 0.2
    allowed[..., 0] = True
    grad_out = torch.randn(a, h, t, d, generator=generator)
    ext = native.extension()
    if ext is None:
        raise SystemExit("the native kernel could not be built here; nothing to measure")
    mask = allowed.expand(a, h, t, s).view(torch.uint8)
    dropped = _dropout_levels(dropout_p)[0]
    _, lse = ext.forward(query, key, value, mask, dropped, 1)
    leaves = [x.clone().requires_grad_(True) for x in (query, key, value)]

    def unfused():
        kept, scale = dropout_mask((a, h, t, s), dropout_p)
        bias = allowed.view(torch.uint8).to(torch.float32).log_()
        out = masked_attention(*leaves, bias, kept, scale)
        torch.autograd.grad(out, leaves, grad_out)

    flat_q, flat_k = query.view(-1, t, d), key.view(-1, s, d)
    steps = {
        "native forward": lambda: ext.forward(query, key, value, mask, dropped, 1),
        "native backward": lambda: ext.backward(grad_out, query, key, value, mask, lse, dropped, 1),
        "unfused forward+backward": unfused,
        "one product": lambda: torch.bmm(flat_q, flat_k.transpose(1, 2)),
    }
    times = common.time_interleaved(steps, rounds)
    medians = {step: statistics.median(values) for step, values in times.items()}
    return {"shape": name, "a_h_t_s_dh": shape, "times_s": times, "medians_s": medians}


def markdown(records: list[dict], rounds: int) -> str:
    rows = []
    for r in records:
        m = r["medians_s"]
        product = m["one product"]
        native_total = m["native forward"] + m["native backward"]
        rows.append([
            r["shape"], "x".join(map(str, r["a_h_t_s_dh"])), common.format_seconds(m["native forward"]),
            common.format_seconds(2 * product), common.format_seconds(m["native backward"]),
            common.format_seconds(5 * product), common.format_seconds(native_total),
            common.format_seconds(m["unfused forward+backward"]), f"{m['unfused forward+backward'] / native_total:.2f}x",
        ])  # fmt: skip
    headers = ["shape", "A x H x T x S x Dh", "native forward", "2 products", "native backward", "5 products",
               "native fwd+bwd", "unfused fwd+bwd", "unfused / native"]  # fmt: skip
    return (
        f"Medians of {rounds} interleaved rounds, float32, dropout 0.1, 20% of the keys masked. n products = n times "
        "one batched product of the scores' size (torch.bmm).\n\n" + common.markdown_table(headers, rows)
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--name", default="attention_kernel")
    args = parser.parse_args(argv)
    common.setup_threads()
    records = [measure(name, shape, args.rounds, args.dropout) for name, shape in SHAPES.items()]
    json_path, md_path = common.write_results(
        args.name, {"args": vars(args), "records": records}, markdown(records, args.rounds)
    )
    print(markdown(records, args.rounds))
    print(f"wrote {json_path} and {md_path}")


if __name__ == "__main__":
    main()
