"""Decision Transformer: training speed against transformers' DecisionTransformerModel, and return-conditioned
quality against behaviour cloning on LunarLander.

    .venv/bin/python bench/bench_decision_transformer.py speed            # ~2 min
    .venv/bin/python bench/bench_decision_transformer.py quality          # ~1-2 h on 2 cores (see --help)
    .venv/bin/python bench/bench_decision_transformer.py all --smoke      # both at toy sizes, < 1 min

speed: a random transformers 5 `DecisionTransformerModel` of the paper's MuJoCo size (hidden 128, 3 layers, 1 head,
K = 20, Hopper's 11-d states and 3-d actions) is saved and loaded into tf_family (`from_pretrained` converts it), so
both sides run identical weights. One training step = forward, the action mean squared error over real steps (for
transformers computed outside the model, as in its blog's `TrainableDT`), backward, AdamW step; batch 64 windows
with some left padding; dropout 0.1. Also timed: an inference forward. Both with SDPA and eager attention. The first
step's loss of both sides is recorded as a same-weights check. Then ``--interleave-rounds`` rounds alternate the two
sides step by step, so that a change of the (shared) machine's load does not land on one side only.

quality: an offline LunarLander-v3 dataset (`tf_family.data.offline_rl`, tier ``medium-expert`` by default: half
episodes of a degraded lander that misjudges its vertical speed, half gymnasium's heuristic lander) trains, with the
same network and schedule,
(a) a Decision Transformer and (b) behaviour cloning: the same model with its return-to-go input zeroed in training
and in the environment (no return conditioning). Each seed trains both from the same initialisation and evaluates
them in 10 environment episodes (seeds disjoint from the data's); the DT is conditioned on the expert's reference
return, and also on the data's mean return to show that the conditioning steers it. Scores are D4RL-normalised
(0 = random policy, 100 = the heuristic expert, both measured over 50 episodes).

Why the degraded medium agent by default (``--medium-policy degraded``): with ``--medium-policy epsilon`` the medium
agent is the expert taking random actions with probability 0.3, so the most frequent action in every state is the
expert's and behaviour cloning with greedy actions recovers the expert from the mixture; the comparison then says
nothing about return conditioning. A systematically worse agent is what D4RL's medium policies are.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

SPEED_CONFIG = dict(  # noqa: C408  (the shape of edbeeching/decision-transformer-gym-hopper-*)
    state_dim=11, act_dim=3, hidden_size=128, n_layer=3, n_head=1, max_ep_len=1000, action_tanh=True,
    resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1,
)  # fmt: skip


# ------------------------------------------------------------------------------------------------------- speed
def _speed_batch(batch: int, context: int, seed: int = 0) -> dict:
    import torch

    generator = torch.Generator().manual_seed(seed)
    mask = torch.ones(batch, context, dtype=torch.long)
    starts = torch.randint(0, context, (batch,), generator=generator)
    starts[: batch // 2] = 0  # half the windows are full, the rest left-padded (episode starts)
    mask[torch.arange(context)[None, :] < starts[:, None]] = 0
    return {
        "states": torch.randn(batch, context, SPEED_CONFIG["state_dim"], generator=generator),
        "actions": torch.rand(batch, context, SPEED_CONFIG["act_dim"], generator=generator) * 2 - 1,
        "returns_to_go": torch.randn(batch, context, 1, generator=generator),
        "timesteps": torch.randint(0, 900, (batch, 1), generator=generator) + torch.arange(context),
        "attention_mask": mask,
    }


def run_speed(args) -> dict:
    import torch
    from transformers import DecisionTransformerConfig, DecisionTransformerModel

    from tf_family import TffDecisionTransformerModel

    torch.manual_seed(0)
    reference = DecisionTransformerModel(DecisionTransformerConfig(**SPEED_CONFIG))
    inputs = _speed_batch(args.batch, args.context)
    mask = inputs["attention_mask"].bool()
    rows, results, callables = [], {}, {}
    with tempfile.TemporaryDirectory() as folder:
        reference.save_pretrained(folder)
        sides = {}
        for implementation in ("sdpa", "eager"):
            sides[f"transformers ({implementation})"] = DecisionTransformerModel.from_pretrained(
                folder, attn_implementation=implementation
            )
            sides[f"tf_family ({implementation})"] = TffDecisionTransformerModel.from_pretrained(
                folder, attn_implementation=implementation
            )
    for name, model in sides.items():
        ours = isinstance(model, TffDecisionTransformerModel)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=1e-4)

        def loss_of(model=model, ours=ours):
            if ours:
                return model(**inputs, labels=inputs["actions"]).loss
            preds = model(**inputs, return_dict=True).action_preds  # the blog's TrainableDT loss
            return ((preds[mask] - inputs["actions"][mask]) ** 2).mean()

        def train_step(model=model, optimizer=optimizer, loss_of=loss_of):
            loss = loss_of()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
            optimizer.step()
            return loss

        def infer(model=model):
            with torch.no_grad():
                return model(**inputs, return_dict=True).action_preds

        model.eval()
        with torch.no_grad():
            torch.manual_seed(0)
            first_loss = loss_of().item()  # eval mode: no dropout, identical weights -> identical losses
        model.train()
        train = common.time_callable(lambda step=train_step: [step() for _ in range(args.steps_per_call)])
        model.eval()
        forward = common.time_callable(infer)
        callables[name] = (model, train_step, infer)
        results[name] = {"train": train.to_dict(), "forward": forward.to_dict(), "first_loss_eval": first_loss}
        steps = args.steps_per_call
        rows.append(
            [
                name,
                f"{common.format_seconds(train.median_s / steps)} ({common.format_seconds(train.min_s / steps)})",
                f"{common.format_seconds(forward.median_s)} ({common.format_seconds(forward.min_s)})",
                f"{first_loss:.6f}",
            ]
        )
    for implementation in ("sdpa", "eager"):
        ours = results[f"tf_family ({implementation})"]
        theirs = results[f"transformers ({implementation})"]
        results[f"ratio_train_{implementation}"] = theirs["train"]["median_s"] / ours["train"]["median_s"]
        results[f"ratio_forward_{implementation}"] = theirs["forward"]["median_s"] / ours["forward"]["median_s"]
    ratios = ", ".join(
        f"{kind} {implementation}: {results[f'ratio_{kind}_{implementation}']:.2f}x"
        for kind in ("train", "forward")
        for implementation in ("sdpa", "eager")
    )
    interleaved = _interleaved_timings(callables, args.interleave_rounds) if args.interleave_rounds else None
    if interleaved:
        results["interleaved"] = interleaved
    markdown = (
        f"# Decision Transformer: training step vs transformers' DecisionTransformerModel\n\n"
        f"Hopper-sized model (hidden 128, 3 layers, 1 head), K = {args.context}, batch {args.batch} windows (half "
        f"left-padded), dropout 0.1, AdamW + clipping; identical weights (tf_family loads the transformers folder).\n\n"
        + common.markdown_table(
            ["implementation", "train step, median (min)", "inference forward, median (min)", "first loss (eval)"],
            rows,
        )
        + f"\n\nSpeed-up of tf_family (transformers time / tf_family time, medians): {ratios}.\n"
    )
    if interleaved:
        markdown += (
            f"\nInterleaved ({args.interleave_rounds} rounds; in each round the two sides of one attention "
            "implementation take one training step and one forward each, in alternating order, so load changes on "
            "the machine hit both alike): per step / forward, median (min).\n\n"
            + common.markdown_table(
                [
                    "attention",
                    "transformers train",
                    "tf_family train",
                    "transformers forward",
                    "tf_family forward",
                    "speed-up train",
                    "speed-up forward",
                ],
                [
                    [
                        implementation,
                        *(
                            f"{common.format_seconds(entry['median_s'])} ({common.format_seconds(entry['min_s'])})"
                            for entry in (
                                interleaved[implementation]["transformers"]["train"],
                                interleaved[implementation]["tf_family"]["train"],
                                interleaved[implementation]["transformers"]["forward"],
                                interleaved[implementation]["tf_family"]["forward"],
                            )
                        ),
                        f"{interleaved[implementation]['ratio_train']:.2f}x",
                        f"{interleaved[implementation]['ratio_forward']:.2f}x",
                    ]
                    for implementation in ("sdpa", "eager")
                ],
            )  # fmt: skip
            + "\n"
        )
    name = "decision_transformer_speed" + ("_smoke" if args.smoke else "")
    common.write_results(name, {"args": vars(args), "config": SPEED_CONFIG, "results": results}, markdown)
    return results


def _interleaved_timings(callables: dict, rounds: int) -> dict:
    """Alternate the two sides of each attention implementation step by step: sequential timing attributes any
    change of the machine's load between the two measurements to the implementations."""
    timings = {}
    for implementation in ("sdpa", "eager"):
        sides = {side: callables[f"{side} ({implementation})"] for side in ("transformers", "tf_family")}
        times = {side: {"train": [], "forward": []} for side in sides}
        for round_index in range(rounds):
            order = list(sides) if round_index % 2 == 0 else list(reversed(sides))
            for side in order:
                model, train_step, infer = sides[side]
                model.train()
                start = time.perf_counter()
                train_step()
                times[side]["train"].append(time.perf_counter() - start)
                model.eval()
                start = time.perf_counter()
                infer()
                times[side]["forward"].append(time.perf_counter() - start)
        summary = {
            side: {
                kind: {"times_s": [round(t, 5) for t in values], "median_s": statistics.median(values),
                       "min_s": min(values)}
                for kind, values in kinds.items()
            }
            for side, kinds in times.items()
        }  # fmt: skip
        for kind in ("train", "forward"):
            summary[f"ratio_{kind}"] = (
                summary["transformers"][kind]["median_s"] / summary["tf_family"][kind]["median_s"]
            )
        timings[implementation] = summary
    return timings


# ----------------------------------------------------------------------------------------------------- quality
def _behaviour_cloning_class():
    from tf_family import TffDecisionTransformerModel

    class BehaviourCloning(TffDecisionTransformerModel):
        """The same network with its return-to-go input zeroed: a policy of (s, a) history only."""

        def forward(self, *args, returns_to_go=None, **kwargs):
            return super().forward(*args, returns_to_go=returns_to_go * 0, **kwargs)

    return BehaviourCloning


def _train(model, sampler, args, seed: int) -> list[float]:
    import torch

    generator = torch.Generator().manual_seed(10_000 + seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    warmup = max(1, min(args.warmup_steps, args.train_steps // 10))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup))
    model.train()
    losses = []
    for _ in range(args.train_steps):
        batch = sampler.sample(args.batch, generator)
        loss = model(**batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    return losses


def run_quality(args) -> dict:
    import torch

    from tf_family import TffDecisionTransformerModel, get_arch
    from tf_family.data.offline_rl import (
        TrajectoryWindowSampler,
        make_offline_dataset,
        offline_dataset_metadata,
        reference_returns,
        trajectory_statistics,
    )
    from tf_family.rl import evaluate_in_env

    env_id = "LunarLander-v3"
    start = time.perf_counter()
    dataset = make_offline_dataset(
        env_id, args.tier, num_steps=args.data_steps, seed=0, medium_policy=args.medium_policy
    )
    metadata = offline_dataset_metadata(dataset)
    reference = reference_returns(env_id)
    stats = trajectory_statistics(dataset)
    data_seconds = time.perf_counter() - start
    config = get_arch("decision_transformer").make_config(
        "small",
        state_mean=stats["state_mean"],
        state_std=stats["state_std"],
        context_length=args.context,
        target_return=reference["expert"],
        n_layer=args.layers,
        hidden_size=args.hidden,
    )
    sampler = TrajectoryWindowSampler(dataset, config.context_length)
    targets = {"expert": reference["expert"], "data mean": metadata["mean_return"]}
    BehaviourCloning = _behaviour_cloning_class()
    runs = []
    for seed in args.seeds:
        torch.manual_seed(seed)
        initial = TffDecisionTransformerModel(config).state_dict()
        for method, model_class in (("decision_transformer", TffDecisionTransformerModel), ("bc", BehaviourCloning)):
            model = model_class(config)
            model.load_state_dict(initial)
            start = time.perf_counter()
            losses = _train(model, sampler, args, seed)
            train_seconds = time.perf_counter() - start
            for target_name, target in targets.items() if method == "decision_transformer" else [("none", 0.0)]:
                result = evaluate_in_env(
                    model,
                    env_id,
                    target_return=target,
                    num_episodes=args.episodes,
                    seed=2_000_000 + 1000 * seed,
                    reference_returns=reference,
                    max_episode_steps=args.max_episode_steps,
                )
                runs.append(
                    {
                        "seed": seed,
                        "method": method,
                        "target": target_name,
                        "target_return": target,
                        "mean_return": result["mean_return"],
                        "normalized_score": result["normalized_score"],
                        "returns": result["returns"],
                        "train_seconds": train_seconds,
                        "final_loss": statistics.fmean(losses[-max(1, len(losses) // 20) :]),
                    }
                )
            print(f"seed {seed} {method}: {[round(r['normalized_score'], 1) for r in runs[-2:]]}", flush=True)

    def summary(method: str, target: str) -> list:
        scores = [r["normalized_score"] for r in runs if r["method"] == method and r["target"] == target]
        returns = [r["mean_return"] for r in runs if r["method"] == method and r["target"] == target]
        spread = statistics.pstdev(scores) if len(scores) > 1 else 0.0
        return [f"{statistics.fmean(scores):.1f} ± {spread:.1f}", f"{statistics.fmean(returns):.1f}", len(scores)]

    rows = [
        ["Decision Transformer, target = expert return", *summary("decision_transformer", "expert")],
        ["Decision Transformer, target = data mean return", *summary("decision_transformer", "data mean")],
        ["behaviour cloning (same network, no return input)", *summary("bc", "none")],
    ]
    markdown = (
        f"# Decision Transformer vs behaviour cloning on LunarLander-v3 ({args.tier}, {args.medium_policy} medium)\n\n"
        f"Data: {metadata['num_episodes']} episodes, {metadata['num_steps']} transitions, mean return "
        f"{metadata['mean_return']:.1f} (normalised {metadata['normalized_score']:.1f}; components "
        f"{ {k: round(v, 1) for k, v in metadata['component_mean_returns'].items()} }). References over 50 episodes: "
        f"random {reference['random']:.1f}, expert (heuristic) {reference['expert']:.1f}.\n"
        f"Model: hidden {config.hidden_size}, {config.n_layer} layers, K = {config.context_length}; "
        f"{args.train_steps} steps of batch {args.batch}, AdamW lr {args.lr}; {len(args.seeds)} seeds x "
        f"{args.episodes} episodes.\n\n"
        + common.markdown_table(["policy", "normalised score (mean ± std over seeds)", "mean return", "seeds"], rows)
        + "\n"
    )
    name = "decision_transformer_quality" + ("_smoke" if args.smoke else "")
    payload = {
        "args": vars(args),
        "dataset": metadata,
        "data_seconds": data_seconds,
        "reference_returns": reference,
        "runs": runs,
    }
    common.write_results(name, payload, markdown)
    return payload


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["speed", "quality", "all"])
    parser.add_argument("--smoke", action="store_true", help="toy sizes to check the script runs (< 1 min)")
    parser.add_argument("--threads", type=int, default=2)
    speed = parser.add_argument_group("speed")
    speed.add_argument("--batch", type=int, default=64)
    speed.add_argument("--context", type=int, default=20)
    speed.add_argument("--steps-per-call", type=int, default=5)
    speed.add_argument(
        "--interleave-rounds",
        type=int,
        default=10,
        help="alternating-order rounds after the sequential timing (0: none)",
    )
    quality = parser.add_argument_group("quality")
    quality.add_argument("--tier", default="medium-expert", choices=["medium-expert", "medium-replay", "medium"])
    quality.add_argument("--medium-policy", default="degraded", choices=["degraded", "epsilon"])
    quality.add_argument("--data-steps", type=int, default=200_000)
    quality.add_argument("--train-steps", type=int, default=3_000)
    quality.add_argument("--warmup-steps", type=int, default=500)
    quality.add_argument("--lr", type=float, default=3e-4)
    quality.add_argument("--hidden", type=int, default=128)
    quality.add_argument("--layers", type=int, default=3)
    quality.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    quality.add_argument("--episodes", type=int, default=10)
    quality.add_argument("--max-episode-steps", type=int, default=None)
    args = parser.parse_args(argv)
    if args.smoke:
        args.batch, args.steps_per_call, args.interleave_rounds = 8, 1, 2
        args.data_steps, args.train_steps, args.hidden, args.layers = 3_000, 20, 32, 1
        args.seeds, args.episodes, args.max_episode_steps = [0], 2, 100
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    common.setup_threads(args.threads)
    if args.what in ("speed", "all"):
        run_speed(args)
    if args.what in ("quality", "all"):
        run_quality(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
