"""Roll a Decision Transformer out in a gymnasium environment and score it (needs ``pip install 'tf-family[rl]'``).

`evaluate_in_env` runs ``num_episodes`` episodes side by side in one synchronous vector environment (one episode per
sub-environment, reset with seeds ``seed, seed + 1, ...``), conditions every episode on the same target return,
keeps each episode's last ``K`` steps in a `TrajectoryContext`, and reports the mean and std of the undiscounted
returns and, given reference returns, the D4RL normalised score ``100 * (R - R_random) / (R_expert - R_random)``.
"""

from __future__ import annotations

import statistics
from typing import Any

import torch

from ..models.decision_transformer.modeling_decision_transformer import TffDecisionTransformerModel, TrajectoryContext


def _make_vector_env(env_id: str, num_envs: int):
    try:
        import gymnasium
    except ImportError as error:
        raise ImportError("Evaluating in an environment needs gymnasium: pip install 'tf-family[rl]'.") from error
    try:
        return gymnasium.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync")
    except gymnasium.error.DependencyNotInstalled as error:
        raise ImportError(f"{env_id} needs a gymnasium extra that is not installed: {error}") from error


def _default_reference(env_id: str) -> dict[str, float] | None:
    from ..data.offline_rl import ENVIRONMENTS, reference_returns

    return reference_returns(env_id) if env_id in ENVIRONMENTS else None


@torch.no_grad()
def evaluate_in_env(
    model: TffDecisionTransformerModel,
    env_id: str | None = None,
    target_return: float | None = None,
    num_episodes: int = 10,
    seed: int = 0,
    reference_returns: dict[str, float] | None = None,
    max_episode_steps: int | None = None,
    do_sample: bool = False,
) -> dict[str, Any]:
    """Run ``num_episodes`` episodes at ``target_return`` and summarise their returns.

    Args:
        model: the policy (put it on the device you want; it is switched to eval mode).
        env_id: gymnasium id; defaults to ``model.config.env_id``.
        target_return: the return-to-go the episodes start with; defaults to ``model.config.target_return``.
        num_episodes: episodes, run in parallel (one sub-environment each).
        seed: episode ``i`` resets with ``seed + i``; sampled discrete actions draw from a generator seeded here.
        reference_returns: ``{"random": R_random, "expert": R_expert}`` for the normalised score; by default the
            tf_family offline-data references (`tf_family.data.offline_rl.reference_returns`) for the environments
            that have a scripted expert, else no normalised score.
        max_episode_steps: stop episodes after this many steps (defaults to the environment's time limit).
        do_sample: sample discrete actions instead of taking the most likely one.

    Returns:
        ``{"env_id", "target_return", "returns" (list), "lengths" (list), "mean_return", "std_return"}`` and, with
        references, ``"normalized_scores"``, ``"normalized_score"`` (mean) and ``"normalized_score_std"``.
    """
    config = model.config
    env_id = env_id or config.env_id
    if env_id is None:
        raise ValueError("Pass env_id, or set config.env_id (the gymnasium id of the model's environment).")
    target_return = config.target_return if target_return is None else target_return
    if target_return is None:
        raise ValueError("Pass target_return, or set config.target_return (the return to condition on).")
    if num_episodes < 1:
        raise ValueError(f"num_episodes must be >= 1, got {num_episodes}.")
    model.eval()
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    env = _make_vector_env(env_id, num_episodes)
    try:
        observations, _ = env.reset(seed=[seed + i for i in range(num_episodes)])
        if observations.shape[-1] != config.state_dim:
            raise ValueError(
                f"{env_id} has {observations.shape[-1]}-dimensional states but the model expects "
                f"state_dim={config.state_dim}."
            )
        limit = max_episode_steps or env.spec.max_episode_steps or config.max_ep_len
        context = TrajectoryContext.start(config, torch.as_tensor(observations, device=device), target_return)
        returns = torch.zeros(num_episodes, dtype=torch.float64)
        lengths = torch.zeros(num_episodes, dtype=torch.long)
        running = torch.ones(num_episodes, dtype=torch.bool)
        for _ in range(limit):
            action = model.get_action(**context.model_inputs(), do_sample=do_sample, generator=generator)
            env_action = action.cpu().numpy()
            if not config.discrete:  # e.g. an untanh'ed policy in Pendulum's [-2, 2]
                env_action = env_action.clip(env.single_action_space.low, env.single_action_space.high)
            observations, rewards, terminated, truncated, _ = env.step(env_action)
            rewards_tensor = torch.as_tensor(rewards, dtype=torch.float64)
            returns += rewards_tensor * running
            lengths += running.long()
            running &= ~torch.as_tensor(terminated | truncated)
            if not running.any():
                break
            # finished sub-environments reset on their next step; their rows are no longer read
            context = context.advance(action, rewards_tensor.float(), torch.as_tensor(observations, device=device))
    finally:
        env.close()

    episode_returns = returns.tolist()
    result: dict[str, Any] = {
        "env_id": env_id,
        "target_return": float(target_return),
        "returns": episode_returns,
        "lengths": lengths.tolist(),
        "mean_return": statistics.fmean(episode_returns),
        "std_return": statistics.pstdev(episode_returns),
    }
    reference = reference_returns if reference_returns is not None else _default_reference(env_id)
    if reference is not None:
        low, high = reference["random"], reference["expert"]
        scores = [100.0 * (value - low) / (high - low) for value in episode_returns]
        result.update(
            normalized_scores=scores,
            normalized_score=statistics.fmean(scores),
            normalized_score_std=statistics.pstdev(scores),
            reference_returns=dict(reference),
        )
    return result


__all__ = ["evaluate_in_env"]
