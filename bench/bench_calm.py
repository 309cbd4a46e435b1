"""CALM on the bundled State of the Union corpus: calibrated thresholds, held-out consistency, exit layers, and the
measured wall-clock speed-up of early exit against full depth, per confidence measure.

1. **Model**: a CALM decoder (``small`` variant: 8 layers, width 256, the bundled 8k tokenizer; exits after layers 2,
   4, 6, 8) trained from scratch with the anytime loss by ``recipes/causal_lm.py --arch calm`` (``--model`` points
   at the trained folder; the command that made it is in the results).
2. **Prompts**: windows of ``--prompt-length`` tokens plus a ``--new-tokens`` continuation cut from the validation
   addresses (1995-2009: calibration) and the test addresses (2010 on: held out).
3. **Learn-then-Test** per confidence measure (``softmax_diff`` over the full 8k vocabulary, ``restricted_softmax``
   over the 256 most frequent training tokens, ``state``, ``meta``): greedy generations at full depth and at every
   threshold of a descending grid, token-level consistency with the full model's output, Hoeffding–Bentkus
   p-values and fixed-sequence testing at δ ∈ {0.05, 0.1, 0.2}, ε = 0.05 (`tf_family.training.early_exit`). On the
   held-out prompts: the consistency (1 − token disagreement; the guarantee asks ≥ 1 − δ) and the mean exit layer.
   Also the violation rate over ``--splits`` random 80/20 calibration/test splits of all prompts (the paper's
   protocol), which must stay ≤ ε up to sampling noise.
4. **Speed**: greedy generation of ``--timed-prompts`` held-out prompts at batch 1 (one after another) and at batch
   8, full depth against each calibrated threshold, interleaved rounds (`common.time_interleaved`), medians;
   speed-up = full / early.
5. A histogram of the held-out exit layers at δ = 0.1 per measure (PNG).

Run (the model first: about 22 minutes on 2 shared cores; then about 16 minutes for the benchmark)::

    python recipes/causal_lm.py --arch calm --variant small --config_overrides first_exit=2 exit_interval=2 \
        decay_length=64 --block_size 128 --per_device_train_batch_size 8 --max_train_steps 260 \
        --learning_rate 2e-3 --num_warmup_steps 20 --max_eval_samples 2 --output_dir runs/calm-sotu
    cd bench && python bench_calm.py --model ../runs/calm-sotu
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

from common import RESULTS_DIR, loadavg, markdown_table, setup_threads, time_interleaved, write_results

setup_threads(2)

import torch  # noqa: E402  (after setup_threads: OpenMP reads OMP_WAIT_POLICY when torch loads)
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from transformers.utils import logging as transformers_logging  # noqa: E402

from tf_family.data import load_sotu  # noqa: E402
from tf_family.early_exit import calibrate_threshold  # noqa: E402
from tf_family.early_exit.calibration import hoeffding_bentkus_p_value  # noqa: E402
from tf_family.training.early_exit import DEFAULT_GRIDS, cut_prompts, generate_with_exits, score_grid  # noqa: E402

DELTAS = (0.05, 0.1, 0.2)
EPSILON = 0.05
GRIDS = {measure: DEFAULT_GRIDS[measure] for measure in ("softmax_diff", "restricted_softmax", "state", "meta")}
# the calibration sweep goes this many thresholds past the first failed test at the largest δ, so the random
# splits (which calibrate on subsets) see where their own tests fail; a split whose tests pass past the evaluated
# thresholds stops there (conservative: fewer rejections)
SPLIT_MARGIN = 2


def sweep_stopper():
    """A `score_grid` stop rule: true ``SPLIT_MARGIN`` thresholds after the first whose test fails at the largest
    δ (Hoeffding–Bentkus p-value > ε)."""
    since_failure = []

    def stop(losses: torch.Tensor) -> bool:
        p_value = hoeffding_bentkus_p_value(float(losses.mean()), losses.shape[0], max(DELTAS))
        if since_failure or p_value > EPSILON:
            since_failure.append(p_value)
        return len(since_failure) > SPLIT_MARGIN

    return stop


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="runs/calm-sotu", help="a tff_calm folder trained with the anytime loss")
    parser.add_argument("--prompt-length", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--calibration-prompts", type=int, default=64)
    parser.add_argument("--test-prompts", type=int, default=64)
    parser.add_argument("--timed-prompts", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--splits", type=int, default=50)
    parser.add_argument("--measures", nargs="+", default=list(GRIDS), choices=list(GRIDS))
    parser.add_argument("--restricted-vocab", type=int, default=256)
    parser.add_argument("--name", default="calm_sotu")
    parser.add_argument("--training", default="", help="how the model was trained (the command), for the table")
    return parser.parse_args()


def split_violation_rate(losses: torch.Tensor, grid, delta: float, trials: int, seed: int = 0) -> tuple[float, float]:
    """The paper's protocol on the pooled per-example losses: ``trials`` random 80/20 splits; calibrate on 80 %,
    measure the risk of the returned threshold on the other 20 %. Returns the violation rate and the mean test
    risk."""
    generator = torch.Generator().manual_seed(seed)
    n = losses.shape[0]
    violations, risks = 0, []
    for _ in range(trials):
        order = torch.randperm(n, generator=generator)
        calibration, test = order[: int(0.8 * n)], order[int(0.8 * n) :]
        result = calibrate_threshold(grid, losses[calibration], delta, EPSILON)
        risk = 0.0 if result.index is None else float(losses[test, result.index].mean())
        risks.append(risk)
        violations += risk > delta
    return violations / trials, sum(risks) / len(risks)


def main() -> None:
    args = parse_args()
    transformers_logging.set_verbosity_error()
    model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    config = model.config
    depth = config.num_hidden_layers
    sotu = load_sotu()

    def documents(split: str) -> list[list[int]]:
        return tokenizer(list(sotu[split]["text"]), add_special_tokens=False)["input_ids"]

    counts = Counter(token for document in documents("train") for token in document)
    restricted = sorted(token for token, _ in counts.most_common(args.restricted_vocab))
    cal_prompts, cal_gold = cut_prompts(documents("validation"), args.prompt_length, args.new_tokens)
    test_prompts, test_gold = cut_prompts(documents("test"), args.prompt_length, args.new_tokens)
    # spread over the addresses rather than the first few
    cal_index = torch.linspace(0, cal_prompts.shape[0] - 1, args.calibration_prompts).long()
    test_index = torch.linspace(0, test_prompts.shape[0] - 1, args.test_prompts).long()
    cal_prompts, cal_gold = cal_prompts[cal_index], cal_gold[cal_index]
    test_prompts, test_gold = test_prompts[test_index], test_gold[test_index]
    print(f"{cal_prompts.shape[0]} calibration and {test_prompts.shape[0]} held-out prompts", flush=True)

    full_cal = generate_with_exits(model, cal_prompts, args.new_tokens, 16, None)
    full_test = generate_with_exits(model, test_prompts, args.new_tokens, 16, None)
    rows, per_measure, thresholds_to_time = [], {}, {}
    for measure in args.measures:
        config.confidence_measure = measure
        config.restricted_vocab = restricted if measure == "restricted_softmax" else None
        cal = score_grid(model, cal_prompts, cal_gold, GRIDS[measure], "token", 16, full_cal, sweep_stopper())
        grid = cal.thresholds  # the evaluated prefix of the grid
        test = score_grid(model, test_prompts, test_gold, grid, "token", 16, full_test)
        pooled = torch.cat([cal.losses, test.losses])
        per_measure[measure] = {"grid": list(grid), "calibration_risks": cal.losses.mean(0).tolist(),
                                "test_risks": test.losses.mean(0).tolist(),
                                "test_mean_exit_layers": list(test.mean_exit_layers)}  # fmt: skip
        for delta in DELTAS:
            result = calibrate_threshold(grid, cal.losses, delta, EPSILON)
            index = result.index
            consistency = 1.0 - (0.0 if index is None else float(test.losses[:, index].mean()))
            mean_exit = float(depth) if index is None else test.mean_exit_layers[index]
            violation, mean_split_risk = split_violation_rate(pooled, grid, delta, args.splits)
            row = {
                "measure": measure, "delta": delta, "epsilon": EPSILON, "threshold": result.threshold,
                "calibration_risk": None if index is None else result.risks[index],
                "heldout_consistency": consistency, "heldout_mean_exit_layer": mean_exit,
                "split_violation_rate": violation, "split_mean_test_risk": mean_split_risk,
            }  # fmt: skip
            rows.append(row)
            print(row, flush=True)
            if result.threshold is not None:
                thresholds_to_time[(measure, delta)] = result.threshold

    # ---- wall clock ---------------------------------------------------------------------------------------------
    timed = test_prompts[: args.timed_prompts]

    def generation(measure: str | None, threshold: float | None, batch: int):
        def run():
            if measure is not None:
                config.confidence_measure = measure
                config.restricted_vocab = restricted if measure == "restricted_softmax" else None
            generate_with_exits(model, timed, args.new_tokens, batch, threshold)

        return run

    def truncated(layers: int, batch: int):
        """The model cut to its first ``layers`` layers (no exits): what a perfect exit policy could reach."""

        def run():
            config.num_hidden_layers = layers
            try:
                generate_with_exits(model, timed, args.new_tokens, batch, None)
            finally:
                config.num_hidden_layers = depth

        return run

    cut_depths = [
        layers for layer_count in range(1, depth) for layers in [layer_count] if layers % 2 == 0 or layers == 1
    ]
    timed_thresholds = sorted({(measure, threshold) for (measure, _), threshold in thresholds_to_time.items()})
    speed = {}
    for batch in (1, 8):
        steps = {"full": generation(None, None, batch)}
        steps.update({f"truncated@{layers}": truncated(layers, batch) for layers in cut_depths})
        steps.update({f"{m}@{t:g}": generation(m, t, batch) for m, t in timed_thresholds})
        load_before = loadavg()
        times = time_interleaved(steps, rounds=args.rounds, warmups=1)
        medians = {name: sorted(values)[len(values) // 2] for name, values in times.items()}
        speed[batch] = {"times_s": times, "median_s": medians, "loadavg": [load_before, loadavg()]}
        print(batch, medians, flush=True)

    def floor_time(batch: int, mean_exit: float) -> float:
        """The truncated model's time at ``mean_exit`` layers, interpolated linearly between the depths timed."""
        points = [(layers, speed[batch]["median_s"][f"truncated@{layers}"]) for layers in cut_depths]
        points.append((depth, speed[batch]["median_s"]["full"]))
        for (low, low_time), (high, high_time) in zip(points, points[1:], strict=False):
            if mean_exit <= high:
                weight = max(0.0, (mean_exit - low) / (high - low))
                return low_time + weight * (high_time - low_time)
        return points[-1][1]

    for row in rows:
        name = None if row["threshold"] is None else f"{row['measure']}@{row['threshold']:g}"
        for batch in (1, 8):
            full_time = speed[batch]["median_s"]["full"]
            median = speed[batch]["median_s"].get(name)
            row[f"speedup_batch{batch}"] = full_time / median if median else 1.0
            row[f"floor_speedup_batch{batch}"] = full_time / floor_time(batch, row["heldout_mean_exit_layer"])

    # ---- histogram ----------------------------------------------------------------------------------------------
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(args.measures), figsize=(3.2 * len(args.measures), 2.8), sharey=True)
    axes = [axes] if len(args.measures) == 1 else list(axes)
    histograms = {}
    for axis, measure in zip(axes, args.measures, strict=True):
        threshold = thresholds_to_time.get((measure, 0.1))
        config.confidence_measure = measure
        config.restricted_vocab = restricted if measure == "restricted_softmax" else None
        exits = generate_with_exits(model, test_prompts, args.new_tokens, 16, threshold).exit_layers.flatten()
        counts_by_layer = [int((exits == layer).sum()) for layer in range(1, depth + 1)]
        histograms[measure] = counts_by_layer
        axis.bar(range(1, depth + 1), counts_by_layer)
        label = "none certified" if threshold is None else f"λ={threshold:g}"
        axis.set_title(f"{measure}\n(δ=0.1, {label})", fontsize=9)
        axis.set_xlabel("exit layer")
    axes[0].set_ylabel("generated tokens")
    figure.tight_layout()
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    png = RESULTS_DIR / f"{args.name}_exit_histogram.png"
    figure.savefig(png, dpi=120)

    headers = ["measure", "δ", "λ (calibrated)", "held-out consistency", "mean exit layer", "violations (splits)",
               "speed-up b=1", "floor b=1", "speed-up b=8", "floor b=8"]  # fmt: skip
    table = [
        [r["measure"], r["delta"], "none" if r["threshold"] is None else f"{r['threshold']:g}",
         f"{r['heldout_consistency']:.3f}", f"{r['heldout_mean_exit_layer']:.2f} / {depth}",
         f"{r['split_violation_rate']:.2f}", f"{r['speedup_batch1']:.2f}x", f"{r['floor_speedup_batch1']:.2f}x",
         f"{r['speedup_batch8']:.2f}x", f"{r['floor_speedup_batch8']:.2f}x"]
        for r in rows
    ]  # fmt: skip
    full1, full8 = speed[1]["median_s"]["full"], speed[8]["median_s"]["full"]
    markdown = (
        f"# CALM early exit on the State of the Union corpus\n\nModel `{args.model}` ({depth} layers, exits after "
        f"{config.exit_points()}), {cal_prompts.shape[0]} calibration prompts (validation) and {test_prompts.shape[0]} "
        f"held-out prompts (test) of {args.prompt_length} tokens, {args.new_tokens} greedy new tokens; token "
        f"consistency with the full model; Learn-then-Test with Hoeffding–Bentkus p-values, ε = {EPSILON}. "
        f"Full depth: {full1:.3f} s for {args.timed_prompts} prompts at batch 1, {full8:.3f} s at batch 8 "
        f"(medians of {args.rounds} interleaved rounds, loadavg {speed[1]['loadavg']} and {speed[8]['loadavg']} "
        f"before/after the batch-1 and batch-8 timings: the machine is shared with other jobs). *floor*: the "
        f"speed-up of the model truncated to the mean exit layer (no exit checks, no propagation, the prompt "
        f"truncated too; interpolated between the truncated depths {cut_depths} timed in the same rounds): what a "
        f"perfect exit policy could reach. Model trained by: `{args.training or 'see --model'}`.\n\n"
        + markdown_table(headers, table)
        + f"\n\nExit-layer histogram: `{png.name}`.\n"
    )
    payload = {"args": vars(args), "model_config": config.to_dict(), "rows": rows, "per_measure": per_measure,
               "speed": {str(k): v for k, v in speed.items()}, "histograms": histograms}  # fmt: skip
    json_path, md_path = write_results(args.name, json.loads(json.dumps(payload, default=str)), markdown)
    print(md_path.read_text())


if __name__ == "__main__":
    main()
