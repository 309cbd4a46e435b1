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
(``--dataset_name``). Training batches are random ``K``-step windows (`TrajectoryWindowSampler`); micro-batch ``i``
of process ``p`` is drawn from a generator seeded with ``(seed, i, p)``, so a resumed run draws exactly the windows
the uninterrupted one would have drawn.

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
reached, so ``--resume_from_checkpoint latest`` continues exactly where a run stopped.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import statistics
import time
from pathlib import Path
from typing import Any

import datasets
import torch
from accelerate import Accelerator
from accelerate.logging import get_logger
from accelerate.utils import DistributedType, gather_object
from tqdm.auto import tqdm
from transformers import AutoConfig, AutoModel, get_scheduler

import tf_family
from tf_family.cards import RL_TASK, RUN_INFO_FILE, write_model_card
from tf_family.data.offline_rl import (
    ENVIRONMENTS,
    TIERS,
    TrajectoryWindowSampler,
    make_offline_dataset,
    offline_dataset_metadata,
    reference_returns,
    trajectory_statistics,
)
from tf_family.hub import push_folder
from tf_family.models.decision_transformer.evaluation_decision_transformer import evaluate_in_env
from tf_family.recipes.causal_lm import (
    SCHEDULERS,
    TRACKERS,
    add_lora_and_hub_arguments,
    check_lora_targets,
    check_output_dir,
    ending_run,
    find_checkpoint,
    make_accelerator,
    parse_config_overrides,
    save_checkpoint,
    weights_fingerprint,
)
from tf_family.registry import ARCHITECTURES, get_arch

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

    train = parser.add_argument_group("optimisation")
    train.add_argument("--per_device_train_batch_size", type=int, default=64, help="windows per process")
    train.add_argument("--learning_rate", type=float, default=1e-4)
    train.add_argument("--weight_decay", type=float, default=1e-4)
    train.add_argument("--max_train_steps", type=int, default=10_000, help="optimizer steps")
    train.add_argument("--gradient_accumulation_steps", type=int, default=1)
    train.add_argument("--lr_scheduler_type", choices=SCHEDULERS, default="constant_with_warmup")
    train.add_argument("--num_warmup_steps", type=int, default=100)
    train.add_argument("--max_grad_norm", type=float, default=0.25, help="gradient clipping; 0 turns it off")
    train.add_argument("--mixed_precision", choices=["no", "fp16", "bf16"], default="no")
    train.add_argument("--seed", type=int, default=42)
    train.add_argument("--cpu", action="store_true", help="run on CPU even if a GPU is present")

    run = parser.add_argument_group("evaluation, checkpoints, output")
    run.add_argument("--eval_episodes", type=int, default=10, help="episodes per target return")
    run.add_argument("--eval_target_returns", type=float, nargs="+", help="returns to condition on")
    run.add_argument("--eval_seed", type=int, default=1_500_000_000, help="episode i resets with eval_seed + i")
    run.add_argument("--eval_steps", type=int, help="also evaluate every N optimizer steps")
    run.add_argument("--no_plot", dest="plot", action="store_false", help=f"skip {PLOT_FILE} (needs matplotlib)")
    run.add_argument("--output_dir", help="where the model, card and checkpoints go (default: runs/dt-<data>)")
    run.add_argument("--overwrite_output_dir", action="store_true", help="reuse a folder that holds an earlier run")
    run.add_argument("--checkpointing_steps", type=int, help="save a resumable checkpoint every N optimizer steps")
    run.add_argument("--checkpoints_total_limit", type=int, help="keep only the N most recent checkpoints")
    run.add_argument("--resume_from_checkpoint", help="a checkpoint folder, or 'latest' in --output_dir")
    run.add_argument("--logging_steps", type=int, default=50)
    run.add_argument("--report_to", default="none", help="experiment tracking: none, tensorboard, trackio, wandb, all")

    add_lora_and_hub_arguments(parser)
    return parser.parse_args(argv)


def action_architectures() -> list[str]:
    return [name for name, spec in ARCHITECTURES.items() if "action" in spec.model_classes]


def validate_args(args: argparse.Namespace) -> None:
    """Refuse, before any work, what cannot run; each message says what to change."""
    if args.arch is not None and args.model_name_or_path is not None:
        raise ValueError("Pass at most one of --arch (train from scratch) and --model_name_or_path (fine-tune).")
    if args.model_name_or_path is None:
        args.arch = args.arch or "decision_transformer"
        spec = get_arch(args.arch)  # ValueError listing the valid names
        if "action" not in spec.model_classes:
            raise ValueError(f"--arch {args.arch} does not act; architectures that do: {action_architectures()}.")
        spec.make_config(args.variant)  # ValueError naming the variants
        if args.lora_r:
            raise ValueError("--lora_r adapts a trained model: use it with --model_name_or_path, not with --arch.")
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
    for name in (
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "logging_steps",
        "max_train_steps",
        "eval_episodes",
        "dataset_steps",
    ):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name}={getattr(args, name)} must be at least 1.")
    for name in ("eval_steps", "checkpointing_steps", "checkpoints_total_limit"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name}={value} must be at least 1.")
    for name in ("reference_episodes", "num_warmup_steps", "eval_seed"):
        if getattr(args, name) < 0:
            raise ValueError(f"--{name}={getattr(args, name)} must be >= 0.")
    if args.lora_r < 0:
        raise ValueError(f"--lora_r={args.lora_r} must be >= 0 (0 turns LoRA off).")
    if args.merge_lora and not args.lora_r:
        raise ValueError("--merge_lora needs --lora_r > 0.")
    if args.push_to_hub and not args.hub_model_id:
        raise ValueError("--push_to_hub needs --hub_model_id user/name.")
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise ValueError(
            f"the plot ({PLOT_FILE}) needs matplotlib: pip install 'tf-family[rl]', or pass --no_plot to skip it."
        )
    trackers = (
        [] if args.report_to == "none" else list(TRACKERS) if args.report_to == "all" else args.report_to.split(",")
    )
    for tracker in trackers:
        if tracker not in TRACKERS:
            raise ValueError(f"--report_to {tracker!r} is not supported; use none, all or one of {list(TRACKERS)}.")
        if args.report_to != "all" and importlib.util.find_spec(TRACKERS[tracker]) is None:
            raise ValueError(f"--report_to {tracker} needs the {tracker} package: pip install {tracker}.")
    args.trackers = [t for t in trackers if importlib.util.find_spec(TRACKERS[t]) is not None]


def check_env_id(env_id: str) -> None:
    """A `ValueError` unless gymnasium knows ``env_id`` (an `ImportError` naming the extra without gymnasium)."""
    try:
        import gymnasium
    except ImportError as error:
        raise ImportError("Evaluating in an environment needs gymnasium: pip install 'tf-family[rl]'.") from error
    try:
        gymnasium.spec(env_id)
    except gymnasium.error.Error as error:
        raise ValueError(f"--env_id {env_id!r} is not a gymnasium environment ({error}).") from error


def default_output_dir(args: argparse.Namespace) -> str:
    if args.train_file:
        data = Path(args.train_file.rstrip("/")).stem
    elif args.dataset_name:
        data = args.dataset_name.replace("/", "_")
    else:
        data = f"{args.env_id}-{args.dataset_tier}"
    model = args.arch or Path(args.model_name_or_path.rstrip("/")).name
    return os.path.join("runs", f"{model}-{data}")


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


def environment_spaces(env_id: str) -> dict[str, Any]:
    """state_dim, act_dim, action_space and time limit of a gymnasium environment."""
    import gymnasium

    env = gymnasium.make(env_id)
    try:
        discrete = hasattr(env.action_space, "n")
        return {
            "state_dim": int(env.observation_space.shape[0]),
            "act_dim": int(env.action_space.n) if discrete else int(env.action_space.shape[0]),
            "action_space": "discrete" if discrete else "continuous",
            "max_episode_steps": env.spec.max_episode_steps,
            # tanh squashes actions into (-1, 1): right for spaces inside it, wrong for e.g. Pendulum's [-2, 2]
            "tanh_fits": (not discrete)
            and bool((env.action_space.low >= -1).all() and (env.action_space.high <= 1).all()),
        }
    finally:
        env.close()


def data_spaces(dataset: datasets.Dataset) -> dict[str, Any]:
    """What the data says about the state and action spaces (from its first trajectory and its action ids)."""
    first = dataset[0]
    actions = first["actions"]
    discrete = not isinstance(actions[0], list | tuple)
    spaces = {
        "state_dim": len(first["observations"][0]),
        "action_space": "discrete" if discrete else "continuous",
        "longest_episode": max(len(rewards) for rewards in dataset["rewards"]),
    }
    if discrete:
        spaces["max_action_id"] = max(max(row) for row in dataset["actions"])
    else:
        spaces["act_dim"] = len(actions[0])
    return spaces


def check_model_fits(config, data: dict[str, Any], env: dict[str, Any], env_id: str, source: str) -> None:
    """`ValueError` when the model, the data and the environment disagree on states or actions."""
    if data["state_dim"] != env["state_dim"]:
        raise ValueError(
            f"the data has {data['state_dim']}-dimensional states but {env_id} has {env['state_dim']}; pass the "
            "--env_id the data was collected in."
        )
    if data["action_space"] != env["action_space"]:
        raise ValueError(f"the data has {data['action_space']} actions but {env_id} has {env['action_space']} ones.")
    if config.state_dim != data["state_dim"]:
        raise ValueError(
            f"{source} has state_dim={config.state_dim} but the data's states have {data['state_dim']} dimensions; "
            f"use state_dim={data['state_dim']} (or drop the override)."
        )
    if config.action_space != data["action_space"]:
        raise ValueError(f"{source} has {config.action_space} actions but the data has {data['action_space']} ones.")
    if config.act_dim != env["act_dim"]:
        raise ValueError(
            f"{source} has act_dim={config.act_dim} but {env_id} has {env['act_dim']} action "
            f"{'ids' if config.discrete else 'dimensions'}; use act_dim={env['act_dim']}."
        )
    if data["action_space"] == "continuous" and data["act_dim"] != config.act_dim:
        raise ValueError(
            f"the data has {data['act_dim']}-dimensional actions but {source} has act_dim={config.act_dim}."
        )
    if data.get("max_action_id", -1) >= config.act_dim:
        raise ValueError(
            f"the data has action id {data['max_action_id']} but {source} knows act_dim={config.act_dim} actions."
        )


def micro_batch_generator(seed: int, micro_index: int, rank: int) -> torch.Generator:
    """The generator of micro-batch ``micro_index`` of process ``rank``: a function of the three only, so a resumed
    run samples the same windows as the uninterrupted one."""
    return torch.Generator().manual_seed(((seed * 1_000_003 + micro_index) * 1009 + rank) % 2**63)


def episode_shares(num_episodes: int, world: int) -> list[tuple[int, int]]:
    """``(first episode, count)`` for each process: contiguous, as even as possible."""
    base, extra = divmod(num_episodes, world)
    shares, start = [], 0
    for rank in range(world):
        count = base + (rank < extra)
        shares.append((start, count))
        start += count
    return shares


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
    shares = gather_object([mine])  # one dict per process, in rank order
    targets = []
    for target in target_returns:
        returns = [value for share in shares for value in share[target]]
        entry: dict[str, Any] = {
            "target_return": float(target),
            "returns": returns,
            "mean_return": statistics.fmean(returns),
            "std_return": statistics.pstdev(returns),
            "normalized_score": None,
            "normalized_score_std": None,
        }
        if reference:
            scores = [
                100.0 * (value - reference["random"]) / (reference["expert"] - reference["random"])
                for value in returns
            ]
            entry.update(normalized_score=statistics.fmean(scores), normalized_score_std=statistics.pstdev(scores))
        targets.append(entry)
    best = max(targets, key=lambda entry: entry["mean_return"])
    return {
        "env_id": env_id,
        "seed": seed,
        "num_episodes": num_episodes,
        "reference_returns": reference,
        "targets": targets,
        "best_target_return": best["target_return"],
        "best_mean_return": best["mean_return"],
        "best_normalized_score": best["normalized_score"],
    }


def summary_metrics(evaluation: dict[str, Any]) -> dict[str, float]:
    """Flat numbers for logging: mean return (and normalised score) at each target, and the best."""
    metrics = {}
    for entry in evaluation["targets"]:
        key = f"{entry['target_return']:g}"
        metrics[f"mean_return@{key}"] = entry["mean_return"]
        if entry["normalized_score"] is not None:
            metrics[f"normalized_score@{key}"] = entry["normalized_score"]
    metrics["best_mean_return"] = evaluation["best_mean_return"]
    if evaluation["best_normalized_score"] is not None:
        metrics["best_normalized_score"] = evaluation["best_normalized_score"]
    return metrics


def plot_returns(
    path: Path, final: dict[str, Any], history: list[dict[str, Any]], data_returns: dict[str, float], title: str
) -> Path:
    """Achieved return (mean ± std over episodes) against target return: the final evaluation, the ones during
    training (fainter), the line ``achieved = target``, and the data's and reference returns."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6.4, 4.8), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for index, record in enumerate(history):
        entries = record["evaluation"]["targets"]
        axes.plot(
            [e["target_return"] for e in entries],
            [e["mean_return"] for e in entries],
            marker=".",
            color="tab:blue",
            alpha=0.2 + 0.5 * (index + 1) / (len(history) + 1),
            label="during training (later = darker)" if index == 0 else None,
        )
    entries = final["targets"]
    targets = [e["target_return"] for e in entries]
    axes.errorbar(
        targets,
        [e["mean_return"] for e in entries],
        yerr=[e["std_return"] for e in entries],
        marker="o",
        capsize=4,
        color="tab:red",
        label=f"final ({final['num_episodes']} episodes per target)",
    )
    low = min([*targets, *data_returns.values()])
    high = max([*targets, *data_returns.values()])
    axes.plot([low, high], [low, high], linestyle="--", color="grey", label="achieved = target")
    styles = {"data mean": ":", "data best": "-.", "random policy": ":", "expert": "-."}
    colors = {"data mean": "tab:green", "data best": "tab:green", "random policy": "black", "expert": "tab:purple"}
    for name, value in data_returns.items():
        axes.axhline(value, linestyle=styles.get(name, ":"), color=colors.get(name, "black"), lw=1, label=name)
    axes.set_xlabel("target return (conditioning)")
    axes.set_ylabel("achieved return")
    axes.set_title(title)
    axes.legend(fontsize="small")
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
    return path


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    validate_args(args)
    args.output_dir = args.output_dir or default_output_dir(args)
    config_overrides = parse_config_overrides(args.config_overrides)
    output_dir = check_output_dir(args)

    accelerator = make_accelerator(args, output_dir)

    # ---- data -------------------------------------------------------------------------------------------------
    # generation is deterministic: every process makes the same trajectories
    dataset, metadata = load_trajectories(args)
    env_id = args.env_id or metadata.get("env_id")
    if env_id is None and args.model_name_or_path:
        env_id = getattr(AutoConfig.from_pretrained(args.model_name_or_path), "env_id", None)
    if env_id is None:
        raise ValueError("the data does not say which environment it comes from; pass --env_id (a gymnasium id).")
    check_env_id(env_id)
    env = environment_spaces(env_id)
    data = data_spaces(dataset)
    stats = trajectory_statistics(dataset)
    returns = [sum(rewards) for rewards in dataset["rewards"]]

    # ---- model ------------------------------------------------------------------------------------------------
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
            largest = max(abs(stats["return_max"]), abs(min(returns)), 1.0)
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
                f"{action_architectures()}."
            )
    check_model_fits(model.config, data, env, env_id, source)
    if data["longest_episode"] > model.config.max_ep_len:
        raise ValueError(
            f"the data has episodes of {data['longest_episode']} steps but {source} has max_ep_len="
            f"{model.config.max_ep_len}; raise max_ep_len."
        )
    reference = metadata.get("reference_returns") if args.reference_episodes else None
    if reference is None and args.reference_episodes and env_id in ENVIRONMENTS:
        reference = reference_returns(env_id, args.reference_episodes)
    context_length = model.config.context_length
    sampler = TrajectoryWindowSampler(dataset, context_length, discrete=model.config.discrete)
    target_returns = args.eval_target_returns or sorted(
        {
            round(stats["return_mean"], 1),
            round(stats["return_max"], 1),
            *([round(reference["expert"], 1)] if reference else []),
        }
    )

    # ---- LoRA -------------------------------------------------------------------------------------------------
    if args.lora_r:
        from peft import LoraConfig, get_peft_model

        registry_spec = next(
            (s for s in ARCHITECTURES.values() if model.config.model_type in (s.model_type, *s.legacy_model_types)),
            None,
        )
        targets = args.lora_target_modules or (list(registry_spec.lora_target_modules) if registry_spec else None)
        if targets:
            check_lora_targets(model, targets)
        model = get_peft_model(
            model,
            LoraConfig(
                r=args.lora_r, lora_alpha=args.lora_alpha, lora_dropout=args.lora_dropout, target_modules=targets
            ),
        )

    # ---- optimizer, schedule ----------------------------------------------------------------------------------
    # the usual no-decay groups: biases, layer norms and embeddings' 1-d parameters
    decay, skip = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (skip if param.ndim < 2 or name.endswith("bias") else decay).append(param)
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": skip, "weight_decay": 0.0}],
        lr=args.learning_rate,
    )
    world, per_device = accelerator.num_processes, args.per_device_train_batch_size
    max_train_steps = args.max_train_steps
    # a prepared scheduler advances once per process at every optimizer step (accelerate's convention)
    scheduler = get_scheduler(
        args.lr_scheduler_type,
        optimizer,
        num_warmup_steps=args.num_warmup_steps * world,
        num_training_steps=max_train_steps * world,
    )
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)

    hyperparameters = {
        "arch": args.arch,
        "variant": args.variant if args.arch else None,
        "base_model": args.model_name_or_path,
        "context_length": context_length,
        "hidden_size": accelerator.unwrap_model(model).config.hidden_size,
        "per_device_train_batch_size": per_device,
        "world_size": world,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "effective_batch_windows": world * per_device * args.gradient_accumulation_steps,
        "learning_rate": args.learning_rate,
        "weight_decay": args.weight_decay,
        "lr_scheduler": args.lr_scheduler_type,
        "num_warmup_steps": args.num_warmup_steps,
        "max_grad_norm": args.max_grad_norm,
        "max_train_steps": max_train_steps,
        "mixed_precision": args.mixed_precision,
        "seed": args.seed,
        **({"config_overrides": " ".join(args.config_overrides)} if args.config_overrides else {}),
        **(
            {
                "lora_r": args.lora_r,
                "lora_alpha": args.lora_alpha,
                "lora_dropout": args.lora_dropout,
                "merge_lora": args.merge_lora,
            }
            if args.lora_r
            else {}
        ),
    }
    hyperparameters = {k: v for k, v in hyperparameters.items() if v is not None}
    if args.trackers:
        accelerator.init_trackers("tf_family_decision_transformer", config=hyperparameters)

    # ---- resume -----------------------------------------------------------------------------------------------
    completed_steps = 0
    if args.resume_from_checkpoint:
        checkpoint = find_checkpoint(args.output_dir, args.resume_from_checkpoint)
        state = json.loads((checkpoint / "trainer_state.json").read_text())
        if state["world_size"] != world:
            raise ValueError(
                f"{checkpoint} was written by {state['world_size']} processes; resume it with as many "
                f"(this run has {world})."
            )
        accelerator.load_state(str(checkpoint))
        completed_steps = state["completed_steps"]
        logger.info(f"resumed from {checkpoint} at step {completed_steps}", main_process_only=True)

    # ---- train ------------------------------------------------------------------------------------------------
    num_parameters = sum(p.numel() for p in model.parameters())
    logger.info(
        f"{num_parameters:,} parameters, {len(dataset)} trajectories ({len(sampler)} steps) of {env_id}, "
        f"{max_train_steps} steps of {world} x {per_device} windows of {context_length} steps",
        main_process_only=True,
    )
    progress = tqdm(
        total=max_train_steps, initial=completed_steps, disable=not accelerator.is_local_main_process, desc="training"
    )
    model.train()
    history: list[dict[str, float]] = []
    eval_history: list[dict[str, Any]] = []
    window_loss, window_batches, window_start = 0.0, 0, time.perf_counter()
    accumulation = args.gradient_accumulation_steps
    for micro_index in range(completed_steps * accumulation, max_train_steps * accumulation):
        generator = micro_batch_generator(args.seed, micro_index, accelerator.process_index)
        batch = {k: v.to(accelerator.device) for k, v in sampler.sample(per_device, generator).items()}
        # accumulate(): gradients are all-reduced and the optimizer steps on every `accumulation`-th micro-batch
        with accelerator.accumulate(model):
            with accelerator.autocast():
                outputs = model(**batch)
            loss = outputs.loss
            accelerator.backward(loss)
            if accelerator.sync_gradients and args.max_grad_norm > 0:
                accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        window_loss += loss.item()
        window_batches += 1
        if not accelerator.sync_gradients:
            continue
        completed_steps += 1
        progress.update(1)

        if completed_steps % args.logging_steps == 0 or completed_steps == max_train_steps:
            totals = accelerator.reduce(
                torch.tensor([window_loss, window_batches], dtype=torch.float64, device=accelerator.device),
                reduction="sum",
            ).tolist()
            seconds = time.perf_counter() - window_start
            record = {
                "train_loss": totals[0] / max(totals[1], 1),
                "windows_per_second": totals[1] * per_device / seconds,
                "learning_rate": scheduler.get_last_lr()[0],
                "step": completed_steps,
            }
            history.append(record)
            progress.set_postfix(loss=f"{record['train_loss']:.4f}")
            accelerator.log({k: v for k, v in record.items() if k != "step"}, step=completed_steps)
            window_loss, window_batches, window_start = 0.0, 0, time.perf_counter()
        if args.eval_steps and completed_steps % args.eval_steps == 0 and completed_steps < max_train_steps:
            evaluation = evaluate(
                model, env_id, target_returns, args.eval_episodes, args.eval_seed, reference, accelerator
            )
            eval_history.append({"step": completed_steps, "evaluation": evaluation})
            metrics = summary_metrics(evaluation)
            accelerator.log({f"eval/{k}": v for k, v in metrics.items()}, step=completed_steps)
            logger.info(f"step {completed_steps}: {metrics}", main_process_only=True)
        if args.checkpointing_steps and completed_steps % args.checkpointing_steps == 0:
            save_checkpoint(
                accelerator,
                args.output_dir,
                {"completed_steps": completed_steps, "eval_history": eval_history},
                None,
                args.checkpoints_total_limit,
            )
    progress.close()
    if args.resume_from_checkpoint:  # the evaluations before the checkpoint belong to this run's record
        eval_history = state.get("eval_history", []) + eval_history

    # ---- evaluate ---------------------------------------------------------------------------------------------
    evaluation = evaluate(model, env_id, target_returns, args.eval_episodes, args.eval_seed, reference, accelerator)
    metrics = summary_metrics(evaluation)
    accelerator.log({f"eval/{k}": v for k, v in metrics.items()}, step=completed_steps)
    logger.info(f"evaluation: {metrics}", main_process_only=True)

    # ---- save -------------------------------------------------------------------------------------------------
    unwrapped = accelerator.unwrap_model(model)
    sharded = accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED)
    # under data parallelism every process must end with the same weights; the record lets a reader check it
    fingerprints = None if sharded else gather_object([weights_fingerprint(unwrapped)])
    full_state_dict = accelerator.get_state_dict(model) if sharded else None
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        output_dir.mkdir(parents=True, exist_ok=True)
        to_save = unwrapped.merge_and_unload() if args.merge_lora else unwrapped
        to_save.save_pretrained(output_dir, state_dict=full_state_dict, safe_serialization=True)
        data_returns = {"data mean": stats["return_mean"], "data best": stats["return_max"]}
        if reference:
            data_returns.update({"random policy": reference["random"], "expert": reference["expert"]})
        if args.plot:
            plot_returns(
                output_dir / PLOT_FILE, evaluation, eval_history, data_returns, f"{env_id}, step {completed_steps}"
            )
            evaluation["plot"] = PLOT_FILE
        generated = not (args.train_file or args.dataset_name)
        if generated:
            title = (
                f"{env_id} {args.dataset_tier} ({args.medium_policy} medium), generated with "
                f"tf_family.data.offline_rl.make_offline_dataset (seed {args.dataset_seed})"
            )
        else:
            title = args.dataset_name or args.train_file
        info = {
            "name": args.dataset_name,
            "title": title,
            "on_hub": bool(args.dataset_name),
            "train_file": args.train_file,
            "env_id": env_id,
            "tier": metadata.get("tier"),
            "generated": generated,
            "generator": (
                {
                    "env_id": env_id,
                    "tier": args.dataset_tier,
                    "num_steps": args.dataset_steps,
                    "seed": args.dataset_seed,
                    "medium_policy": args.medium_policy,
                }
                if generated
                else None
            ),
            "num_episodes": len(dataset),
            "num_transitions": stats["num_transitions"],
            "mean_return": stats["return_mean"],
            "max_return": stats["return_max"],
            "description": f"{title}: {len(dataset)} trajectories, {stats['num_transitions']} transitions, "
            f"mean return {stats['return_mean']:.1f} (best {stats['return_max']:.1f}, worst {min(returns):.1f}).",
        }
        run_info = {
            "recipe": "recipes/decision_transformer.py",
            "task": RL_TASK,
            "tf_family_version": tf_family.__version__,
            "model_type": unwrapped.config.model_type,
            "arch": args.arch,
            "base_model": args.model_name_or_path,
            "dataset": {k: v for k, v in info.items() if v is not None},
            "hyperparameters": hyperparameters,
            "metrics": metrics,
            "evaluation": evaluation,
            "eval_history": eval_history,
            "num_parameters": num_parameters,
            "train_steps": completed_steps,
            "world_size": world,
            "rank_weight_sha256": fingerprints,
            "train_history": history,
        }
        (output_dir / RUN_INFO_FILE).write_text(json.dumps(run_info, indent=2) + "\n")
        write_model_card(output_dir, args.hub_model_id)
        if args.push_to_hub:
            pushed = push_folder(output_dir, args.hub_model_id, token=args.hub_token, private=args.hub_private or None)
            logger.info(f"pushed {pushed} to {args.hub_model_id}")
    # ---- end: the process group goes while the last barrier is held (see final_barrier) -----------------------
    with ending_run(accelerator):
        model, optimizer, scheduler = accelerator.free_memory(model, optimizer, scheduler)  # DDP holds the group
    return {
        **metrics,
        "evaluation": evaluation,
        "output_dir": str(output_dir),
        "world_size": world,
        "rank_weight_sha256": fingerprints,
        "train_steps": completed_steps,
    }


if __name__ == "__main__":
    main()
