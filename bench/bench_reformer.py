"""Reformer: tf_family against transformers' `ReformerModelWithLMHead` on the same weights, and a dense baseline.

Speed: forward (eval, no gradient) and forward+backward (training, dropout 0) of a causal LM at each length, the
models of one (length, mode) timed interleaved in one process (`common.time_interleaved`). Models:

- ``transformers``: transformers 5.23 `ReformerModelWithLMHead` (absolute positions: its axial positions train
  only at exactly ``prod(axial_pos_shape)`` tokens);
- ``tff-compat``: `TffReformerForCausalLM.from_pretrained` of that folder (``chunk_wrap_around=True``: the same
  function, outputs within 1e-5);
- ``tff``: the same weights with tf_family's own chunking (``chunk_wrap_around=False``);
- ``dense``: the same weights with chunks covering the input (full shared-QK / full causal attention, through
  `tf_family.attention.attend`, i.e. PyTorch SDPA or the native CPU kernel): the quadratic baseline.

Memory: every (model, length, mode) in a fresh subprocess, peak RSS after the model and input are built (Linux
``clear_refs``), and the activation memory of training at 2/4/8/12 layers, reversible against plain backprop.

    python bench/bench_reformer.py --lengths 1024 2048 4096 --rounds 3
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
import common  # noqa: E402

BODY = dict(  # noqa: C408  (the research anchor's shape: width 256, 4 layers, 2 LSH)
    vocab_size=256, hidden_size=256, num_attention_heads=4, attention_head_size=64, feed_forward_size=1024,
    attn_layers=["local", "lsh", "local", "lsh"], local_attn_chunk_length=64, lsh_attn_chunk_length=64,
    num_hashes=2, num_buckets=64, hash_seed=0, axial_pos_embds=False, is_decoder=True,
    hidden_dropout_prob=0.0, local_attention_probs_dropout_prob=0.0, lsh_attention_probs_dropout_prob=0.0,
)  # fmt: skip
MODELS = ("transformers", "tff-compat", "tff", "dense")


def _save_reference(folder: str, max_length: int, layers: list[str] | None = None) -> None:
    import torch
    from transformers import ReformerConfig, ReformerModelWithLMHead

    torch.manual_seed(0)
    body = {**BODY, "max_position_embeddings": max_length}
    if layers is not None:
        body["attn_layers"] = layers
    ReformerModelWithLMHead(ReformerConfig(**body)).save_pretrained(folder)


def _build(name: str, folder: str, length: int):
    import transformers

    import tf_family

    transformers.logging.set_verbosity_error()
    if name == "transformers":
        return transformers.ReformerModelWithLMHead.from_pretrained(folder)
    overrides = {
        "tff-compat": {},
        "tff": {"chunk_wrap_around": False},
        "dense": {"chunk_wrap_around": False, "lsh_attn_chunk_length": length, "local_attn_chunk_length": length},
        "tff-plain": {"chunk_wrap_around": False, "reversible": False},
    }[name]
    return tf_family.TffReformerForCausalLM.from_pretrained(folder, **overrides)


def _step(model, length: int, mode: str):
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

    return step


def speed_worker(length: int, mode: str, folder: str, rounds: int, models: list[str]) -> dict:
    common.setup_threads()
    steps = {name: _step(_build(name, folder, length), length, mode) for name in models}
    times = common.time_interleaved(steps, rounds, warmups=1)
    return {"length": length, "mode": mode, "times_s": times, "loadavg_end": common.loadavg()}


def _status_mib(field: str) -> float | None:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return None


def memory_worker(name: str, length: int, mode: str, folder: str) -> dict:
    common.setup_threads()
    step = _step(_build(name, folder, length), length, mode)
    Path("/proc/self/clear_refs").write_text("5")
    built = _status_mib("VmRSS")
    step()
    peak = _status_mib("VmHWM")
    return {"model": name, "length": length, "mode": mode, "peak_rss_mib": round(peak, 1),
            "delta_rss_mib": round(peak - built, 1)}  # fmt: skip


def _run(args: list[str], timeout: float) -> dict | None:
    result = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if result.returncode != 0:
        print(result.stderr[-2000:], flush=True)
        return None
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--memory-models", nargs="+", default=["transformers", "tff", "dense"], choices=MODELS)
    parser.add_argument("--depths", type=int, nargs="*", default=[2, 4, 8, 12])
    parser.add_argument("--depth-length", type=int, default=2048)
    parser.add_argument("--timeout", type=float, default=1200)
    parser.add_argument("--name", default="reformer")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, *rest = args.worker
        if kind == "speed":
            length, mode, folder, rounds, *models = rest
            print(json.dumps(speed_worker(int(length), mode, folder, int(rounds), models)))
        else:
            name, length, mode, folder = rest
            print(json.dumps(memory_worker(name, int(length), mode, folder)))
        return

    common.setup_threads()
    speed, memory, depth = [], [], []
    with tempfile.TemporaryDirectory() as folder:
        _save_reference(folder, max(args.lengths))
        for length in args.lengths:
            for mode in ("forward", "train"):
                record = _run(["--worker", "speed", str(length), mode, folder, str(args.rounds), *args.models],
                              args.timeout)  # fmt: skip
                print(record, flush=True)
                if record:
                    speed.append(record)
                for name in args.memory_models:
                    record = _run(["--worker", "memory", name, str(length), mode, folder], args.timeout)
                    print(record, flush=True)
                    if record:
                        memory.append(record)
    for layers in args.depths:
        with tempfile.TemporaryDirectory() as folder:
            _save_reference(folder, args.depth_length, ["local", "lsh"] * (layers // 2))
            for name in ("tff", "tff-plain"):
                record = _run(["--worker", "memory", name, str(args.depth_length), "train", folder], args.timeout)
                print(layers, record, flush=True)
                if record:
                    depth.append({**record, "layers": layers})

    parts = ["Reformer causal LM (width 256, 4 layers local/LSH, 4 heads x 64, chunks 64, 2 hashes, 64 buckets, "
             "batch 1), tf_family vs transformers 5.23 on the same weights. The machine is shared with other "
             "engineers' jobs (loadavg in the footer): ratios are from medians of one interleaved run."]  # fmt: skip
    for mode in ("forward", "train"):
        rows = []
        for record in (r for r in speed if r["mode"] == mode):
            medians = {name: statistics.median(times) for name, times in record["times_s"].items()}
            base = medians.get("transformers")
            rows.append([record["length"], *(common.format_seconds(medians[m]) for m in args.models if m in medians),
                         *(f"{base / medians[m]:.2f}x" for m in args.models if m != "transformers" and base)])  # fmt: skip
        others = [m for m in args.models if m != "transformers"]
        headers = ["length", *args.models, *(f"speed-up {m}" for m in others)]
        parts.append(f"**{'forward (eval)' if mode == 'forward' else 'forward + backward (train)'}**, median "
                     f"seconds:\n\n" + common.markdown_table(headers, rows))  # fmt: skip
        memory_rows = []
        for name in args.memory_models:
            cells = []
            for length in args.lengths:
                found = [r for r in memory if r["model"] == name and r["length"] == length and r["mode"] == mode]
                cells.append(f"{found[0]['peak_rss_mib']:.0f} ({found[0]['delta_rss_mib']:.0f})" if found else "-")
            memory_rows.append([name, *cells])
        parts.append(f"Peak RSS, {mode}, MiB (in parentheses: peak minus RSS after build):\n\n"
                     + common.markdown_table(["model", *(f"L={n}" for n in args.lengths)], memory_rows))  # fmt: skip
    depth_rows = [[r["layers"], r["model"], f"{r['peak_rss_mib']:.0f}", f"{r['delta_rss_mib']:.0f}"] for r in depth]
    parts.append(f"Training memory against depth at {args.depth_length} tokens (tff = reversible, tff-plain = "
                 "plain backprop), MiB:\n\n" + common.markdown_table(["layers", "model", "peak RSS", "delta"],
                                                                     depth_rows))  # fmt: skip
    common.write_results(
        args.name,
        {"body": BODY, "lengths": args.lengths, "speed": speed, "memory": memory, "depth": depth},
        "\n\n".join(parts),
    )


if __name__ == "__main__":
    main()
