"""Offline reinforcement-learning datasets generated from real simulators (D4RL layout, no download).

D4RL is unmaintained and Minari downloads from the Hub, so tf_family makes its offline datasets itself: a scripted
expert controller acts in a real `gymnasium` environment, and quality tiers come from mixing in uniformly random
actions (an ε-greedy expert), the way D4RL's tiers come from policies of decreasing quality:

============== ======================================================================================================
tier           episodes
============== ======================================================================================================
``expert``     the controller alone (ε = 0)
``medium``     the controller with ε = the environment's ``medium_epsilon`` (about a third to a half of the expert's
               normalised return)
``random``     uniformly random actions (ε = 1)
``medium-replay``  ε falls linearly from 1 to ``medium_epsilon`` over the step budget: the replay buffer of an
               agent that learns up to medium quality
``medium-expert``  half of the transitions from ``medium`` episodes, half from ``expert`` episodes (D4RL's
               definition)
============== ======================================================================================================

With ``medium_policy="degraded"`` the medium agent is instead a systematically worse deterministic controller
(see `make_offline_dataset`), for ``medium``, ``medium-replay`` (ε falling from 1 to 0 around it) and
``medium-expert``.

Environments and controllers (the controllers are plain functions of the observation):

- ``LunarLander-v3`` (8-d state, 4 discrete actions; needs ``gymnasium[box2d]``): gymnasium's own heuristic lander.
- ``CartPole-v1`` (4-d, 2 discrete actions): push towards the side the pole falls to, ``θ + 0.5 θ̇ + 0.1 ẋ > 0``.
- ``Pendulum-v1`` (3-d, 1-d torque in [-2, 2]): energy pumping far from the top, a PD controller near it.
- ``InvertedPendulum-v5`` (4-d, 1-d force in [-3, 3]; needs ``gymnasium[mujoco]``): a PD controller.

A dataset is a `datasets.Dataset` with one row per trajectory and the columns ``observations`` (T, state_dim),
``actions`` (T,) ints for discrete or (T, act_dim) floats for continuous action spaces, ``rewards`` (T,),
``terminals`` (T,) and ``truncations`` (T,) (True on the last step of an episode that ended by the environment's
time limit, D4RL's ``timeouts``). ``observations[t]`` is the state in which ``actions[t]`` was taken and
``rewards[t]`` received. Generation is deterministic for a seed: episode ``i`` resets the environment with
``seed + i`` and every random choice is drawn from a `random.Random` seeded from ``seed``.

Normalised scores follow D4RL: ``100 * (R - R_random) / (R_expert - R_random)``, with the reference returns of the
pure random policy and the pure controller measured on ``reference_episodes`` evaluation episodes (seeds disjoint
from the data's). They are stored with the dataset (`offline_dataset_metadata`) together with each tier's mean
return.
"""

from __future__ import annotations

import functools
import json
import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from datasets import Dataset, DatasetInfo, Features, Value
from datasets import Sequence as SequenceFeature

Tier = Literal["expert", "medium", "random", "medium-replay", "medium-expert"]
TIERS: tuple[str, ...] = ("expert", "medium", "random", "medium-replay", "medium-expert")
_REFERENCE_SEED = (
    10**9
)  # evaluation episodes reset with seeds from here on; data seeds stay below (see _EXPERT_OFFSET)
_EXPERT_OFFSET = 5 * 10**8  # medium-expert: the expert half resets with seed + _EXPERT_OFFSET + i


def _require_gymnasium(extra: str = "rl"):
    try:
        import gymnasium
    except ImportError as error:
        raise ImportError(
            f"Offline RL datasets need gymnasium: pip install 'tf-family[{extra}]' (gymnasium[classic-control,box2d,"
            "mujoco])."
        ) from error
    return gymnasium


# --------------------------------------------------------------------------------------------------- controllers
def _cartpole_controller(env: Any, observation: Sequence[float]) -> int:
    _, cart_velocity, angle, angular_velocity = observation
    return int(angle + 0.5 * angular_velocity + 0.1 * cart_velocity > 0)


def _pendulum_controller(env: Any, observation: Sequence[float]) -> list[float]:
    # Energy pumping (Åström & Furuta 2000) until the pendulum is near the top, then a PD controller holds it.
    cos_angle, sin_angle, angular_velocity = (float(x) for x in observation)
    angle = math.atan2(sin_angle, cos_angle)  # 0 = upright
    if cos_angle > 0.9:
        torque = -10.0 * angle - 2.0 * angular_velocity
    else:
        energy = 0.5 * angular_velocity**2 + 10.0 * (cos_angle - 1.0)  # 0 at rest upright (g = 10, m = l = 1)
        direction = math.copysign(1.0, angular_velocity)
        torque = 2.0 * direction if energy < 0 else -2.0 * direction
    return [min(2.0, max(-2.0, torque))]


def _inverted_pendulum_controller(env: Any, observation: Sequence[float]) -> list[float]:
    position, angle, velocity, angular_velocity = (float(x) for x in observation)
    force = 10.0 * angle + position + 2.0 * angular_velocity + 0.5 * velocity
    return [min(3.0, max(-3.0, force))]


def _lunar_lander_controller(env: Any, observation: Sequence[float]) -> int:
    from gymnasium.envs.box2d.lunar_lander import heuristic

    return int(heuristic(env.unwrapped, observation))


# Degraded controllers: systematically worse, deterministic policies (a "medium" agent that is wrong in the same
# way every time, unlike ε-noise, whose most frequent action in every state is still the expert's).
def _cartpole_degraded(env: Any, observation: Sequence[float]) -> int:
    return int(observation[3] > 0)  # reacts to the pole's angular velocity only (about 195 of 500)


def _pendulum_degraded(env: Any, observation: Sequence[float]) -> list[float]:
    return [min(1.5, max(-1.5, _pendulum_controller(env, observation)[0]))]  # a weaker motor (about -875)


def _inverted_pendulum_degraded(env: Any, observation: Sequence[float]) -> list[float]:
    position, angle, velocity, angular_velocity = (float(x) for x in observation)
    force = 3.0 * angle + position + 0.6 * angular_velocity + 0.5 * velocity  # 0.3 x the angle gains (about 130)
    return [min(3.0, max(-3.0, force))]


def _lunar_lander_degraded(env: Any, observation: Sequence[float]) -> int:
    import numpy

    # misjudges its vertical speed by half: hovers and lands hard (about 0 against the heuristic's 210-260)
    seen = numpy.array(observation, dtype=numpy.float32)
    seen[3] *= 0.5
    return _lunar_lander_controller(env, seen)


@dataclass(frozen=True)
class OfflineEnvironment:
    """A gymnasium environment with the scripted expert that generates its offline data.

    Attributes:
        env_id: gymnasium id.
        controller: ``(env, observation) -> action`` (an int for discrete, a list of floats for continuous actions).
        medium_epsilon: probability of a random action in the ``medium`` tier (``medium_policy="epsilon"``).
        extra: the gymnasium extra the environment needs (named in the `ImportError`).
        degraded_controller: a systematically worse deterministic controller, the ``medium`` policy of
            ``medium_policy="degraded"``.
    """

    env_id: str
    controller: Callable[[Any, Sequence[float]], Any]
    medium_epsilon: float
    extra: str
    degraded_controller: Callable[[Any, Sequence[float]], Any]


ENVIRONMENTS: dict[str, OfflineEnvironment] = {
    "LunarLander-v3": OfflineEnvironment(
        "LunarLander-v3", _lunar_lander_controller, 0.3, "box2d", _lunar_lander_degraded
    ),
    "CartPole-v1": OfflineEnvironment(
        "CartPole-v1", _cartpole_controller, 0.45, "classic-control", _cartpole_degraded
    ),
    "Pendulum-v1": OfflineEnvironment("Pendulum-v1", _pendulum_controller, 0.3, "classic-control", _pendulum_degraded),
    "InvertedPendulum-v5": OfflineEnvironment(
        "InvertedPendulum-v5", _inverted_pendulum_controller, 0.1, "mujoco", _inverted_pendulum_degraded
    ),
}


def get_offline_environment(env_id: str) -> OfflineEnvironment:
    """The `OfflineEnvironment` for ``env_id``, or a `ValueError` listing the supported ids."""
    if env_id not in ENVIRONMENTS:
        raise ValueError(f"env_id={env_id!r} has no scripted expert; choose one of {sorted(ENVIRONMENTS)}.")
    return ENVIRONMENTS[env_id]


def make_env(env_id: str, **kwargs: Any):
    """``gymnasium.make(env_id)``, with an `ImportError` naming the pip extra when the simulator is missing."""
    spec = get_offline_environment(env_id)
    gymnasium = _require_gymnasium()
    try:
        return gymnasium.make(env_id, **kwargs)
    except (ImportError, gymnasium.error.DependencyNotInstalled) as error:
        raise ImportError(f"{env_id} needs gymnasium[{spec.extra}]: pip install 'tf-family[rl]'.") from error


def controller_action(env_id: str, env: Any, observation: Sequence[float]) -> Any:
    """The scripted expert's action for ``observation`` in ``env`` (an environment made with `make_env`)."""
    return get_offline_environment(env_id).controller(env, observation)


# ------------------------------------------------------------------------------------------------------ rollouts
def _random_action(space: Any, rng: random.Random) -> Any:
    if hasattr(space, "n"):
        return rng.randrange(int(space.n))
    return [rng.uniform(float(low), float(high)) for low, high in zip(space.low, space.high, strict=True)]


def _as_env_action(space: Any, action: Any) -> Any:
    if hasattr(space, "n"):
        return int(action)
    import numpy

    return numpy.asarray(action, dtype=space.dtype)


def _run_episode(env: Any, controller: Callable, epsilon: float, episode_seed: int, rng: random.Random) -> dict:
    observation, _ = env.reset(seed=episode_seed)
    discrete = hasattr(env.action_space, "n")
    observations, actions, rewards, terminals, truncations = [], [], [], [], []
    while True:
        explore = rng.random() < epsilon
        action = _random_action(env.action_space, rng) if explore else controller(env, observation)
        observations.append([float(x) for x in observation])
        actions.append(int(action) if discrete else [float(x) for x in action])
        observation, reward, terminated, truncated, _ = env.step(_as_env_action(env.action_space, action))
        rewards.append(float(reward))
        terminals.append(bool(terminated))
        truncations.append(bool(truncated and not terminated))
        if terminated or truncated:
            break
    return {
        "observations": observations,
        "actions": actions,
        "rewards": rewards,
        "terminals": terminals,
        "truncations": truncations,
    }


def rollout_returns(env_id: str, epsilon: float, num_episodes: int, seed: int) -> list[float]:
    """Undiscounted returns of ``num_episodes`` episodes of the ε-greedy controller (ε = 1: random policy)."""
    spec = get_offline_environment(env_id)
    env = make_env(env_id)
    rng = random.Random(seed)
    try:
        return [
            sum(_run_episode(env, spec.controller, epsilon, seed + i, rng)["rewards"]) for i in range(num_episodes)
        ]
    finally:
        env.close()


@functools.lru_cache(maxsize=32)
def reference_returns(env_id: str, num_episodes: int = 50) -> dict[str, float]:
    """Mean returns of the random policy and of the scripted expert: the 0 and 100 of normalised scores.

    Measured on ``num_episodes`` episodes each, with evaluation seeds disjoint from the data seeds (deterministic,
    cached per process).
    """
    if num_episodes < 1:
        raise ValueError(f"num_episodes must be >= 1, got {num_episodes}.")
    return {
        "random": statistics.fmean(rollout_returns(env_id, 1.0, num_episodes, _REFERENCE_SEED)),
        "expert": statistics.fmean(rollout_returns(env_id, 0.0, num_episodes, _REFERENCE_SEED)),
    }


def normalized_score(episode_return: float, random_return: float, expert_return: float) -> float:
    """D4RL's normalised score: 0 for the random policy, 100 for the expert."""
    if expert_return == random_return:
        raise ValueError(f"expert_return and random_return are both {expert_return}; the score is undefined.")
    return 100.0 * (episode_return - random_return) / (expert_return - random_return)


def _collect(
    env: Any,
    controller: Callable,
    epsilon: Callable[[float], float],
    num_steps: int,
    seed: int,
    rng: random.Random,
) -> list[dict]:
    """Whole episodes until at least ``num_steps`` transitions; an episode's ε is ``epsilon(progress)``, where
    ``progress`` in [0, 1) is the fraction of the budget collected before it."""
    episodes, steps = [], 0
    while steps < num_steps:
        episode = _run_episode(env, controller, epsilon(steps / num_steps), seed + len(episodes), rng)
        episodes.append(episode)
        steps += len(episode["rewards"])
    return episodes


def _features(discrete: bool) -> Features:
    action = Value("int64") if discrete else SequenceFeature(Value("float32"))
    return Features(
        {
            "observations": SequenceFeature(SequenceFeature(Value("float32"))),
            "actions": SequenceFeature(action),
            "rewards": SequenceFeature(Value("float32")),
            "terminals": SequenceFeature(Value("bool")),
            "truncations": SequenceFeature(Value("bool")),
        }
    )


def make_offline_dataset(
    env_id: str = "LunarLander-v3",
    tier: Tier = "medium",
    num_steps: int = 100_000,
    seed: int = 0,
    reference_episodes: int = 50,
    medium_policy: Literal["epsilon", "degraded"] = "epsilon",
) -> Dataset:
    """Generate a D4RL-style offline dataset: one row per trajectory (see the module docstring for the tiers).

    Args:
        env_id: one of `ENVIRONMENTS` (``LunarLander-v3``, ``CartPole-v1``, ``Pendulum-v1``,
            ``InvertedPendulum-v5``).
        tier: ``expert``, ``medium``, ``random``, ``medium-replay`` or ``medium-expert``.
        num_steps: transitions to collect; episodes are kept whole, so the dataset has at least this many.
        seed: the dataset is a deterministic function of ``(env_id, tier, num_steps, seed)``; must be in
            ``[0, 10**8)`` so that data episodes never share a reset seed with the reference evaluation episodes.
        reference_episodes: episodes used to measure the random and expert reference returns (0 skips them and
            the normalised scores in the metadata).
        medium_policy: what the ``medium`` agent of the ``medium``, ``medium-replay`` and ``medium-expert`` tiers
            is: ``"epsilon"``, the expert taking a random action with probability ``medium_epsilon``; or
            ``"degraded"``, the environment's systematically worse deterministic controller. With ε-noise the most
            frequent action in every state is still the expert's, so behaviour cloning with greedy action
            selection recovers the expert from any ε < 1 mixture; the degraded policy is the harder test of
            return conditioning (D4RL's medium agents are also systematically, not randomly, worse).

    Returns:
        A `datasets.Dataset`; `offline_dataset_metadata(dataset)` gives the environment, the tier, the mean return
        of the data (and of each mixed component), and the reference returns.
    """
    spec = get_offline_environment(env_id)
    if tier not in TIERS:
        raise ValueError(f"tier={tier!r} is not a dataset tier; choose one of {list(TIERS)}.")
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}.")
    if not 0 <= seed < 10**8:
        raise ValueError(f"seed must be in [0, 10**8) (evaluation episodes use the seeds above), got {seed}.")
    if medium_policy not in ("epsilon", "degraded"):
        raise ValueError(f"medium_policy={medium_policy!r} must be 'epsilon' or 'degraded'.")
    if reference_episodes < 0:
        raise ValueError(f"reference_episodes must be >= 0, got {reference_episodes}.")
    env = make_env(env_id)
    rng = random.Random(seed)
    # the medium agent: the expert with ε-noise, or the degraded controller without noise
    medium_controller, medium = (
        (spec.controller, spec.medium_epsilon) if medium_policy == "epsilon" else (spec.degraded_controller, 0.0)
    )
    expert = spec.controller
    try:
        if tier == "medium-expert":
            components = {
                "medium": _collect(env, medium_controller, lambda p: medium, (num_steps + 1) // 2, seed, rng),
                "expert": _collect(env, expert, lambda p: 0.0, num_steps // 2 or 1, seed + _EXPERT_OFFSET, rng),
            }
        elif tier == "medium-replay":
            # an agent's replay buffer: ε falls linearly from 1 to the medium level over the step budget
            schedule = lambda p: 1.0 - (1.0 - medium) * p  # noqa: E731
            components = {"medium-replay": _collect(env, medium_controller, schedule, num_steps, seed, rng)}
        elif tier == "medium":
            components = {tier: _collect(env, medium_controller, lambda p: medium, num_steps, seed, rng)}
        else:
            epsilon = {"expert": 0.0, "random": 1.0}[tier]
            components = {tier: _collect(env, expert, lambda p: epsilon, num_steps, seed, rng)}
        discrete = hasattr(env.action_space, "n")
        state_dim = int(env.observation_space.shape[0])
        act_dim = int(env.action_space.n) if discrete else int(env.action_space.shape[0])
        max_episode_steps = env.spec.max_episode_steps
    finally:
        env.close()

    episodes = [episode for component in components.values() for episode in component]
    returns = [sum(episode["rewards"]) for episode in episodes]
    metadata: dict[str, Any] = {
        "env_id": env_id,
        "tier": tier,
        "seed": seed,
        "num_steps": sum(len(episode["rewards"]) for episode in episodes),
        "num_episodes": len(episodes),
        "state_dim": state_dim,
        "act_dim": act_dim,
        "discrete": discrete,
        "max_episode_steps": max_episode_steps,
        "medium_policy": medium_policy,
        "medium_epsilon": medium,
        "mean_return": statistics.fmean(returns),
        "std_return": statistics.pstdev(returns),
        "component_mean_returns": {
            name: statistics.fmean(sum(e["rewards"]) for e in component) for name, component in components.items()
        },
    }
    if reference_episodes:
        reference = reference_returns(env_id, reference_episodes)
        metadata["reference_returns"] = reference
        metadata["normalized_score"] = normalized_score(
            metadata["mean_return"], reference["random"], reference["expert"]
        )
    features = _features(discrete)
    columns = {key: [episode[key] for episode in episodes] for key in features}
    info = DatasetInfo(
        features=features,
        description=json.dumps(metadata),
        homepage="https://gymnasium.farama.org",
        license="MIT (gymnasium environments)",
    )
    return Dataset.from_dict(columns, features=features, info=info)


def offline_dataset_metadata(dataset: Dataset) -> dict[str, Any]:
    """The metadata `make_offline_dataset` stored in ``dataset.info.description`` (environment, tier, mean
    returns, reference returns, normalised score)."""
    try:
        metadata = json.loads(dataset.info.description or "")
    except json.JSONDecodeError:
        metadata = None
    if not isinstance(metadata, dict) or "env_id" not in metadata:
        raise ValueError("This dataset carries no offline-RL metadata; it was not made by make_offline_dataset.")
    return metadata


def trajectory_statistics(dataset: Dataset) -> dict[str, Any]:
    """Per-dimension state mean and std over every transition, and the mean/std/max of episode returns (what a
    Decision Transformer config stores as ``state_mean``, ``state_std`` and uses to pick ``target_return``)."""
    import torch

    states = torch.cat([torch.tensor(obs, dtype=torch.float64) for obs in dataset["observations"]])  # (N, state_dim)
    returns = torch.tensor([sum(rewards) for rewards in dataset["rewards"]], dtype=torch.float64)
    return {
        "state_mean": states.mean(0).tolist(),
        "state_std": states.std(0, correction=0).clamp(min=1e-6).tolist(),
        "return_mean": returns.mean().item(),
        "return_std": returns.std(correction=0).item(),
        "return_max": returns.max().item(),
        "num_transitions": states.shape[0],
    }


class TrajectoryWindowSampler:
    """Random ``K``-step windows of an offline dataset, batched for a Decision Transformer.

    A window ends at a step drawn uniformly from all transitions of the dataset (so long episodes are drawn in
    proportion to their length, as in the paper's code) and holds that step and the ``K - 1`` before it, left-padded
    at the start of an episode. Returns-to-go are the undiscounted sums of the episode's remaining rewards.

    Args:
        dataset: rows with ``observations``, ``actions`` and ``rewards`` (the `make_offline_dataset` layout).
        context_length: ``K``.
        discrete: whether actions are ids; defaults to "the actions column holds integers".
    """

    def __init__(self, dataset: Dataset, context_length: int, discrete: bool | None = None):
        import torch

        if context_length < 1:
            raise ValueError(f"context_length must be >= 1, got {context_length}.")
        if len(dataset) == 0:
            raise ValueError("The dataset has no trajectories.")
        self.context_length = context_length
        torch_data = dataset.with_format("torch", columns=["observations", "actions", "rewards"])
        states, actions, returns, timesteps = [], [], [], []
        for row in torch_data:
            rewards = row["rewards"].double()
            states.append(row["observations"].float())
            actions.append(row["actions"])
            returns.append(rewards.flip(0).cumsum(0).flip(0).float())  # R_t = r_t + r_{t+1} + ...
            timesteps.append(torch.arange(rewards.shape[0]))
        self.states = torch.cat(states)  # (N, state_dim)
        self.actions = torch.cat(actions)  # (N,) ids or (N, act_dim)
        self.discrete = (not self.actions.is_floating_point()) if discrete is None else discrete
        if not self.discrete:
            self.actions = self.actions.float()
        self.returns_to_go = torch.cat(returns)  # (N,)
        self.timesteps = torch.cat(timesteps)  # (N,)

    def __len__(self) -> int:
        return self.states.shape[0]

    def sample(self, batch_size: int, generator: Any = None) -> dict[str, Any]:
        """A batch of ``batch_size`` windows: ``states`` (B, K, state_dim), ``actions`` and ``labels`` (B, K[,
        act_dim]), ``returns_to_go`` (B, K, 1), ``timesteps`` (B, K), ``attention_mask`` (B, K) (0 on padding)."""
        import torch

        ends = torch.randint(0, len(self), (batch_size,), generator=generator)  # (B,)
        offsets = torch.arange(1 - self.context_length, 1)  # (K,): -K+1 .. 0
        index = ends[:, None] + offsets  # (B, K) flat indices
        # a step belongs to the window's episode if it is not before the episode's first step
        first = ends - self.timesteps[ends]  # (B,) flat index of each window's episode start
        mask = index >= first[:, None]  # (B, K)
        index = torch.where(mask, index, ends[:, None])  # padded slots read a real step, then get blanked
        states = self.states[index] * mask[..., None]
        if self.discrete:
            actions = self.actions[index].masked_fill(~mask, -100)
        else:
            actions = self.actions[index] * mask[..., None]
        return {
            "states": states,
            "actions": actions,
            "labels": actions.clone(),
            "returns_to_go": (self.returns_to_go[index] * mask)[..., None],
            "timesteps": self.timesteps[index] * mask,
            "attention_mask": mask.long(),
        }


__all__ = [
    "ENVIRONMENTS",
    "TIERS",
    "OfflineEnvironment",
    "TrajectoryWindowSampler",
    "controller_action",
    "get_offline_environment",
    "make_env",
    "make_offline_dataset",
    "normalized_score",
    "offline_dataset_metadata",
    "reference_returns",
    "rollout_returns",
    "trajectory_statistics",
]
