"""tf_family Longformer and BigBird against transformers' LongformerModel / BigBirdModel (block_sparse) and a dense
SDPA encoder: forward time, forward+backward time and peak memory from 512 to 16384 tokens.

    .venv/bin/python bench/bench_sparse_attention.py                       # full sweep (about an hour on 2 cores)
    .venv/bin/python bench/bench_sparse_attention.py --quick               # 512 and 1024 tokens, 1 repeat, < 2 min
    .venv/bin/python bench/bench_sparse_attention.py --lengths 4096 --models tff_longformer hf_longformer

Config (every model, as in the project's peer baselines): hidden 256, 4 layers, 4 heads x 64, FFN 1024, vocab
32000, dropout 0.1, batch 1, fp32, positions for 16384 tokens. Longformer: window 256 (128 per side), token 0
global. BigBird: block 64, 3 random blocks. Dense: transformers `BertModel` with SDPA attention.

The parent process builds one random transformers Longformer and one BigBird, saves them, and converts them to the
tf_family format (`tf-family convert`); each side loads its folder with `from_pretrained`, so both run identical
weights and the summed
eval output is printed as a same-weights check (BigBird: tf_family imports transformers' eval pattern). Every
measurement -- model, length, mode -- runs in a fresh subprocess; its peak-RSS counter is reset once the model and
the input are built (Linux ``/proc/self/clear_refs``; elsewhere ``ru_maxrss``, which then includes loading), so the
peak is that of the measured calls, and "delta" is the peak minus the RSS after the build. A subprocess that fails (out of
memory under `--max-gb`, or over `--timeout`) is recorded as failed and the sweep goes on.

forward = eval mode under `torch.no_grad()`; train = train mode, forward + backward of the mean squared output.

`--interleave-rounds N` (with `--interleave-lengths`) also times each tf_family / transformers pair in one
subprocess: both models built, two warm-up calls each, then N rounds of one call of each, alternating, so that the
drift of a shared machine's load hits both sides alike; the table gives both medians, their ratio and the range of
the per-round ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's tf_family, not an installed one
import common  # noqa: E402

MODELS = ("tff_longformer", "hf_longformer", "tff_big_bird", "hf_big_bird", "dense_sdpa")
LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)
MAX_POSITIONS = 16384
BODY = dict(  # noqa: C408
    vocab_size=32000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
    hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
)  # fmt: skip
RESULT_TAG = "RESULT_JSON "


# ------------------------------------------------------------------------------------------------------- workers
def make_checkpoints(folder: str) -> None:
    import torch
    from transformers import BigBirdConfig, BigBirdModel, LongformerConfig, LongformerModel

    torch.manual_seed(0)
    LongformerModel(
        LongformerConfig(**BODY, attention_window=256, max_position_embeddings=MAX_POSITIONS + 2, type_vocab_size=1)
    ).save_pretrained(os.path.join(folder, "longformer"))
    torch.manual_seed(0)
    BigBirdModel(
        BigBirdConfig(**BODY, block_size=64, num_random_blocks=3, max_position_embeddings=MAX_POSITIONS)
    ).save_pretrained(os.path.join(folder, "big_bird"))
    # tf_family side: converted once (what `tf-family convert` writes), then loaded like any tf_family checkpoint
    from tf_family.conversion import convert_folder
    from tf_family.registry import get_arch

    for name in ("longformer", "big_bird"):
        spec = get_arch(name)
        convert_folder(
            os.path.join(folder, name),
            os.path.join(folder, f"tff_{name}"),
            spec.model_classes,
            spec.foreign_formats[0],
        )


def _build(model_name: str, folder: str):
    if model_name == "hf_longformer":
        from transformers import LongformerModel

        return LongformerModel.from_pretrained(os.path.join(folder, "longformer"))
    if model_name == "hf_big_bird":
        from transformers import BigBirdModel

        return BigBirdModel.from_pretrained(os.path.join(folder, "big_bird"))
    if model_name == "tff_longformer":
        from tf_family import TffLongformerModel

        return TffLongformerModel.from_pretrained(os.path.join(folder, "tff_longformer"))
    if model_name == "tff_big_bird":
        from tf_family import TffBigBirdModel

        return TffBigBirdModel.from_pretrained(os.path.join(folder, "tff_big_bird"))
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    return BertModel._from_config(
        BertConfig(**BODY, max_position_embeddings=MAX_POSITIONS), attn_implementation="sdpa"
    )


def _status_mib(field: str) -> float | None:
    """``VmRSS`` / ``VmHWM`` of this process from /proc (Linux), in MiB."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS counter (Linux >= 4.0), so that loading the model does not count as the peak."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _inputs(model_name: str, length: int) -> dict:
    import torch

    generator = torch.Generator().manual_seed(length)
    inputs = {"input_ids": torch.randint(5, BODY["vocab_size"], (1, length), generator=generator)}
    if "longformer" in model_name:
        global_mask = torch.zeros(1, length, dtype=torch.long)
        global_mask[:, 0] = 1
        inputs["global_attention_mask"] = global_mask
    return inputs


def _step(model, inputs: dict, mode: str):
    """forward: eval mode under `torch.no_grad()`, returns the output; train: forward + backward of the mean square."""
    import torch

    if mode == "forward":
        model.eval()

        def step():
            with torch.no_grad():
                return model(**inputs).last_hidden_state

        return step
    model.train()

    def step():
        model.zero_grad(set_to_none=True)
        model(**inputs).last_hidden_state.pow(2).mean().backward()

    return step


def pair_worker(ours: str, theirs: str, length: int, mode: str, folder: str, rounds: int) -> dict:
    """Both models in one process, timed by `common.time_interleaved`: a shared machine's drift hits both alike."""
    common.setup_threads()
    steps = {name: _step(_build(name, folder), _inputs(name, length), mode) for name in (ours, theirs)}
    times = common.time_interleaved(steps, rounds)
    return {
        "ours": ours,
        "theirs": theirs,
        "length": length,
        "mode": mode,
        "times_s": times,
        "loadavg_end": common.loadavg(),
    }


def worker(model_name: str, length: int, mode: str, folder: str, repeats: int, cap_s: float) -> dict:
    import resource

    common.setup_threads()
    import torch

    model = _build(model_name, folder)
    inputs = _inputs(model_name, length)
    reset = _reset_peak_rss()
    rss_built = _status_mib("VmRSS") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    step = _step(model, inputs, mode)
    checksum = None
    if mode == "forward":
        output = step().double()  # (1, T, D); a position-free weighting of the features (layer norm zeroes plain sums)
        checksum = float((output * torch.linspace(-1, 1, output.shape[-1], dtype=torch.float64)).sum())
    timing = common.time_callable(step, repeats=repeats, max_repeats=max(repeats, 5), min_total_s=0.0, cap_s=cap_s)
    peak = _status_mib("VmHWM") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "model": model_name,
        "length": length,
        "mode": mode,
        "timing": timing.to_dict(),
        "peak_rss_mib": round(peak, 1),
        "delta_rss_mib": round(peak - rss_built, 1),
        "peak_counter_reset_after_build": reset,
        "checksum": checksum,
        "parameters": sum(p.numel() for p in model.parameters()),
    }


def run_worker(args: list[str], max_gb: float, timeout: float, flag: str = "--worker") -> dict:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    command = [sys.executable, __file__, flag, *args, "--max-gb", str(max_gb)]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout:.0f} s"}
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG) :])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
    return {"error": f"exit {proc.returncode}: {tail[0][:200]}"}


# ----------------------------------------------------------------------------------------------------- reporting
def _cell(record: dict | None) -> str:
    if record is None:
        return "—"
    if "error" in record:
        return "failed"
    timing = record["timing"]
    flag = f" n={timing['n']}" if timing.get("flag") else ""
    return f"{common.format_seconds(timing['median_s'])} (min {common.format_seconds(timing['min_s'])}){flag}"


def interleaved_markdown(pairs: list[dict]) -> str:
    rows = []
    for pair in pairs:
        label = f"{pair['theirs']} / {pair['ours']}, L={pair['length']}, {pair['mode']}"
        if "error" in pair:
            rows.append([label, "failed", "failed", "—", "—"])
            continue
        ours = statistics.median(pair["times_s"][pair["ours"]])
        theirs = statistics.median(pair["times_s"][pair["theirs"]])
        per_round = [
            b / a for a, b in zip(pair["times_s"][pair["ours"]], pair["times_s"][pair["theirs"]], strict=True)
        ]
        rows.append([
            label, common.format_seconds(ours), common.format_seconds(theirs), f"{theirs / ours:.2f}x",
            f"{min(per_round):.2f}-{max(per_round):.2f}x",
        ])  # fmt: skip
    rounds = len(next(iter(pairs[0]["times_s"].values()))) if pairs and "error" not in pairs[0] else 0
    return (
        f"#### Interleaved in one process ({rounds} rounds, one call of each model per round, after two warm-up calls "
        "each): medians and the ratio\n\n"
        + common.markdown_table(["pair", "tf_family", "transformers", "speed-up", "per-round range"], rows)
    )


def markdown(records: list[dict], models: list[str], lengths: list[int], modes: list[str]) -> str:
    table = {(r["model"], r["length"], r["mode"]): r for r in records}
    parts = []
    for mode in modes:
        title = "Forward (eval, no_grad)" if mode == "forward" else "Forward + backward (train mode)"
        rows = [[model, *(_cell(table.get((model, length, mode))) for length in lengths)] for model in models]
        parts.append(f"#### {title}, batch 1: median (min)\n\n" + common.markdown_table(
            ["model", *(f"L={length}" for length in lengths)], rows))  # fmt: skip
        ratio_rows = []
        for ours, theirs in (("tff_longformer", "hf_longformer"), ("tff_big_bird", "hf_big_bird")):
            if ours in models and theirs in models:
                cells = []
                for length in lengths:
                    a, b = table.get((ours, length, mode)), table.get((theirs, length, mode))
                    ok = a and b and "error" not in a and "error" not in b
                    cells.append(f"{b['timing']['median_s'] / a['timing']['median_s']:.2f}x" if ok else "—")
                ratio_rows.append([f"{theirs} / {ours}", *cells])
        if ratio_rows:
            parts.append("Speed-up of tf_family (transformers median / tf_family median):\n\n" + common.markdown_table(
                ["pair", *(f"L={length}" for length in lengths)], ratio_rows))  # fmt: skip
        memory_rows = []
        for model in models:
            cells = []
            for length in lengths:
                record = table.get((model, length, mode))
                ok = record and "error" not in record
                cells.append(f"{record['peak_rss_mib']:.0f} ({record['delta_rss_mib']:.0f})" if ok else _cell(record))
            memory_rows.append([model, *cells])
        parts.append(f"Peak RSS, {mode}, MiB (in parentheses: peak minus RSS after model + input build):\n\n"
                     + common.markdown_table(["model", *(f"L={length}" for length in lengths)], memory_rows))  # fmt: skip
    checks = []
    for family in ("longformer", "big_bird"):
        for length in lengths:
            a, b = table.get((f"tff_{family}", length, "forward")), table.get((f"hf_{family}", length, "forward"))
            if a and b and a.get("checksum") is not None and b.get("checksum") is not None:
                checks.append(f"{family} L={length}: tf_family {a['checksum']:.5f}, transformers {b['checksum']:.5f}")
    if checks:
        parts.append(
            "Same weights, checksum of the eval output (features weighted -1..1, summed): " + "; ".join(checks) + "."
        )
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--lengths", nargs="+", type=int, default=list(LENGTHS))
    parser.add_argument("--modes", nargs="+", default=["forward", "train"], choices=["forward", "train"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cap-s", type=float, default=60.0, help="time budget of one measurement's repeats")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds before a measurement is abandoned")
    parser.add_argument("--max-gb", type=float, default=20.0, help="address-space limit of each measurement")
    parser.add_argument("--quick", action="store_true", help="512 and 1024 tokens, one repeat (a smoke run)")
    parser.add_argument("--name", default=None, help="results file name (default sparse_attention[_quick])")
    parser.add_argument(
        "--interleave-rounds", type=int, default=0,
        help="also time each tf_family / transformers pair in one process, alternating call by call, N rounds",
    )  # fmt: skip
    parser.add_argument(
        "--interleave-lengths", nargs="+", type=int, help="lengths of the interleaved pairs (default: --lengths)"
    )
    parser.add_argument("--worker", nargs=5, metavar=("MODEL", "LENGTH", "MODE", "FOLDER", "REPEATS"))
    parser.add_argument("--pair-worker", nargs=6, metavar=("OURS", "THEIRS", "LENGTH", "MODE", "FOLDER", "ROUNDS"))
    args = parser.parse_args(argv)

    if args.worker or args.pair_worker:
        import resource

        limit = int(args.max_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        if args.worker:
            model_name, length, mode, folder, repeats = args.worker
            result = worker(model_name, int(length), mode, folder, int(repeats), args.cap_s)
        else:
            ours, theirs, length, mode, folder, rounds = args.pair_worker
            result = pair_worker(ours, theirs, int(length), mode, folder, int(rounds))
        print(RESULT_TAG + json.dumps(result))
        return

    if args.quick:
        args.lengths, args.repeats = [512, 1024], 1
    name = args.name or ("sparse_attention_quick" if args.quick else "sparse_attention")
    records = []
    with tempfile.TemporaryDirectory() as folder:
        common.setup_threads()
        make_checkpoints(folder)
        for length in args.lengths:
            for mode in args.modes:
                for model_name in args.models:
                    worker_args = [model_name, str(length), mode, folder, str(args.repeats)]
                    record = run_worker(worker_args, args.max_gb, args.timeout)
                    record.update({"model": model_name, "length": length, "mode": mode})
                    records.append(record)
                    print(f"{model_name:>15} L={length:<6} {mode:<8} {_cell(record)}", flush=True)
        pairs = []
        for length in args.interleave_lengths or args.lengths if args.interleave_rounds else []:
            for mode in args.modes:
                for ours, theirs in (("tff_longformer", "hf_longformer"), ("tff_big_bird", "hf_big_bird")):
                    if ours not in args.models or theirs not in args.models:
                        continue
                    pair_args = [ours, theirs, str(length), mode, folder, str(args.interleave_rounds)]
                    record = run_worker(pair_args, args.max_gb, args.timeout, flag="--pair-worker")
                    record.update({"ours": ours, "theirs": theirs, "length": length, "mode": mode})
                    pairs.append(record)
                    print(interleaved_markdown([record]).splitlines()[-1], flush=True)
    payload = {"config": {**BODY, "longformer_window": 256, "big_bird_block": 64, "big_bird_random_blocks": 3},
               "args": {k: v for k, v in vars(args).items() if k not in ("worker", "pair_worker")},
               "records": records, "interleaved": pairs}  # fmt: skip
    text = markdown(records, args.models, args.lengths, args.modes)
    if pairs:
        text += "\n\n" + interleaved_markdown(pairs)
    json_path, md_path = common.write_results(name, payload, text)
    print(f"wrote {json_path} and {md_path}")


if __name__ == "__main__":
    main()
