"""Train a Decision Transformer on offline trajectories with accelerate, and evaluate it in its environment.

    accelerate launch recipes/decision_transformer.py --env_id LunarLander-v3 --dataset_tier medium-expert
    accelerate launch -m tf_family.recipes.decision_transformer --train_file data/lander.parquet --env_id LunarLander-v3
    accelerate launch -m tf_family.recipes.decision_transformer --model_name_or_path runs/dt --lora_r 8 ...
    accelerate launch --config_file recipes/accelerate_configs/two_cpu_processes.yaml \\
        -m tf_family.recipes.decision_transformer --cpu ...                                 # two CPU processes

Reads top to bottom: arguments → Accelerator → data → model → optional LoRA → prepare → train loop (gradient
accumulation, clipping, checkpoints, evaluations every ``--eval_steps``) → `evaluate()` → save (safetensors, model
card with the returns, ``training_run.json``, a plot of achieved against target return) → optional push.

Data, in the D4RL-style layout of `tf_family.data.offline_rl` (one row per trajectory: ``observations``,
``actions``, ``rewards``; ``terminals`` / ``truncations`` optional): generated on the fly from a real simulator
(`make_offline_dataset`: ``--env_id``, ``--dataset_tier``, ``--dataset_steps``, ``--dataset_seed``; the default),
a local file or folder (``--train_file``: a `save_to_disk` folder, parquet, JSON lines or arrow) or a Hub dataset
(``--dataset_name``). Training batches are random ``K``-step windows (`TrajectoryWindowSampler`), read through a
`DataLoader` prepared by accelerate (`window_loader` over a `SequentialStepSampler`); micro-batch ``i`` of process
``p`` is drawn from a generator seeded with ``(seed, i, p)``, so a resumed run, which skips the micro-batches done
with ``accelerate.skip_first_batches``, draws exactly the windows the uninterrupted one would have drawn.

A model trained from scratch (``--arch decision_transformer --variant …``) takes from the data and the environment
its state and action spaces, ``action_tanh`` (only for continuous spaces inside [-1, 1]), ``max_ep_len``, the state
mean / std, ``target_return`` (the best return in the data, or ``--target_return``), ``env_id`` and, unless the
variant or ``--config_overrides`` set one, a ``return_scale`` (the power of ten nearest the largest |return|); a
model to fine-tune (``--model_name_or_path``) must fit the data, or the run stops with a `ValueError`.

Evaluation (`evaluate`) runs ``--eval_episodes`` episodes in the gymnasium environment at each target return
(``--eval_target_returns``; by default the data's mean and best returns and, when known, the expert's), split
between the processes, and reports the mean and std of the returns and the D4RL normalised score (0 = random
policy, 100 = expert; references from the generated data or `reference_returns`).

A checkpoint (``--checkpointing_steps``) holds the accelerate state (weights, optimizer, scheduler, RNG) and the step
reached, so ``--resume_from_checkpoint latest`` continues exactly where a run stopped. The run's lifecycle (arguments
shared with the other recipes, accelerator, checkpoints, saving, the end-of-run barrier) is `tf_family.training`'s.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import torch
from accelerate import Accelerator, skip_first_batches
from accelerate.logging import get_logger
from accelerate.utils import gather_object
from transformers import AutoConfig, AutoModel

from tf_family.data.offline_rl import (
    ENVIRONMENTS,
    TIERS,
    TrajectoryWindowSampler,
    make_offline_dataset,
    offline_dataset_metadata,
    reference_returns,
    trajectory_statistics,
)
from tf_family.data.sampling import SequentialStepSampler
from tf_family.registry import get_arch
from tf_family.rl import evaluate_in_env
from tf_family.shipping.cards import RL_TASK
from tf_family.training import (
    TrainingLog,
    add_lora_and_hub_arguments,
    add_optimisation_arguments,
    add_run_arguments,
    apply_lora,
    architectures_with,
    check_arch,
    check_at_least,
    parse_config_overrides,
    publish_run,
    resume,
    run_record,
    save_checkpoint,
    save_model,
    validate_run_args,
)
from tf_family.training.arguments import timestamped_run_dir
from tf_family.training.offline_rl import (
    check_env_id,
    check_model_fits,
    data_spaces,
    describe_dataset,
    environment_spaces,
    episode_shares,
    plot_returns,
    summarise_returns,
    summary_metrics,
    window_loader,
)
from tf_family.training.run import Run, prepare, start_run
from tf_family.utils.user_errors import run_main

logger = get_logger(__name__)

REQUIRED_COLUMNS = ("observations", "actions", "rewards")
DATA_FILE_TYPES = {".parquet": "parquet", ".json": "json", ".jsonl": "json", ".arrow": "arrow"}
PLOT_FILE = "return_vs_target.png"
# the fields of a from-scratch config that the data decides (the rest come from --variant / --config_overrides)
DATA_FIELDS = ("state_dim", "act_dim", "action_space")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Train a Decision Transformer on offline RL data (tf_family).")
    model = parser.add_argument_group("model")
    model.add_argument("--arch", default=None, help="train from scratch (default: decision_transformer)")
    model.add_argument("--variant", default="small", help="named size of --arch (tiny, small, hopper)")
    model.add_argument(
        "--config_overrides",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="config fields, e.g. n_layer=2 hidden_size=64 context_length=10 return_scale=100 (by default the "
        "variant's return_scale or, if it has none, the power of ten nearest the data's largest |return|)",
    )
    model.add_argument("--model_name_or_path", help="fine-tune a saved Decision Transformer folder or Hub id")
    model.add_argument("--target_return", type=float, help="the config's default target (default: the data's best)")

    data = parser.add_argument_group("data (default: generated with make_offline_dataset)")
    data.add_argument("--env_id", help=f"gymnasium id; generated data needs one of {sorted(ENVIRONMENTS)}")
    data.add_argument("--dataset_tier", default="medium-expert", choices=list(TIERS))
    data.add_argument("--dataset_steps", type=int, default=100_000, help="transitions to generate")
    data.add_argument("--dataset_seed", type=int, default=0)
    data.add_argument("--medium_policy", choices=["degraded", "epsilon"], default="degraded")
    data.add_argument("--train_file", help="local save_to_disk folder or .parquet/.json/.jsonl/.arrow file")
    data.add_argument("--dataset_name", help="Hub dataset id in the same layout")
    data.add_argument("--dataset_config_name")
    data.add_argument("--dataset_split", default="train")
    data.add_argument(
        "--reference_episodes",
        type=int,
        default=50,
        help="episodes measuring the random / expert returns for normalised scores (0: no normalised scores)",
    )

    add_optimisation_arguments(
        parser,
        learning_rate=1e-4,
        lr_scheduler_type="constant_with_warmup",
        weight_decay=1e-4,
        num_warmup_steps=100,
        max_grad_norm=0.25,
        per_device_train_batch_size=64,
        num_train_epochs=None,
        max_train_steps=10_000,
        eval_batches=False,
        batch_help="windows per process",
    )
    run = add_run_arguments(parser, default_output_dir="runs/<model>-<data>-<time>", logging_steps=50)
    run.add_argument("--eval_episodes", type=int, default=10, help="episodes per target return")
    run.add_argument("--eval_target_returns", type=float, nargs="+", help="returns to condition on")
    run.add_argument("--eval_seed", type=int, default=1_500_000_000, help="episode i resets with eval_seed + i")
    run.add_argument("--no_plot", dest="plot", action="store_false", help=f"skip {PLOT_FILE} (needs matplotlib)")
    add_lora_and_hub_arguments(parser)
    return parser.parse_args(argv)


def validate_args(args: argparse.Namespace) -> None:
    """Refuse, before any work, what cannot run; each message says what to change."""
    if args.arch is not None and args.model_name_or_path is not None:
        raise ValueError("Pass at most one of --arch (train from scratch) and --model_name_or_path (fine-tune).")
    if args.model_name_or_path is None:
        args.arch = args.arch or "decision_transformer"
        check_arch(args, "action", "--arch {arch} does not act; architectures that do: {able}.")
    if args.train_file and args.dataset_name:
        raise ValueError("Pass at most one of --train_file (local data) and --dataset_name (Hub data).")
    generated = not (args.train_file or args.dataset_name)
    if generated:
        if args.env_id is None:
            raise ValueError(f"Generated data needs --env_id, one of {sorted(ENVIRONMENTS)}.")
        if args.env_id not in ENVIRONMENTS:
            raise ValueError(
                f"--env_id {args.env_id!r} has no scripted expert to generate data with; choose one of "
                f"{sorted(ENVIRONMENTS)}, or train on your own data with --train_file / --dataset_name."
            )
        if not 0 <= args.dataset_seed < 10**8:
            raise ValueError(f"--dataset_seed={args.dataset_seed} must be in [0, 10**8).")
    if args.train_file and not Path(args.train_file).exists():
        raise ValueError(f"--train_file={args.train_file!r} does not exist; pass a dataset folder or file.")
    if args.train_file and Path(args.train_file).is_file():
        suffix = Path(args.train_file).suffix
        if suffix not in DATA_FILE_TYPES:
            raise ValueError(
                f"--train_file {args.train_file!r}: cannot read {suffix or 'a file without suffix'}; use a "
                f"save_to_disk folder or one of {sorted(DATA_FILE_TYPES)}."
            )
    if args.env_id is not None:
        check_env_id(args.env_id)
    check_at_least(args, ("per_device_train_batch_size", "eval_episodes", "dataset_steps"))
    check_at_least(args, ("reference_episodes", "num_warmup_steps", "eval_seed"), minimum=0)
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise ValueError(
            f"the plot ({PLOT_FILE}) needs matplotlib: pip install 'tf-family[rl]', or pass --no_plot to skip it."
        )
    validate_run_args(args)


def default_output_dir(args: argparse.Namespace) -> str:
    if args.train_file:
        data = Path(args.train_file.rstrip("/")).stem
    elif args.dataset_name:
        data = args.dataset_name.replace("/", "_")
    else:
        data = f"{args.env_id}-{args.dataset_tier}"
    model = args.arch or Path(args.model_name_or_path.rstrip("/")).name
    return timestamped_run_dir(f"{model}-{data}")


def load_trajectories(args: argparse.Namespace) -> tuple[datasets.Dataset, dict[str, Any]]:
    """The training trajectories and what is known about them (`offline_dataset_metadata`, or ``{}``)."""
    if args.train_file or args.dataset_name:
        if args.dataset_name:
            dataset = datasets.load_dataset(args.dataset_name, args.dataset_config_name, split=args.dataset_split)
        elif Path(args.train_file).is_dir():
            dataset = datasets.load_from_disk(args.train_file)
            if isinstance(dataset, datasets.DatasetDict):
                if args.dataset_split not in dataset:
                    raise ValueError(
                        f"--train_file {args.train_file} has splits {list(dataset)}; pick one with --dataset_split."
                    )
                dataset = dataset[args.dataset_split]
        else:
            kind = DATA_FILE_TYPES[Path(args.train_file).suffix]
            dataset = datasets.load_dataset(kind, data_files=args.train_file, split="train")
        missing = [column for column in REQUIRED_COLUMNS if column not in dataset.column_names]
        if missing:
            source = args.train_file or args.dataset_name
            raise ValueError(
                f"{source} has no {missing} column(s) (it has {dataset.column_names}); the layout is one row per "
                "trajectory with observations, actions and rewards (see tf_family.data.offline_rl)."
            )
        if len(dataset) == 0:
            raise ValueError(f"{args.train_file or args.dataset_name} holds no trajectories.")
        try:
            metadata = offline_dataset_metadata(dataset)
        except ValueError:
            metadata = {}
        return dataset, metadata
    dataset = make_offline_dataset(
        args.env_id,
        args.dataset_tier,
        num_steps=args.dataset_steps,
        seed=args.dataset_seed,
        reference_episodes=args.reference_episodes,
        medium_policy=args.medium_policy,
    )
    return dataset, offline_dataset_metadata(dataset)


def micro_batch_generator(seed: int, micro_index: int, rank: int) -> torch.Generator:
    """The generator of micro-batch ``micro_index`` of process ``rank``: a function of the three only, so a resumed
    run samples the same windows as the uninterrupted one."""
    return torch.Generator().manual_seed(((seed * 1_000_003 + micro_index) * 1009 + rank) % 2**63)


def evaluate(
    model,
    env_id: str,
    target_returns: list[float],
    num_episodes: int,
    seed: int,
    reference: dict[str, float] | None,
    accelerator: Accelerator,
) -> dict[str, Any]:
    """Roll the policy out in ``env_id`` at every target return: ``num_episodes`` episodes each (greedy actions,
    episode ``i`` reset with ``seed + i``), split between the processes; every process gets the whole result.

    Returns ``{"env_id", "seed", "num_episodes", "reference_returns", "targets": [{"target_return", "returns",
    "mean_return", "std_return", "normalized_score", "normalized_score_std"}, ...], "best_target_return",
    "best_mean_return", "best_normalized_score"}`` (normalised scores are None without references).
    """
    policy = accelerator.unwrap_model(model)
    first, count = episode_shares(num_episodes, accelerator.num_processes)[accelerator.process_index]
    mine = {}
    for target in target_returns:
        if count:
            result = evaluate_in_env(
                policy,
                env_id,
                target_return=target,
                num_episodes=count,
                seed=seed + first,
                reference_returns=reference or {"random": 0.0, "expert": 1.0},
            )
            mine[target] = result["returns"]
        else:
            mine[target] = []
    model.train()
    shares = gather_object([mine])  # one dict per process, in rank order: {target: returns}
    return {
        "env_id": env_id,
        "seed": seed,
        "num_episodes": num_episodes,
        **summarise_returns(shares, target_returns, reference),
    }


@dataclass
class OfflineData:
    """The training trajectories, what is known about them, and the environment they come from (its spaces)."""

    dataset: datasets.Dataset
    metadata: dict[str, Any]
    env_id: str
    env: dict[str, Any]
    spaces: dict[str, Any]
    stats: dict[str, Any]
    returns: list[float]


@dataclass
class EvaluationPlan:
    """Where and how the policy is rolled out: the environment, the target returns and the reference returns (random
    policy, expert) its scores are normalised by."""

    env_id: str
    target_returns: list[float]
    reference: dict[str, float] | None

    def evaluate(self, run: Run) -> dict[str, Any]:
        args = run.args
        return evaluate(
            run.model, self.env_id, self.target_returns, args.eval_episodes, args.eval_seed, self.reference,
            run.accelerator,
        )  # fmt: skip


def load_offline_data(args: argparse.Namespace) -> OfflineData:
    """The trajectories (`load_trajectories`) and their environment (``--env_id``, else the data's or the model's)."""
    # generation is deterministic: every process makes the same trajectories
    dataset, metadata = load_trajectories(args)
    env_id = args.env_id or metadata.get("env_id")
    if env_id is None and args.model_name_or_path:
        env_id = getattr(AutoConfig.from_pretrained(args.model_name_or_path), "env_id", None)
    if env_id is None:
        raise ValueError("the data does not say which environment it comes from; pass --env_id (a gymnasium id).")
    check_env_id(env_id)
    env, spaces, stats = environment_spaces(env_id), data_spaces(dataset), trajectory_statistics(dataset)
    returns = [sum(rewards) for rewards in dataset["rewards"]]
    return OfflineData(dataset, metadata, env_id, env, spaces, stats, returns)


def build_policy(args: argparse.Namespace, offline: OfflineData, config_overrides: dict[str, Any]):
    """A fresh ``--arch`` model shaped by the data and the environment, or the saved one, checked against the data;
    returns it and how the messages name it."""
    env, data, stats, env_id = offline.env, offline.spaces, offline.stats, offline.env_id
    if args.arch:
        spec = get_arch(args.arch)
        for name in DATA_FIELDS:
            if name in config_overrides and config_overrides[name] != (env | data).get(name):
                raise ValueError(
                    f"--config_overrides {name}={config_overrides[name]} does not match the data, which has "
                    f"{name}={(env | data)[name]} ({env_id}); drop the override."
                )
        from_data = {
            "state_dim": data["state_dim"],
            "act_dim": env["act_dim"],
            "action_space": env["action_space"],
            "action_tanh": env["tanh_fits"],
            "max_ep_len": max(env["max_episode_steps"] or 0, data["longest_episode"]),
            "state_mean": stats["state_mean"],
            "state_std": stats["state_std"],
            "target_return": args.target_return if args.target_return is not None else stats["return_max"],
            "env_id": env_id,
        }
        if "return_scale" not in spec.variants[args.variant] and "return_scale" not in config_overrides:
            # the power of ten nearest the largest episode return: returns-to-go enter the model at order 1
            largest = max(abs(stats["return_max"]), abs(min(offline.returns)), 1.0)
            from_data["return_scale"] = 10.0 ** round(math.log10(largest))
        config = spec.make_config(args.variant, **{**from_data, **config_overrides})
        model = spec.model_classes["action"](config)
        source = f"--arch {args.arch} --variant {args.variant}"
    else:
        config = AutoConfig.from_pretrained(args.model_name_or_path, **config_overrides)
        if args.target_return is not None:
            config.target_return = args.target_return
        config.env_id = config.env_id or env_id
        model = AutoModel.from_pretrained(args.model_name_or_path, config=config)
        source = args.model_name_or_path
        if not hasattr(model, "get_action"):
            raise ValueError(
                f"{source} is a {type(model).__name__}, not a Decision Transformer; architectures that act: "
                f"{architectures_with('action')}."
            )
    check_model_fits(model.config, data, env, env_id, source)
    if data["longest_episode"] > model.config.max_ep_len:
        raise ValueError(
            f"the data has episodes of {data['longest_episode']} steps but {source} has max_ep_len="
            f"{model.config.max_ep_len}; raise max_ep_len."
        )
    return model


def plan_evaluation(args: argparse.Namespace, offline: OfflineData) -> EvaluationPlan:
    """The target returns to evaluate at (``--eval_target_returns``, else the data's mean and best and the expert's)
    and the reference returns (from the data, else measured with ``--reference_episodes``)."""
    reference = offline.metadata.get("reference_returns") if args.reference_episodes else None
    if reference is None and args.reference_episodes and offline.env_id in ENVIRONMENTS:
        reference = reference_returns(offline.env_id, args.reference_episodes)
    stats = offline.stats
    target_returns = args.eval_target_returns or sorted(
        {
            round(stats["return_mean"], 1),
            round(stats["return_max"], 1),
            *([round(reference["expert"], 1)] if reference else []),
        }
    )
    return EvaluationPlan(offline.env_id, target_returns, reference)


def train(run: Run, train_dataloader, plan: EvaluationPlan, described: str):
    """The training loop: the prepared loader's micro-batches of windows (a function of seed, micro-batch and
    process: `window_loader`), ``skip_first_batches`` past those a resumed run has done, gradient accumulation,
    clipping, evaluations and checkpoints; returns the log of training steps and the evaluations made on the way
    (those before a resumed checkpoint included)."""
    args, accelerator, model = run.args, run.accelerator, run.model
    state: dict[str, Any] = {}
    if args.resume_from_checkpoint:
        _, state = resume(accelerator, args)
        run.completed_steps = state["completed_steps"]
    progress, log = run.start_training("windows_per_second", described)
    eval_history: list[dict[str, Any]] = []
    per_device, accumulation = args.per_device_train_batch_size, args.gradient_accumulation_steps
    done = run.completed_steps * accumulation
    batches = skip_first_batches(train_dataloader, done) if done else train_dataloader
    for batch in batches:
        # accumulate(): gradients are all-reduced and the optimizer steps on every `accumulation`-th micro-batch
        with accelerator.accumulate(model):
            with accelerator.autocast():
                outputs = model(**batch)
            loss = outputs.loss
            run.optimizer_step(loss)
        log.add(loss.item(), 1, per_device)
        if not accelerator.sync_gradients:
            continue
        run.completed_steps += 1
        progress.update(1)

        if run.completed_steps % args.logging_steps == 0 or run.completed_steps == run.max_train_steps:
            record = log.write(run.completed_steps, run.scheduler.get_last_lr()[0])
            progress.set_postfix(loss=f"{record['train_loss']:.4f}")
        if (
            args.eval_steps
            and run.completed_steps % args.eval_steps == 0
            and run.completed_steps < run.max_train_steps
        ):
            evaluation = plan.evaluate(run)
            eval_history.append({"step": run.completed_steps, "evaluation": evaluation})
            run.log_metrics(summary_metrics(evaluation), label=f"step {run.completed_steps}")
        if args.checkpointing_steps and run.completed_steps % args.checkpointing_steps == 0:
            checkpoint_state = {"completed_steps": run.completed_steps, "eval_history": eval_history}
            save_checkpoint(accelerator, args.output_dir, checkpoint_state, None, args.checkpoints_total_limit)
    progress.close()
    # the evaluations before the checkpoint belong to this run's record
    return log, state.get("eval_history", []) + eval_history


def save(
    run: Run,
    offline: OfflineData,
    plan: EvaluationPlan,
    evaluation: dict[str, Any],
    eval_history: list,
    log: TrainingLog,
) -> dict:
    """The weights (every process: their fingerprints), then on the main process the return plot, the run record
    and the model card; returns the recipe's summary."""
    args, accelerator, output_dir = run.args, run.accelerator, run.output_dir
    metrics = summary_metrics(evaluation)
    fingerprints = save_model(accelerator, run.model, output_dir, args.merge_lora)
    if accelerator.is_main_process:
        stats, reference = offline.stats, plan.reference
        data_returns = {"data mean": stats["return_mean"], "data best": stats["return_max"]}
        if reference:
            data_returns.update({"random policy": reference["random"], "expert": reference["expert"]})
        if args.plot:
            title = f"{offline.env_id}, step {run.completed_steps}"
            plot_returns(output_dir / PLOT_FILE, evaluation, eval_history, data_returns, title)
            evaluation["plot"] = PLOT_FILE
        info = describe_dataset(args, offline.dataset, offline.metadata, stats, offline.env_id)
        record = run_record(
            args, accelerator.unwrap_model(run.model), recipe="decision_transformer", task=RL_TASK, dataset=info,
            hyperparameters=run.hyperparameters, metrics=metrics, evaluation=evaluation, eval_history=eval_history,
            num_parameters=run.num_parameters, train_steps=run.completed_steps, world_size=run.world,
            fingerprints=fingerprints, history=log.history,
        )  # fmt: skip
        publish_run(output_dir, record, args)
    return {
        **metrics,
        "evaluation": evaluation,
        "output_dir": str(output_dir),
        "world_size": run.world,
        "rank_weight_sha256": fingerprints,
        "train_steps": run.completed_steps,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """parse → trajectories → policy → prepare → train (evaluating on the way) → evaluate → save."""
    args = parse_args(argv)
    validate_args(args)
    config_overrides = parse_config_overrides(args.config_overrides, args.arch)
    run = start_run(args, lambda: default_output_dir(args))
    offline = load_offline_data(args)
    model = build_policy(args, offline, config_overrides)
    plan = plan_evaluation(args, offline)
    context_length = model.config.context_length
    windows = TrajectoryWindowSampler(offline.dataset, context_length, discrete=model.config.discrete)
    per_device, accumulation = args.per_device_train_batch_size, args.gradient_accumulation_steps
    # micro-batch i of process p: windows drawn with micro_batch_generator(seed, i, p), looked up when it is read
    train_dataloader = window_loader(
        windows, SequentialStepSampler(args.max_train_steps * accumulation, per_device, run.world),
        lambda micro_index, rank: micro_batch_generator(args.seed, micro_index, rank),
    )  # fmt: skip
    model = apply_lora(model, args)
    prepare(
        run, model, args.max_train_steps, "tf_family_decision_transformer", context_length=context_length,
        hidden_size=model.config.hidden_size, effective_batch_windows=run.world * per_device * accumulation,
    )  # fmt: skip
    train_dataloader = run.accelerator.prepare(train_dataloader)  # each process reads its own micro-batches
    described = (
        f"{len(offline.dataset)} trajectories ({len(windows)} steps) of {offline.env_id}, "
        f"{run.max_train_steps} steps of {run.world} x {per_device} windows of {context_length} steps"
    )
    log, eval_history = train(run, train_dataloader, plan, described)
    evaluation = plan.evaluate(run)
    run.log_metrics(summary_metrics(evaluation), label="evaluation")
    summary = save(run, offline, plan, evaluation, eval_history, log)
    run.end()  # the process group goes while the last barrier is held (see final_barrier)
    return summary


if __name__ == "__main__":
    raise SystemExit(run_main(main))
