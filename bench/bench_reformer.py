"""Reformer: tf_family against transformers' `ReformerModelWithLMHead` on the same weights, a dense SDPA baseline,
and the floor, 1k -> 16k tokens in one run.

Speed: forward (eval, no gradient) and forward+backward (training, dropout 0) of a causal LM at each length, the
models of one (length, mode) timed interleaved in one process (`common.time_interleaved`). Models:

- ``transformers``: transformers 5.23 `ReformerModelWithLMHead` (absolute positions: its axial positions train
  only at exactly ``prod(axial_pos_shape)`` tokens);
- ``tff``: `TffReformerForCausalLM.from_pretrained` of that folder with tf_family's own chunking
  (``chunk_wrap_around=False``); ``tff-compat`` (opt-in): transformers' chunking, outputs within 1e-5 of it;
- ``dense``: a plain dense causal transformer of the same size (transformers' GPT-2: width 256, 4 layers, 4 heads,
  feed-forward 1024, SDPA attention, i.e. ``F.scaled_dot_product_attention`` with ``is_causal``): the quadratic
  baseline;
- ``tff-identity`` (training, at the ``--floor-lengths``): ``tff`` with its LSH / local kernels and the hashing
  replaced by the identity on the values (projections, reversible recomputation, feed-forward, head all kept).

Floor: ``tff-identity`` + the attention's matrix products alone (scores and weighted sum per round and chunk at the
kernels' exact sizes, C x Dh x span*C; 2 per forward pass, 4 in the backward; the reversible layers run 2 forward
passes, the last layer 1), timed at this machine's GEMM rate (`bench_sparse_floor._product_time`).

Memory: per (model, length) a fresh subprocess, peak RSS of one forward and then of one training step (Linux
``clear_refs`` resets the peak in between), and the activation memory of training at 2/4/8/12 layers, reversible
(``tff``) against plain backprop (``tff-plain``).

    python bench/bench_reformer.py          # 1k..16k, about 15 minutes on a quiet 2-core machine
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's tf_family, not an installed one
import common  # noqa: E402

BODY = dict(  # noqa: C408  (the research anchor's shape: width 256, 4 layers, 2 LSH)
    vocab_size=256, hidden_size=256, num_attention_heads=4, attention_head_size=64, feed_forward_size=1024,
    attn_layers=["local", "lsh", "local", "lsh"], local_attn_chunk_length=64, lsh_attn_chunk_length=64,
    num_hashes=2, num_buckets=64, hash_seed=0, axial_pos_embds=False, is_decoder=True,
    hidden_dropout_prob=0.0, local_attention_probs_dropout_prob=0.0, lsh_attention_probs_dropout_prob=0.0,
)  # fmt: skip
MODELS = ("transformers", "tff", "dense")
ALL_MODELS = (*MODELS, "tff-compat", "tff-plain", "tff-identity")


def _save_reference(folder: str, max_length: int, layers: list[str] | None = None) -> None:
    import torch
    from transformers import ReformerConfig, ReformerModelWithLMHead

    torch.manual_seed(0)
    body = {**BODY, "max_position_embeddings": max_length}
    if layers is not None:
        body["attn_layers"] = layers
    ReformerModelWithLMHead(ReformerConfig(**body)).save_pretrained(folder)


def _dense(max_length: int):
    """The dense baseline: transformers' GPT-2 of the Reformer's size with SDPA attention."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=BODY["vocab_size"], n_positions=max_length, n_embd=BODY["hidden_size"],
        n_layer=len(BODY["attn_layers"]), n_head=BODY["num_attention_heads"], n_inner=BODY["feed_forward_size"],
        activation_function="relu", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    return GPT2LMHeadModel._from_config(config, attn_implementation="sdpa")


def _build(name: str, folder: str, length: int):
    import transformers

    import tf_family

    transformers.logging.set_verbosity_error()
    if name == "transformers":
        return transformers.ReformerModelWithLMHead.from_pretrained(folder)
    if name == "dense":
        return _dense(length)
    overrides = {
        "tff-compat": {},
        "tff": {"chunk_wrap_around": False},
        "tff-identity": {"chunk_wrap_around": False},
        "tff-plain": {"chunk_wrap_around": False, "reversible": False},
    }[name]
    return tf_family.TffReformerForCausalLM.from_pretrained(folder, **overrides)


def _identity(query, key, value, *args, **kwargs):
    """Stands in for the LSH / local kernels: the values; query and key stay in the graph (two cheap sums)."""
    return value + 0 * (query.sum() + key.sum())


def _with_identity_attention(step):
    from tf_family.models.reformer import modeling_reformer as module

    def run():
        saved = module.lsh_attention, module.chunked_local_attention, module.TffReformerAttention.hash
        module.lsh_attention = module.chunked_local_attention = _identity
        module.TffReformerAttention.hash = lambda self, shared, num_hashes, seed: None
        try:
            return step()
        finally:
            module.lsh_attention, module.chunked_local_attention, module.TffReformerAttention.hash = saved

    return run


def _step(model, length: int, mode: str, name: str = ""):
    import torch

    ids = torch.randint(0, BODY["vocab_size"], (1, length), generator=torch.Generator().manual_seed(length))
    if mode == "forward":
        model.eval()

        def step():
            with torch.no_grad():
                return model(input_ids=ids).logits

        return step
    model.train()

    def step():
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()

    return _with_identity_attention(step) if name == "tff-identity" else step


def speed_worker(length: int, mode: str, folder: str, rounds: int, models: list[str]) -> dict:
    common.setup_threads()
    steps = {name: _step(_build(name, folder, length), length, mode, name) for name in models}
    times = common.time_interleaved(steps, rounds, warmups=1)
    return {"length": length, "mode": mode, "times_s": times, "loadavg_end": common.loadavg()}


def _status_mib(field: str) -> float | None:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return None


def memory_worker(name: str, length: int, modes: list[str], folder: str) -> list[dict]:
    """Peak RSS of one step per mode (in this order, the peak reset before each), and its rise over the RSS before."""
    common.setup_threads()
    model = _build(name, folder, length)
    records = []
    for mode in modes:
        step = _step(model, length, mode, name)
        Path("/proc/self/clear_refs").write_text("5")
        before = _status_mib("VmRSS")
        step()
        peak = _status_mib("VmHWM")
        records.append({"model": name, "length": length, "mode": mode, "peak_rss_mib": round(peak, 1),
                        "delta_rss_mib": round(peak - before, 1)})  # fmt: skip
    return records


def products_worker(length: int) -> dict:
    """Seconds of the attention's matrix products in one training step of ``tff`` (module docstring)."""
    common.setup_threads()
    from bench_sparse_floor import _product_time

    heads, width = BODY["num_attention_heads"], BODY["attention_head_size"]
    total = 0.0
    layers = BODY["attn_layers"]
    for index, kind in enumerate(layers):
        size = BODY[f"{kind}_attn_chunk_length"]
        rounds = BODY["num_hashes"] if kind == "lsh" else 1
        chunks = heads * rounds * -(-length // size)
        window = 2 * size  # one chunk before, none after (causal)
        forward = _product_time(chunks, size, window, width) + _product_time(chunks, size, width, window)
        backward = 2 * _product_time(chunks, size, window, width) + 2 * _product_time(chunks, window, width, size)
        passes = 1 if index == len(layers) - 1 else 2  # reversible layers run forward twice; the last keeps its graph
        total += passes * forward + backward
    return {"length": length, "products_s": total}


def _run(args: list[str], timeout: float):
    try:
        result = subprocess.run(
            [sys.executable, __file__, *args], capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        print(f"timed out after {timeout:.0f} s: {args}", flush=True)
        return {"failed": f"timed out after {timeout:.0f} s"}
    if result.returncode != 0:
        print(result.stderr[-2000:], flush=True)
        reason = "out of memory" if "MemoryError" in result.stderr or result.returncode == -9 else "failed"
        return {"failed": reason}
    return json.loads(result.stdout.strip().splitlines()[-1])


def _median(record: dict, name: str) -> float | None:
    times = record["times_s"].get(name)
    return statistics.median(times) if times else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=ALL_MODELS)
    parser.add_argument("--floor-lengths", type=int, nargs="*", default=[4096, 8192])
    parser.add_argument("--depths", type=int, nargs="*", default=[2, 4, 8, 12])
    parser.add_argument("--depth-length", type=int, default=2048)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--name", default="reformer")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, *rest = args.worker
        if kind == "speed":
            length, mode, folder, rounds, *models = rest
            print(json.dumps(speed_worker(int(length), mode, folder, int(rounds), models)))
        elif kind == "products":
            print(json.dumps(products_worker(int(rest[0]))))
        else:
            name, length, folder, *modes = rest
            print(json.dumps(memory_worker(name, int(length), modes, folder)))
        return

    common.setup_threads()
    speed, memory, depth, floor, skipped = [], [], [], [], []
    with tempfile.TemporaryDirectory() as folder:
        _save_reference(folder, max(args.lengths))
        for length in args.lengths:
            for mode in ("forward", "train"):
                models = list(args.models)
                if mode == "train" and length in args.floor_lengths:
                    models.append("tff-identity")
                record = _run(["--worker", "speed", str(length), mode, folder, str(args.rounds), *models],
                              args.timeout)  # fmt: skip
                print(record, flush=True)
                if "failed" in record:
                    skipped.append(f"speed {mode} at {length}: {record['failed']}")
                else:
                    speed.append(record)
            for name in args.models:
                records = _run(["--worker", "memory", name, str(length), folder, "forward", "train"], args.timeout)
                print(records, flush=True)
                if isinstance(records, dict):
                    skipped.append(f"memory of {name} at {length}: {records['failed']}")
                else:
                    memory.extend(records)
            if length in args.floor_lengths:
                record = _run(["--worker", "products", str(length)], args.timeout)
                print(record, flush=True)
                if "failed" not in record:
                    floor.append(record)
            _write(args, speed, memory, depth, floor, skipped)  # what is measured so far, rewritten at the end
    for layers in args.depths:
        with tempfile.TemporaryDirectory() as folder:
            _save_reference(folder, args.depth_length, ["local", "lsh"] * (layers // 2))
            for name in ("tff", "tff-plain"):
                records = _run(["--worker", "memory", name, str(args.depth_length), folder, "train"], args.timeout)
                print(layers, records, flush=True)
                if not isinstance(records, dict):
                    depth.append({**records[0], "layers": layers})
    _write(args, speed, memory, depth, floor, skipped)


def _write(args, speed, memory, depth, floor, skipped) -> None:
    payload = {"body": BODY, "lengths": args.lengths, "speed": speed, "memory": memory, "depth": depth,
               "products": floor, "skipped": skipped}  # fmt: skip
    common.write_results(args.name, payload, _markdown(args, payload))


def _markdown(args, payload: dict) -> str:
    speed, memory, depth = payload["speed"], payload["memory"], payload["depth"]
    parts = ["Reformer causal LM (width 256, 4 layers local/LSH/local/LSH, 4 heads x 64, chunks 64, 2 hashes, 64 "
             "buckets, batch 1), tf_family vs transformers 5.23 on the same weights; dense = GPT-2 of the same size "
             "with SDPA attention. The machine is shared with other engineers' jobs (loadavg per row and in the "
             "footer): ratios are from medians of one interleaved run."]  # fmt: skip
    others = [m for m in args.models if m != "transformers"]
    for mode in ("forward", "train"):
        rows = []
        for record in (r for r in speed if r["mode"] == mode):
            medians = {name: _median(record, name) for name in args.models}
            base = medians.get("transformers")
            rows.append([record["length"], *(common.format_seconds(medians[m]) for m in args.models),
                         *(f"{base / medians[m]:.2f}x" for m in others if base),
                         " ".join(f"{x:.1f}" for x in record["loadavg_end"])])  # fmt: skip
        headers = ["tokens", *args.models, *(f"transformers / {m}" for m in others), "loadavg"]
        title = "forward (eval)" if mode == "forward" else "forward + backward (train)"
        parts.append(f"**{title}**, median seconds:\n\n" + common.markdown_table(headers, rows))
        memory_rows = []
        for name in args.models:
            cells = []
            for length in args.lengths:
                found = [r for r in memory if r["model"] == name and r["length"] == length and r["mode"] == mode]
                cells.append(f"{found[0]['peak_rss_mib']:.0f} ({found[0]['delta_rss_mib']:.0f})" if found else "-")
            memory_rows.append([name, *cells])
        parts.append(f"Peak RSS, {title}, MiB (in parentheses: the rise over the RSS before the step):\n\n"
                     + common.markdown_table(["model", *(f"{n}" for n in args.lengths)], memory_rows))  # fmt: skip
    floor_rows = []
    for record in payload["products"]:
        train = next((r for r in speed if r["mode"] == "train" and r["length"] == record["length"]), None)
        if train is None:
            continue
        tff, identity, hf = (_median(train, m) for m in ("tff", "tff-identity", "transformers"))
        bound = identity + record["products_s"]
        floor_rows.append([record["length"], common.format_seconds(tff), common.format_seconds(identity),
                           common.format_seconds(record["products_s"]), common.format_seconds(bound),
                           f"{tff / bound:.2f}x", common.format_seconds(hf), f"{hf / tff:.2f}x",
                           f"{hf / bound:.2f}x"])  # fmt: skip
    if floor_rows:
        parts.append("**Floor** of the training step: tff with its attention kernels and hashing replaced by the "
                     "identity, plus the attention's matrix products timed alone (module docstring). tff / floor "
                     "is tff's distance to it; transformers / floor the best speed-up any implementation of the "
                     "same attention on the same linear algebra could reach:\n\n" + common.markdown_table(
                         ["tokens", "tff step", "identity-attention step", "attention products", "floor",
                          "tff / floor", "transformers step", "transformers / tff", "transformers / floor"],
                         floor_rows))  # fmt: skip
    depth_rows = [[r["layers"], r["model"], f"{r['peak_rss_mib']:.0f}", f"{r['delta_rss_mib']:.0f}"] for r in depth]
    parts.append(f"Training memory against depth at {args.depth_length} tokens (tff = reversible, the last layer "
                 "keeping its graph; tff-plain = plain backprop), MiB:\n\n"
                 + common.markdown_table(["layers", "model", "peak RSS", "rise"], depth_rows))  # fmt: skip
    if payload["skipped"]:
        parts.append("Not measured: " + "; ".join(payload["skipped"]) + ".")
    return "\n\n".join(parts)


if __name__ == "__main__":
    main()
