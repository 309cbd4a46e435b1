"""Reformer quality (b): bits per character of a tiny Reformer against a dense transformer of the same size and the
same training budget, on real long text.

Data: the enwik8-format English Wikipedia slice shipped in the PyPI wheel of ``gensim`` 4.4.0
(``gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2``, 6,089,746 bytes of
MediaWiki XML, fetched once with ``pip download`` into ``bench/data/``), byte-level like enwik8: the first 90 % train,
the last 5 % test (the 5 % between them unused).

Models (width 128, 4 layers, 4 heads x 32, feed-forward 512, ReLU, absolute learned positions, dropout 0):

- ``reformer``: `TffReformerForCausalLM`, layers local / LSH / local / LSH, chunks of 64, 2 hashes, 32 buckets,
  reversible;
- ``dense``: transformers' GPT-2 of the same size with SDPA (full causal) attention.

Both train for the same number of steps on the same batches (``--steps`` x ``--batch`` windows of ``--length``
bytes drawn with one seeded generator), AdamW, linear warm-up then linear decay. Test bpc: the mean next-byte loss
(in bits) over consecutive non-overlapping ``--length``-byte windows of the test split (the first byte of each window
is not scored); the Reformer also evaluated with 4 and 8 hashes.

    python bench/bench_reformer_charlm.py                # about 2 x 3 minutes on a quiet 2-core machine
"""

from __future__ import annotations

import argparse
import bz2
import math
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's tf_family, not an installed one
import common  # noqa: E402

WHEEL = "gensim==4.4.0"
MEMBER = "gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
TEXT_BYTES = 6_089_746
TEXT_PATH = common.DATA_DIR / "enwiki_slice.xml"
SIZE = {"width": 128, "layers": 4, "heads": 4, "head_dim": 32, "feed_forward": 512}


def fetch_text() -> bytes:
    """The XML bytes, extracted from the gensim wheel (``pip download``, PyPI) on first use."""
    if not TEXT_PATH.exists():
        with tempfile.TemporaryDirectory() as tmp:
            command = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", WHEEL, "-d", tmp]
            result = subprocess.run(command, capture_output=True, text=True, check=False)
            wheels = list(Path(tmp).glob("gensim-*.whl"))
            if result.returncode != 0 or len(wheels) != 1:
                raise SystemExit(f"`pip download {WHEEL}` failed (rc={result.returncode}):\n{result.stderr[-2000:]}")
            with zipfile.ZipFile(wheels[0]) as wheel:
                data = bz2.decompress(wheel.read(MEMBER))
        TEXT_PATH.parent.mkdir(parents=True, exist_ok=True)
        partial = TEXT_PATH.with_suffix(".part")
        partial.write_bytes(data)
        partial.rename(TEXT_PATH)
    data = TEXT_PATH.read_bytes()
    if len(data) != TEXT_BYTES:
        raise SystemExit(f"{TEXT_PATH} has {len(data)} bytes, expected {TEXT_BYTES}; delete it to fetch it again.")
    return data


def build(kind: str, length: int):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    import tf_family

    torch.manual_seed(0)
    if kind == "dense":
        config = GPT2Config(
            vocab_size=256, n_positions=length, n_embd=SIZE["width"], n_layer=SIZE["layers"], n_head=SIZE["heads"],
            n_inner=SIZE["feed_forward"], activation_function="relu", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        )  # fmt: skip
        return GPT2LMHeadModel._from_config(config, attn_implementation="sdpa")
    config = tf_family.TffReformerConfig(
        vocab_size=256, hidden_size=SIZE["width"], num_attention_heads=SIZE["heads"],
        attention_head_size=SIZE["head_dim"], feed_forward_size=SIZE["feed_forward"], hidden_act="relu",
        attn_layers=["local", "lsh"] * (SIZE["layers"] // 2), local_attn_chunk_length=64, lsh_attn_chunk_length=64,
        num_hashes=2, num_buckets=32, position_embedding_type="absolute", max_position_embeddings=length,
        hidden_dropout_prob=0.0, local_attention_probs_dropout_prob=0.0, lsh_attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    return tf_family.TffReformerForCausalLM(config)


def train(model, train_ids, args) -> dict:
    import torch

    generator = torch.Generator().manual_seed(1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    warmup = max(1, args.steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min((step + 1) / warmup, max(0.0, (args.steps - step) / (args.steps - warmup)))
    )
    model.train()
    losses, start = [], time.perf_counter()
    for step in range(args.steps):
        starts = torch.randint(0, len(train_ids) - args.length, (args.batch,), generator=generator)
        batch = torch.stack([train_ids[s : s + args.length] for s in starts.tolist()])
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if step % 50 == 0 or step == args.steps - 1:
            print(f"step {step} loss {loss.item():.3f} ({time.perf_counter() - start:.0f} s)", flush=True)
    return {
        "train_s": round(time.perf_counter() - start, 1),
        "final_train_bpc": sum(losses[-20:]) / len(losses[-20:]) / math.log(2),
    }


def evaluate(model, test_ids, args, **kwargs) -> float:
    import torch

    windows = test_ids[: (len(test_ids) // args.length) * args.length].view(-1, args.length)[: args.eval_windows]
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for batch in windows.split(args.batch):
            loss = model(input_ids=batch, labels=batch, **kwargs).loss
            scored = batch.shape[0] * (args.length - 1)
            total, count = total + loss.item() * scored, count + scored
    return total / count / math.log(2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--eval-windows", type=int, default=64)
    parser.add_argument("--name", default="reformer_charlm")
    args = parser.parse_args()
    common.setup_threads()
    import torch

    data = fetch_text()
    ids = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
    train_ids, test_ids = ids[: int(0.9 * len(ids))], ids[int(0.95 * len(ids)) :]
    results = []
    for kind in ("reformer", "dense"):
        model = build(kind, args.length)
        parameters = sum(p.numel() for p in model.parameters())
        record = {"model": kind, "parameters": parameters, **train(model, train_ids, args)}
        record["test_bpc"] = evaluate(model, test_ids, args)
        if kind == "reformer":
            for hashes in (4, 8):
                record[f"test_bpc_{hashes}_hashes"] = evaluate(model, test_ids, args, num_hashes=hashes)
        record["loadavg_end"] = common.loadavg()
        print(record, flush=True)
        results.append(record)
    rows = [[r["model"], f"{r['parameters']:,}", f"{r['test_bpc']:.3f}",
             f"{r.get('test_bpc_4_hashes', float('nan')):.3f}" if "test_bpc_4_hashes" in r else "-",
             f"{r.get('test_bpc_8_hashes', float('nan')):.3f}" if "test_bpc_8_hashes" in r else "-",
             f"{r['final_train_bpc']:.3f}", f"{r['train_s']:.0f} s"] for r in results]  # fmt: skip
    tokens = args.steps * args.batch * args.length
    markdown = (
        f"Character-level LM on the enwik8-format Wikipedia slice (gensim 4.4.0 test data, 6.09 MB of XML bytes; "
        f"90 % train / last 5 % test). Same size (width 128, 4 layers, 4 heads x 32, feed-forward 512) and same "
        f"budget for both: {args.steps} steps x {args.batch} x {args.length} bytes = {tokens:,} training bytes "
        f"(~{tokens / len(train_ids):.2f} epochs), AdamW lr {args.lr}. Test bpc over {args.eval_windows} windows of "
        f"{args.length} bytes ({args.eval_windows * (args.length - 1):,} scored bytes). Reformer: local/LSH/local/"
        "LSH, chunks 64, trained with 2 hashes. Dense: GPT-2 with SDPA. Short runs on a shared machine: a "
        "comparison at equal budget, far from converged.\n\n"
        + common.markdown_table(
            [
                "model",
                "parameters",
                "test bpc (2 hashes)",
                "test bpc, 4 hashes",
                "test bpc, 8 hashes",
                "train bpc (last 20 steps)",
                "training time",
            ],
            rows,
        )  # fmt: skip
    )
    common.write_results(args.name, {"args": vars(args), "results": results}, markdown)


if __name__ == "__main__":
    main()
