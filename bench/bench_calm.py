"""CALM on the bundled State of the Union corpus: calibrated thresholds, held-out consistency, exit layers, and the
measured wall-clock speed-up of early exit against full depth, per confidence measure, with where the time goes.

1. **Model**: a CALM decoder (``small`` variant: 8 layers, width 256, the bundled 8k tokenizer; exits after layers 2,
   4, 6, 8) trained from scratch with the anytime loss and its meta classifier by ``recipes/causal_lm.py --arch
   calm`` (``--model`` points at the trained folder; ``--training`` records the command that made it). Decoding can
   use fewer exits than were trained (``--first-exit``, ``--exit-interval``): ``--first-exit 2 --exit-interval 6``
   keeps the exits after 2 and 8, so a token that runs the full depth pays one check instead of three.
2. **Prompts**: windows of ``--prompt-length`` tokens plus a ``--new-tokens`` continuation cut from the validation
   addresses (1995-2009: calibration) and the test addresses (2010 on: held out).
3. **Learn-then-Test** per confidence measure (``softmax_diff`` and ``softmax_max`` over the full 8k vocabulary,
   ``restricted_softmax`` over the 256 most frequent training tokens, ``state``, ``meta``): greedy generations at
   full depth and at every threshold of a descending grid, token-level consistency with the full model's output,
   Hoeffding–Bentkus p-values and fixed-sequence testing at δ ∈ {0.05, 0.1, 0.2}, ε = 0.05
   (`tf_family.training.early_exit`). On the held-out prompts: the consistency (1 − token disagreement; the
   guarantee asks ≥ 1 − δ) and the mean exit layer. Also the violation rate over ``--splits`` random 80/20
   calibration/test splits of all prompts (the paper's protocol), which must stay ≤ ε up to sampling noise.
4. **Speed**: greedy ``generate`` of ``--timed-prompts`` held-out prompts at batch 1 (one after another) and at
   batch 8, full depth against each calibrated threshold, all in interleaved rounds (`common.time_interleaved`),
   medians; speed-up = full / early. In the same rounds, to see where the time goes: the model truncated to each
   exit depth (its slope over depth is the cost of one layer per decode step, its intercept the fixed cost), every
   token forced out at the first exit with no confidence computed (``exit_layer``: the *floor*, the best this exit
   layout allows), and per measure a threshold no confidence reaches (every check runs, no token leaves: the cost
   of one check) and λ = 0 (every generated token leaves at its first check).
5. A histogram of the held-out exit layers at δ = 0.1 per measure (PNG).
6. **Baseline** (``--baseline``): a smaller decoder trained alone with the same data and steps (2 layers: the depth
   most tokens leave at), timed in the same rounds, with both models' validation perplexities: whether early exit
   beats simply training a smaller model.

``--threads`` sets the intra-op threads of everything timed (default 2).

Run (the models first: about 15 and 4 minutes on 2 cores; then about 15 minutes for the benchmark)::

    OMP_WAIT_POLICY=PASSIVE python recipes/causal_lm.py --arch calm --variant small \
        --config_overrides first_exit=2 exit_interval=2 decay_length=64 distillation_weight=3.0 aggregation=uniform \
        --block_size 64 --per_device_train_batch_size 8 --max_train_steps 1100 --learning_rate 2e-3 \
        --num_warmup_steps 30 --checkpointing_steps 100 --output_dir runs/calm-sotu-distill3
    OMP_WAIT_POLICY=PASSIVE python recipes/causal_lm.py --arch calm --variant small \
        --config_overrides num_hidden_layers=2 first_exit=2 exit_interval=1 decay_length=64 aggregation=uniform \
        --block_size 64 --per_device_train_batch_size 8 --max_train_steps 1100 --learning_rate 2e-3 \
        --num_warmup_steps 30 --checkpointing_steps 100 --output_dir runs/calm-sotu-2layer
    cd bench && OMP_WAIT_POLICY=PASSIVE python bench_calm.py --model ../runs/calm-sotu-distill3 \
        --first-exit 2 --exit-interval 6 --baseline ../runs/calm-sotu-2layer
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
from collections import Counter
from pathlib import Path

from common import RESULTS_DIR, loadavg, markdown_table, setup_threads, time_interleaved, write_results

setup_threads(2)

import torch  # noqa: E402  (after setup_threads: OpenMP reads OMP_WAIT_POLICY when torch loads)
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from transformers.utils import logging as transformers_logging  # noqa: E402

from tf_family.data import load_sotu  # noqa: E402
from tf_family.early_exit import calibrate_threshold  # noqa: E402
from tf_family.early_exit.calibration import hoeffding_bentkus_p_value  # noqa: E402
from tf_family.modeling import utils as modeling_utils  # noqa: E402
from tf_family.modeling.cache import GrowingCache  # noqa: E402
from tf_family.training.early_exit import DEFAULT_GRIDS, cut_prompts, generate_with_exits, score_grid  # noqa: E402

DELTAS = (0.05, 0.1, 0.2)
EPSILON = 0.05
MEASURES = ("softmax_diff", "softmax_max", "restricted_softmax", "state", "meta")
GRIDS = {measure: DEFAULT_GRIDS[measure] for measure in MEASURES}
NEVER = 2.0  # above every measure's range (probabilities, cosines): every check runs and no token leaves
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
    parser.add_argument(
        "--model", default="../runs/calm-sotu-distill3", help="a tff_calm folder trained with the anytime loss"
    )
    parser.add_argument("--prompt-length", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--calibration-prompts", type=int, default=64)
    parser.add_argument("--test-prompts", type=int, default=64)
    parser.add_argument("--timed-prompts", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--splits", type=int, default=50)
    parser.add_argument("--measures", nargs="+", default=list(GRIDS), choices=list(GRIDS))
    parser.add_argument("--restricted-vocab", type=int, default=256)
    parser.add_argument(
        "--first-exit",
        type=int,
        help="decode with exits from this layer on (default: the model's config; the anytime loss trained them all)",
    )
    parser.add_argument(
        "--exit-interval", type=int, help="layers between the exits used when decoding (default: the model's config)"
    )
    parser.add_argument(
        "--baseline",
        help="a smaller model trained alone on the same data and budget (e.g. 2 layers): timed in the same rounds, "
        "its validation perplexity (its training_run.json) quoted beside this model's",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=2,
        help="intra-op threads for everything timed (decoding small batches can be faster on 1 than on 2)",
    )
    parser.add_argument("--name", default="calm_sotu")
    parser.add_argument("--training", default="", help="how the model was trained (the command), for the table")
    return parser.parse_args()


def validation_perplexity(folder: str) -> str:
    """The validation perplexity a recipe wrote into ``folder``'s training_run.json ("unknown" without one)."""
    path = Path(folder) / "training_run.json"
    if not path.is_file():
        return "unknown"
    metrics = json.loads(path.read_text()).get("metrics", {})
    return f"{metrics['perplexity']:.0f}" if "perplexity" in metrics else "unknown"


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
    torch.set_num_threads(args.threads)
    transformers_logging.set_verbosity_error()
    model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    baseline = AutoModelForCausalLM.from_pretrained(args.baseline).eval() if args.baseline else None
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    config = model.config
    trained_exits = config.exit_points()
    for field, value in (("first_exit", args.first_exit), ("exit_interval", args.exit_interval)):
        if value is not None:
            setattr(config, field, value)
    config.validate_architecture()
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
    first_exit = config.exit_points()[0]
    checks_per_token = {  # exit checks a token that never leaves makes (state has no check at its first exit)
        measure: sum(1 for point in config.exit_points()[:-1] if point >= config.min_exit) - (measure == "state")
        for measure in args.measures
    }

    def use(measure: str | None) -> None:
        if measure is not None:
            config.confidence_measure = measure
            config.restricted_vocab = restricted if measure == "restricted_softmax" else None

    def generation(measure: str | None, threshold: float | None, batch: int):
        def run():
            use(measure)
            generate_with_exits(model, timed, args.new_tokens, batch, threshold)

        return run

    def forced(layers: int, batch: int):
        """The prompt at full depth (as with a threshold), then every generated token forced out after ``layers``
        layers with the layers above propagated and no confidence computed (``exit_layer``): the best case of this
        exit layout. Same ``generate`` calls as the others: the prompt's forward fills the cache first."""
        pad = config.pad_token_id if config.pad_token_id is not None else 0

        @torch.no_grad()
        def run():
            for start in range(0, timed.shape[0], batch):
                rows = timed[start : start + batch]
                cache = GrowingCache(config, reserve=rows.shape[1] + args.new_tokens)  # what generate makes
                first = model(rows, cache=cache, use_cache=True).logits[:, -1:].argmax(-1)
                rows = torch.cat([rows, first], dim=1)
                model.generate(rows, attention_mask=torch.ones_like(rows), cache=cache,
                               max_new_tokens=args.new_tokens - 1, min_new_tokens=args.new_tokens - 1,
                               do_sample=False, exit_layer=layers, pad_token_id=pad)  # fmt: skip

        return run

    def truncated(layers: int, batch: int):
        """The model cut to its first ``layers`` layers (no exits, no propagation)."""

        def run():
            config.num_hidden_layers = layers
            try:
                generate_with_exits(model, timed, args.new_tokens, batch, None)
            finally:
                config.num_hidden_layers = depth

        return run

    def copying_weights(step):
        """``step`` with the projections' weights concatenated at every call, as before decoding called them one by
        one (`modeling_utils.FUSE_MIN_ROWS` = 0)."""

        def run():
            saved = modeling_utils.FUSE_MIN_ROWS
            modeling_utils.FUSE_MIN_ROWS = 0
            try:
                step()
            finally:
                modeling_utils.FUSE_MIN_ROWS = saved

        return run

    cut_depths = config.exit_points()[:-1]
    timed_thresholds = sorted({(measure, threshold) for (measure, _), threshold in thresholds_to_time.items()})
    speed = {}
    for batch in (1, 8):
        steps = {"full": generation(None, None, batch), f"forced@{first_exit}": forced(first_exit, batch)}
        steps["full, weights copied"] = copying_weights(steps["full"])
        steps[f"forced@{first_exit}, weights copied"] = copying_weights(steps[f"forced@{first_exit}"])
        steps.update({f"truncated@{layers}": truncated(layers, batch) for layers in cut_depths})
        # NEVER: confidences above every measure's range, so every check runs and no token leaves (the checks'
        # cost); 0: every generated token leaves at its first check (the best case with the measure's cost)
        steps.update({f"{m}@never": generation(m, NEVER, batch) for m in args.measures})
        steps.update({f"{m}@0": generation(m, 0.0, batch) for m in args.measures})
        steps.update({f"{m}@{t:g}": generation(m, t, batch) for m, t in timed_thresholds})  # "@0": same step
        if baseline is not None:
            steps["baseline"] = functools.partial(generate_with_exits, baseline, timed, args.new_tokens, batch, None)
        load_before = loadavg()
        times = time_interleaved(steps, rounds=args.rounds, warmups=1)
        medians = {name: statistics.median(values) for name, values in times.items()}
        decode_steps = -(-timed.shape[0] // batch) * args.new_tokens  # forward calls with one new token per row
        # per-layer cost: least-squares slope of the truncated models' times over their depths (full = depth)
        depths = [*cut_depths, depth]
        seconds = [medians[f"truncated@{layers}"] for layers in cut_depths] + [medians["full"]]
        mean_depth, mean_seconds = sum(depths) / len(depths), sum(seconds) / len(seconds)
        slope = sum((d - mean_depth) * (s - mean_seconds) for d, s in zip(depths, seconds, strict=True)) / sum(
            (d - mean_depth) ** 2 for d in depths
        )
        layer_ms = 1000 * slope / decode_steps
        costs = {
            "decode_steps": decode_steps,
            "full_step_ms": 1000 * medians["full"] / decode_steps,
            "layer_ms": layer_ms,
            # what does not scale with depth: generate's bookkeeping, embeddings, final norm and LM head
            "fixed_step_ms": 1000 * (mean_seconds - slope * mean_depth) / decode_steps,
            "floor_speedup": medians["full"] / medians[f"forced@{first_exit}"],
            # the same two with the weights concatenated at every step (the decode path before FUSE_MIN_ROWS)
            "copying_full_slowdown": medians["full, weights copied"] / medians["full"],
            "copying_floor_speedup": medians["full, weights copied"] / medians[f"forced@{first_exit}, weights copied"],
            "check_ms": {},
            "check_layers": {},
            "best_speedup": {},
        }
        for m in args.measures:
            extra_ms = 1000 * (medians[f"{m}@never"] - medians["full"]) / decode_steps / max(checks_per_token[m], 1)
            costs["check_ms"][m] = extra_ms
            costs["check_layers"][m] = extra_ms / layer_ms if layer_ms > 0 else float("nan")
            costs["best_speedup"][m] = medians["full"] / medians[f"{m}@0"]
        speed[batch] = {"times_s": times, "median_s": medians, "loadavg": [load_before, loadavg()], "costs": costs}
        print(batch, medians, costs, flush=True)

    def truncated_time(batch: int, mean_exit: float) -> float:
        """The truncated model's time at ``mean_exit`` layers, interpolated linearly between the depths timed."""
        points = [(layers, speed[batch]["median_s"][f"truncated@{layers}"]) for layers in cut_depths]
        points.append((depth, speed[batch]["median_s"]["full"]))
        if mean_exit <= points[0][0]:
            return points[0][1]
        for (low, low_time), (high, high_time) in zip(points, points[1:], strict=False):
            if mean_exit <= high:
                weight = (mean_exit - low) / (high - low)
                return low_time + weight * (high_time - low_time)
        return points[-1][1]

    for row in rows:
        threshold = row["threshold"]
        name = None if threshold is None else f"{row['measure']}@{threshold:g}"
        for batch in (1, 8):
            full_time = speed[batch]["median_s"]["full"]
            median = speed[batch]["median_s"].get(name)
            row[f"speedup_batch{batch}"] = full_time / median if median else 1.0
            row[f"truncated_speedup_batch{batch}"] = full_time / truncated_time(batch, row["heldout_mean_exit_layer"])

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
               "speed-up b=1", "speed-up b=8", "truncated at mean exit b=1", "b=8"]  # fmt: skip
    table = [
        [r["measure"], r["delta"], "none" if r["threshold"] is None else f"{r['threshold']:g}",
         f"{r['heldout_consistency']:.3f}", f"{r['heldout_mean_exit_layer']:.2f} / {depth}",
         f"{r['split_violation_rate']:.2f}", f"**{r['speedup_batch1']:.2f}x**", f"**{r['speedup_batch8']:.2f}x**",
         f"{r['truncated_speedup_batch1']:.2f}x", f"{r['truncated_speedup_batch8']:.2f}x"]
        for r in rows
    ]  # fmt: skip
    cost_headers = ["", "batch 1", "batch 8"]
    c1, c8 = speed[1]["costs"], speed[8]["costs"]
    cost_rows = [
        ["full-depth decode step (ms)", f"{c1['full_step_ms']:.2f}", f"{c8['full_step_ms']:.2f}"],
        ["one layer per step (ms)", f"{c1['layer_ms']:.3f}", f"{c8['layer_ms']:.3f}"],
        ["fixed per step: generate, embeddings, head (ms)", f"{c1['fixed_step_ms']:.2f}", f"{c8['fixed_step_ms']:.2f}"],
        [f"**floor**: every token forced out at layer {first_exit}, no confidence (speed-up)",
         f"**{c1['floor_speedup']:.2f}x**", f"**{c8['floor_speedup']:.2f}x**"],
        ["full depth with the weights concatenated at every step (time / now)",
         f"{c1['copying_full_slowdown']:.2f}x", f"{c8['copying_full_slowdown']:.2f}x"],
        ["floor with the weights concatenated at every step (speed-up)", f"{c1['copying_floor_speedup']:.2f}x",
         f"{c8['copying_floor_speedup']:.2f}x"],
    ]  # fmt: skip
    for m in args.measures:
        cost_rows.append(
            [f"{m}: one check, ms (layers)", f"{c1['check_ms'][m]:.3f} ({c1['check_layers'][m]:.2f})",
             f"{c8['check_ms'][m]:.3f} ({c8['check_layers'][m]:.2f})"]
        )  # fmt: skip
    for m in args.measures:
        cost_rows.append(
            [f"{m}: λ = 0, every token out at its first check (speed-up)", f"{c1['best_speedup'][m]:.2f}x",
             f"{c8['best_speedup'][m]:.2f}x"]
        )  # fmt: skip
    full1, full8 = speed[1]["median_s"]["full"], speed[8]["median_s"]["full"]
    baseline_text = ""
    if baseline is not None:
        base1, base8 = (speed[batch]["median_s"]["baseline"] for batch in (1, 8))
        perplexity = {name: validation_perplexity(folder) for name, folder in (("model", args.model),
                                                                                ("baseline", args.baseline))}  # fmt: skip
        speed["baseline"] = {"perplexity": perplexity, "speedup": {"1": full1 / base1, "8": full8 / base8}}
        baseline_text = (
            f"\n\nBaseline: `{args.baseline}` ({baseline.config.num_hidden_layers} layers trained alone on the same "
            f"data and steps), validation perplexity {perplexity['baseline']} against this model's "
            f"{perplexity['model']}; its generation against this model's at full depth (same rounds): "
            f"**{full1 / base1:.2f}x** at batch 1, **{full8 / base8:.2f}x** at batch 8."
        )
    markdown = (
        f"# CALM early exit on the State of the Union corpus\n\nModel `{args.model}` ({depth} layers, trained with "
        f"exits after {trained_exits}, decoding with exits after {config.exit_points()}), {cal_prompts.shape[0]} calibration prompts (validation addresses) and "
        f"{test_prompts.shape[0]} held-out prompts (test addresses) of {args.prompt_length} tokens, {args.new_tokens} "
        f"greedy new tokens; token consistency with the full model's generation; Learn-then-Test with "
        f"Hoeffding–Bentkus p-values, ε = {EPSILON}; *violations*: the rate over {args.splits} random 80/20 splits "
        f"of all prompts at which the held-out risk exceeded δ. Model trained by: "
        f"`{args.training or 'see --model'}`.\n\nWall clock: greedy `generate` of {timed.shape[0]} held-out "
        f"prompts, full depth {full1:.3f} s at batch 1 and {full8:.3f} s at batch 8; medians of {args.rounds} "
        f"interleaved rounds, every step below in the same rounds (loadavg {speed[1]['loadavg']} before/after the "
        f"batch-1 timings, {speed[8]['loadavg']} for batch 8: the 2 cores are shared with other jobs, so only the "
        f"ratios mean anything). *truncated at mean exit*: the model cut to the held-out mean exit layer (no "
        f"checks, no propagation, the prompt cut too; interpolated between the depths {cut_depths} and {depth}).\n\n"
        + markdown_table(headers, table)
        + "\n\nWhere the time goes (same rounds). *one layer*: the slope of the truncated models' times over their "
        f"depth, per decode step; *fixed*: its intercept; *one check*: (every check run, no token leaving − full "
        f"depth) per check (a token makes {checks_per_token} checks when it never leaves).\n\n"
        + markdown_table(cost_headers, cost_rows)
        + baseline_text
        + f"\n\nExit-layer histogram (held-out prompts, δ = 0.1): `{png.name}`.\n"
    )
    payload = {"args": vars(args), "model_config": config.to_dict(), "rows": rows, "per_measure": per_measure,
               "speed": {str(k): v for k, v in speed.items()}, "histograms": histograms}  # fmt: skip
    json_path, md_path = write_results(args.name, json.loads(json.dumps(payload, default=str)), markdown)
    print(md_path.read_text())


if __name__ == "__main__":
    main()
