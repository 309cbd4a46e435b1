"""Offline RL datasets generated from real gymnasium environments (tiny sizes; skipped without gymnasium)."""

import pytest

gymnasium = pytest.importorskip("gymnasium")

from tf_family.data.offline_rl import (  # noqa: E402
    TIERS,
    make_offline_dataset,
    normalized_score,
    offline_dataset_metadata,
    reference_returns,
    rollout_returns,
    trajectory_statistics,
)


def _box2d_available() -> bool:
    try:
        import Box2D  # noqa: F401
    except ImportError:
        return False
    return True


def test_layout_and_determinism_discrete():
    first = make_offline_dataset("CartPole-v1", "medium", num_steps=300, seed=3, reference_episodes=2)
    again = make_offline_dataset("CartPole-v1", "medium", num_steps=300, seed=3, reference_episodes=2)
    other = make_offline_dataset("CartPole-v1", "medium", num_steps=300, seed=4, reference_episodes=2)
    assert first.column_names == ["observations", "actions", "rewards", "terminals", "truncations"]
    assert first.to_dict() == again.to_dict()
    assert first.to_dict() != other.to_dict()
    lengths = [len(r) for r in first["rewards"]]
    assert sum(lengths) >= 300 and sum(lengths) - lengths[-1] < 300, "whole episodes, stopping once the budget is met"
    for row in first:
        length = len(row["rewards"])
        assert len(row["observations"]) == len(row["actions"]) == len(row["terminals"]) == length
        assert all(len(obs) == 4 for obs in row["observations"])
        assert all(action in (0, 1) for action in row["actions"])
        # exactly one episode end, on the last step; CartPole ends by falling (terminal) or at 500 steps (truncation)
        ends = [t or u for t, u in zip(row["terminals"], row["truncations"], strict=True)]
        assert ends[-1] and not any(ends[:-1])
        assert row["truncations"][-1] == (length == 500) and row["terminals"][-1] != row["truncations"][-1]
    metadata = offline_dataset_metadata(first)
    assert metadata["env_id"] == "CartPole-v1" and metadata["discrete"] and metadata["act_dim"] == 2
    assert metadata["num_steps"] == sum(lengths) and metadata["num_episodes"] == len(first)
    returns = [sum(r) for r in first["rewards"]]
    assert metadata["mean_return"] == pytest.approx(sum(returns) / len(returns))


def test_tiers_are_ordered_and_normalised():
    reference = reference_returns("CartPole-v1", 3)
    assert reference["expert"] == 500.0 and reference["random"] < 50
    means = {}
    for tier in TIERS:
        dataset = make_offline_dataset("CartPole-v1", tier, num_steps=1500, seed=0, reference_episodes=3)
        metadata = offline_dataset_metadata(dataset)
        means[tier] = metadata["mean_return"]
        assert metadata["normalized_score"] == pytest.approx(
            normalized_score(metadata["mean_return"], reference["random"], reference["expert"])
        )
    assert means["expert"] > means["medium-expert"] > means["medium"] > means["random"]
    assert means["medium"] > means["medium-replay"] > means["random"]
    mixed = offline_dataset_metadata(make_offline_dataset("CartPole-v1", "medium-expert", 1500, reference_episodes=0))
    assert set(mixed["component_mean_returns"]) == {"medium", "expert"} and "normalized_score" not in mixed
    assert mixed["component_mean_returns"]["expert"] == 500.0


def test_degraded_medium_policy_is_systematic():
    dataset = make_offline_dataset(
        "CartPole-v1", "medium", num_steps=600, seed=0, reference_episodes=0, medium_policy="degraded"
    )
    metadata = offline_dataset_metadata(dataset)
    assert metadata["medium_policy"] == "degraded" and metadata["medium_epsilon"] == 0.0
    for row in dataset:  # the degraded CartPole controller looks at the angular velocity only, without noise
        assert row["actions"] == [int(obs[3] > 0) for obs in row["observations"]]
    assert 50 < metadata["mean_return"] < 500
    mixed = make_offline_dataset("CartPole-v1", "medium-expert", 1000, reference_episodes=0, medium_policy="degraded")
    returns = offline_dataset_metadata(mixed)["component_mean_returns"]
    assert returns["expert"] == 500.0 and returns["medium"] < 500.0
    with pytest.raises(ValueError, match="medium_policy='noisy'"):
        make_offline_dataset("CartPole-v1", "medium", medium_policy="noisy")


def test_continuous_pendulum_and_statistics():
    dataset = make_offline_dataset("Pendulum-v1", "expert", num_steps=400, seed=1, reference_episodes=0)
    assert len(dataset) == 2  # 200-step episodes ending by the time limit
    row = dataset[0]
    assert all(len(action) == 1 and -2.0 <= action[0] <= 2.0 for action in row["actions"])
    assert row["truncations"][-1] and not any(row["terminals"])
    stats = trajectory_statistics(dataset)
    assert len(stats["state_mean"]) == 3 and min(stats["state_std"]) > 0 and stats["num_transitions"] == 400
    # the scripted expert swings the pendulum up: far better than random torques
    assert min(rollout_returns("Pendulum-v1", 0.0, 2, seed=5)) > max(rollout_returns("Pendulum-v1", 1.0, 2, seed=5))


@pytest.mark.skipif(not _box2d_available(), reason="needs gymnasium[box2d]")
def test_lunar_lander_heuristic_expert_lands():
    dataset = make_offline_dataset("LunarLander-v3", "expert", num_steps=200, seed=0, reference_episodes=0)
    metadata = offline_dataset_metadata(dataset)
    assert metadata["state_dim"] == 8 and metadata["act_dim"] == 4 and metadata["max_episode_steps"] == 1000
    assert metadata["mean_return"] > 100  # the heuristic lander lands (about 260 on average)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="env_id='Nope-v0'"):
        make_offline_dataset("Nope-v0")
    with pytest.raises(ValueError, match="tier='great'"):
        make_offline_dataset("CartPole-v1", "great")
    with pytest.raises(ValueError, match="seed"):
        make_offline_dataset("CartPole-v1", "expert", seed=-1)
    with pytest.raises(ValueError, match="no offline-RL metadata"):
        from datasets import Dataset

        offline_dataset_metadata(Dataset.from_dict({"a": [1]}))


def test_window_sampler_windows_are_real_left_padded_episode_slices():
    import torch

    from tf_family.data.offline_rl import TrajectoryWindowSampler

    dataset = make_offline_dataset("CartPole-v1", "random", num_steps=200, seed=2, reference_episodes=0)
    sampler = TrajectoryWindowSampler(dataset, context_length=6)
    assert sampler.discrete and len(sampler) == sum(len(r) for r in dataset["rewards"])
    batch = sampler.sample(64, torch.Generator().manual_seed(0))
    again = sampler.sample(64, torch.Generator().manual_seed(0))
    assert all(torch.equal(batch[k], again[k]) for k in batch)
    assert batch["states"].shape == (64, 6, 4) and batch["returns_to_go"].shape == (64, 6, 1)
    mask = batch["attention_mask"].bool()
    assert mask[:, -1].all(), "every window ends on a real step"
    assert torch.equal(mask.long().cummax(1).values, mask.long()), "padding only on the left"
    assert (~mask).any(), "some windows start at an episode's beginning"
    for row in range(64):
        real = mask[row]
        steps = batch["timesteps"][row, real]
        assert torch.equal(steps, torch.arange(steps[0], steps[0] + len(steps))), "consecutive steps"
        assert (batch["actions"][row, ~real] == -100).all() and (batch["states"][row, ~real] == 0).all()
        # returns-to-go fall by the reward (1 per step in CartPole) and end at 1 on an episode's last step
        rtg = batch["returns_to_go"][row, real, 0]
        assert torch.allclose(rtg[:-1] - rtg[1:], torch.ones(len(rtg) - 1)) and rtg[-1] >= 1
    assert batch["states"].dtype == torch.float32 and batch["actions"].dtype == torch.int64
    continuous = TrajectoryWindowSampler(
        make_offline_dataset("Pendulum-v1", "random", num_steps=200, seed=0, reference_episodes=0), context_length=4
    )
    assert not continuous.discrete and continuous.sample(2)["actions"].shape == (2, 4, 1)
    assert len(dataset[0]["rewards"]) == int(sampler.returns_to_go[0])  # the first step's return-to-go
