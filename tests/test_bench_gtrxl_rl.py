"""`bench/bench_gtrxl_rl.py`'s pieces that are not timing: the environment's rules (the step-by-step gymnasium env
and the batched episodes, each checked against them), the rewards, GAE against its closed forms, the PPO loss's
clipping, and the agent's segment-by-segment pass, which sees no later observation and equals recomputing each step
from the episode's start."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        spec = importlib.util.spec_from_file_location("bench_gtrxl_rl", ROOT / "bench" / "bench_gtrxl_rl.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "bench"))
    return module


def test_the_env_shows_the_cue_only_at_step_0_and_rewards_the_matching_choice(bench):
    env = bench.CueCorridor(cues=3, corridor=5, distractors=2)
    for seed in range(6):
        observation, info = env.reset(seed=seed)
        cue = info["cue"]
        assert observation == cue and 0 <= cue < 3
        seen = []
        for _ in range(env.length - 1):  # the corridor and the arrival at the junction: no reward, no end
            observation, reward, terminated, truncated, _ = env.step(0)
            seen.append(observation)
            assert reward == 0.0 and not terminated and not truncated
        assert all(3 <= o < 5 for o in seen[:-1]) and seen[-1] == env.junction == 5  # no cue in the corridor
        choice = (cue + seed % 2) % 3  # right on even seeds, wrong on odd ones
        _, reward, terminated, _, _ = env.step(choice)
        assert terminated and reward == float(choice == cue)
    with pytest.raises(ValueError, match="action=3"):
        env.reset(seed=0)
        env.step(3)
    with pytest.raises(ValueError, match="cues=1"):
        bench.CueCorridor(cues=1)


def test_batched_episodes_follow_the_env_rules(bench):
    env = bench.CueCorridor(cues=4, corridor=14, distractors=3)
    observations, cues = bench.episode_batch(env, 200, torch.Generator().manual_seed(0))
    assert observations.shape == (200, env.length) == (200, 16)
    assert torch.equal(observations[:, 0], cues) and set(cues.tolist()) == {0, 1, 2, 3}
    corridor = observations[:, 1:-1]
    assert corridor.min() >= 4 and corridor.max() < 7 and set(corridor.unique().tolist()) == {4, 5, 6}
    assert (observations[:, -1] == env.junction).all()
    actions = torch.randint(4, (200, env.length), generator=torch.Generator().manual_seed(1))
    rewards = bench.episode_rewards(cues, actions)
    assert (rewards[:, :-1] == 0).all()
    assert torch.equal(rewards[:, -1], (actions[:, -1] == cues).float())


def test_gae_matches_its_closed_forms(bench):
    torch.manual_seed(0)
    rewards, values = torch.randn(3, 6), torch.randn(3, 6)
    gamma = 0.9
    # lambda = 0: the one-step TD error, nothing bootstrapped after the terminal step
    advantages, returns = bench.gae(rewards, values, gamma, 0.0)
    following = torch.cat([values[:, 1:], torch.zeros(3, 1)], dim=1)
    torch.testing.assert_close(advantages, rewards + gamma * following - values)
    torch.testing.assert_close(returns, advantages + values)
    # lambda = 1: the discounted return to the end of the episode minus the value
    advantages, returns = bench.gae(rewards, values, gamma, 1.0)
    discounted = torch.stack([sum(gamma**k * rewards[:, t + k] for k in range(6 - t)) for t in range(6)], dim=1)
    torch.testing.assert_close(returns, discounted)
    torch.testing.assert_close(advantages, discounted - values)


def test_ppo_loss_clips_the_ratio(bench):
    args = bench.parse_args(["--clip", "0.2", "--value_coef", "0", "--entropy_coef", "0"])
    logits = torch.tensor([[[2.0, 0.0]]], requires_grad=True)  # the action's probability is 0.881
    actions, values, returns = torch.tensor([[0]]), torch.zeros(1, 1), torch.zeros(1, 1)
    old = torch.log(torch.tensor([[0.5]]))  # ratio 1.76: beyond 1 + clip
    loss = bench.ppo_loss(args, logits, values, actions, old, torch.ones(1, 1), returns)
    torch.testing.assert_close(loss, torch.tensor(-1.2))  # the positive advantage's gain stops at 1 + clip
    loss.backward()
    assert logits.grad.abs().max() == 0  # clipped: no gradient
    loss = bench.ppo_loss(args, logits, values, actions, old, -torch.ones(1, 1), returns)
    ratio = torch.softmax(torch.tensor([2.0, 0.0]), 0)[0] / 0.5
    torch.testing.assert_close(loss, ratio)  # a negative advantage is not clipped from above: min takes the ratio


def test_segment_pass_equals_recomputing_each_step(bench):
    """The rollout is one pass per segment with the memory: the logits and values at step t depend on no later
    observation (what lets it stand for acting step by step) and equal a pass over the observations up to t from the
    start of the memory the pass gives that step (here, two segments: from the episode's start), for every model."""
    args = bench.parse_args(["--corridor", "6", "--segment", "4", "--mem_len", "4", "--d_model", "16"])
    env = bench.CueCorridor(args.cues, args.corridor, args.distractors)
    observations, _ = bench.episode_batch(env, 3, torch.Generator().manual_seed(0))
    for overrides in bench.MODELS.values():
        model = bench.build(args, 0, overrides).eval()
        with torch.no_grad():
            logits, values = model(observations, args.segment)
            assert env.length == 2 * args.segment
            for t in range(env.length):
                step_logits, step_values = model(observations[:, : t + 1], t + 1)  # one segment, no memory
                torch.testing.assert_close(step_logits[:, -1], logits[:, t], atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(step_values[:, -1], values[:, t], atol=1e-5, rtol=1e-5)


def test_the_episode_must_fill_whole_segments(bench):
    with pytest.raises(SystemExit):
        bench.parse_args(["--corridor", "20", "--segment", "16"])
