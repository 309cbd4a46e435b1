"""What the Decision Transformer recipe (``recipes/decision_transformer.py``) needs beside its data, model and loop:
the environment's and the data's state and action spaces and the checks that the model fits them, the split of the
evaluation episodes between processes and the summary of their returns, the flat metrics of an evaluation, the plot
of achieved against target return, the run record's description of the data, and the `DataLoader` of its training
windows (`WindowBatchDataset`, `window_loader`)."""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import datasets
import torch


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


def episode_shares(num_episodes: int, world: int) -> list[tuple[int, int]]:
    """``(first episode, count)`` for each process: contiguous, as even as possible."""
    base, extra = divmod(num_episodes, world)
    shares, start = [], 0
    for rank in range(world):
        count = base + (rank < extra)
        shares.append((start, count))
        start += count
    return shares


def summarise_returns(
    shares: list[dict[float, list[float]]], target_returns: list[float], reference: dict[str, float] | None
) -> dict[str, Any]:
    """The returns of every process's episodes (``shares``: per process, target return → returns, in rank order),
    summed up for each of ``target_returns``: ``{"reference_returns", "targets": [{"target_return", "returns",
    "mean_return", "std_return", "normalized_score", "normalized_score_std"}, ...], "best_target_return",
    "best_mean_return", "best_normalized_score"}`` (normalised scores are None without references: 0 = random
    policy, 100 = expert)."""
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


def describe_dataset(
    args: argparse.Namespace,
    dataset: datasets.Dataset,
    metadata: dict[str, Any],
    stats: dict[str, Any],
    env_id: str,
) -> dict[str, Any]:
    """The run record's ``dataset`` entry: where the trajectories come from (generated by `make_offline_dataset`
    with the recipe's ``--dataset_*`` settings, a local file or a Hub dataset) and their size and returns."""
    generated = not (args.train_file or args.dataset_name)
    if generated:
        title = (
            f"{env_id} {args.dataset_tier} ({args.medium_policy} medium), generated with "
            f"tf_family.data.offline_rl.make_offline_dataset (seed {args.dataset_seed})"
        )
    else:
        title = args.dataset_name or args.train_file
    worst = min(sum(rewards) for rewards in dataset["rewards"])
    return {
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
        f"mean return {stats['return_mean']:.1f} (best {stats['return_max']:.1f}, worst {worst:.1f}).",
    }


class WindowBatchDataset(torch.utils.data.Dataset):
    """Random training windows (`tf_family.data.offline_rl.TrajectoryWindowSampler`) read a micro-batch at a time by
    a `DataLoader` over a `tf_family.data.sampling.SequentialStepSampler`: the indices of a batch name the micro-batch
    (``indices[0] // step_rows``) and the process reading it (its slice of the step), and ``__getitems__`` returns
    ``windows.sample(len(indices), generator_of(micro_batch, rank))``. What is drawn is then a function of the
    micro-batch and the process only, so ``skip_first_batches`` (which skips a sampler's batches unread) resumes a
    run on exactly the windows the uninterrupted one drew.

    Args:
        windows: the training data's `TrajectoryWindowSampler`.
        step_rows: the windows of one step over all processes (``num_processes · batch_size``).
        generator_of: ``(micro_batch, rank) -> torch.Generator`` (the recipe's, seeded with ``--seed``).
    """

    def __init__(self, windows, step_rows: int, generator_of: Callable[[int, int], torch.Generator]):
        if not isinstance(step_rows, int) or step_rows < 1:
            raise ValueError(f"step_rows={step_rows!r} must be a positive integer.")
        self.windows, self.step_rows, self.generator_of = windows, step_rows, generator_of

    def __len__(self) -> int:
        return len(self.windows)

    def __getitems__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        micro_batch, row = divmod(indices[0], self.step_rows)
        return self.windows.sample(len(indices), self.generator_of(micro_batch, row // len(indices)))

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {name: rows[0] for name, rows in self.__getitems__([index]).items()}


def window_loader(
    windows, sampler, generator_of: Callable[[int, int], torch.Generator]
) -> torch.utils.data.DataLoader:
    """A `DataLoader` of `WindowBatchDataset` micro-batches in ``sampler``'s order (a `SequentialStepSampler` of
    ``--max_train_steps`` × accumulation micro-batches), for ``accelerator.prepare``; its own seeded generator, as
    `tf_family.data.sampling.block_loader`'s, leaves the global random state alone."""
    from ..data.sampling import keep_batch

    dataset = WindowBatchDataset(windows, sampler.num_processes * sampler.batch_size, generator_of)
    return torch.utils.data.DataLoader(
        dataset, batch_sampler=sampler, collate_fn=keep_batch, generator=torch.Generator().manual_seed(0)
    )
