"""GTrXL against Transformer-XL in reinforcement learning on a memory task, over seeds (issue 41, item 4).

Parisotto et al. 2020 (arXiv:1910.06764) claim that GTrXL learns memory tasks in RL where the canonical
Transformer-XL is unstable: a lower seed-to-seed spread and an equal or better mean. This bench tests that claim in
the paper's kind of setting, small enough for a CPU.

The environment (`CueCorridor`, generated locally; a gymnasium ``Env``) is a passive T-maze with a noisy corridor
(after Ni et al. 2023, "When do transformers shine in RL?"): step 0 shows a cue, one of ``--cues``; the next
``--corridor`` steps show a random distractor token (one of ``--distractors``, no cue information); the last step
shows a junction token, and the action taken there is the choice: reward +1 if it names the cue, else 0. Actions in
the corridor have no effect and earn 0. Every episode has the same length ``1 + corridor + 1``, a whole number of
segments (``--segment``), so a batch of episodes is a batch of aligned streams; the memory holds ``--mem_len``
states, one segment by default, so the cue lies in an earlier segment than the choice and only the XL memory
carries it across.

The agent: the Transformer-XL body (`TffTransfoXLModel`, the config fields of ``bench_gtrxl_memory.py``) over the
episode's observations, one segment at a time with its memory, and two linear heads on the last hidden state: the
policy's logits over ``--cues`` actions and the value. Training is PPO (clipped ratio, GAE, value loss, entropy
bonus) on a batch of ``--episodes`` fresh episodes per update, ``--ppo_epochs`` passes over each batch. Since the
observations do not depend on the actions, rolling the policy out step by step gives the same logits as one causal
pass over the episode, so the rollout is that pass (its first PPO epoch reuses it: the ratio is 1 there).

Three models of the same size, each trained from ``--seeds`` seeds (model init and episodes seeded; the same seeds
for every model): Transformer-XL (post-norm), TrXL-I (pre-norm) and GTrXL (``gating="gru"``). Reported: the success
rate of the stochastic policy on held-out episodes (its expected reward, the mean probability it gives the cue's
arm), at the end and during training, the greedy policy's success, and the first evaluation at which a seed reaches
``--solved``.

    python bench/bench_gtrxl_rl.py --seeds 5 --updates 300 --threads 1
    python bench/bench_gtrxl_rl.py --quick   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gtrxl_memory import MODELS, transfo_xl_config  # noqa: E402  (the same three models, the same config)
from common import RESULTS_DIR, markdown_table, setup_threads, write_results  # noqa: E402

if __name__ == "__main__":  # OpenMP reads its environment once, when torch loads
    _threads = argparse.ArgumentParser(add_help=False)
    _threads.add_argument("--threads", type=int, default=1)
    setup_threads(_threads.parse_known_args()[0].threads)

import gymnasium  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402


class CueCorridor(gymnasium.Env):
    """One episode of the noisy passive T-maze, step by step: observation ids ``0..cues-1`` are the cues,
    ``cues..cues+distractors-1`` the corridor's distractors, ``cues+distractors`` the junction. Actions
    ``0..cues-1``; the one taken at the junction is the choice."""

    def __init__(self, cues: int = 4, corridor: int = 30, distractors: int = 8):
        if cues < 2:
            raise ValueError(f"cues={cues}: a memory task needs at least 2 cues; pass cues >= 2")
        if corridor < 0 or distractors < 1:
            raise ValueError(
                f"corridor={corridor}, distractors={distractors}: pass corridor >= 0 and distractors >= 1"
            )
        self.cues, self.corridor, self.distractors = cues, corridor, distractors
        self.junction = cues + distractors
        self.observation_space = gymnasium.spaces.Discrete(cues + distractors + 1)
        self.action_space = gymnasium.spaces.Discrete(cues)
        self.length = corridor + 2

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.cue = int(self.np_random.integers(self.cues))
        self.t = 0
        return self.cue, {"cue": self.cue}

    def step(self, action):
        if not self.action_space.contains(action):
            raise ValueError(f"action={action!r}: pass an int in [0, {self.cues})")
        if self.t == self.length - 1:  # the junction: the choice ends the episode
            self.t += 1
            return self.junction, float(action == self.cue), True, False, {"cue": self.cue}
        self.t += 1
        if self.t == self.length - 1:
            observation = self.junction
        else:
            observation = self.cues + int(self.np_random.integers(self.distractors))
        return observation, 0.0, False, False, {"cue": self.cue}


def episode_batch(env: CueCorridor, episodes: int, generator: torch.Generator):
    """``episodes`` whole episodes of ``env``'s rules at once: ``(E, L)`` observation ids (the observations do not
    depend on the actions) and ``(E,)`` cues."""
    cues = torch.randint(env.cues, (episodes,), generator=generator)
    observations = env.cues + torch.randint(env.distractors, (episodes, env.length), generator=generator)
    observations[:, 0] = cues
    observations[:, -1] = env.junction
    return observations, cues


def episode_rewards(cues: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """``(E, L)`` rewards of the actions ``(E, L)``: 1 at the last step where the action names the cue, else 0."""
    rewards = torch.zeros(actions.shape, dtype=torch.float32)
    rewards[:, -1] = (actions[:, -1] == cues).float()
    return rewards


def gae(rewards: torch.Tensor, values: torch.Tensor, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimates and returns of ``(E, L)`` rewards and values of whole episodes (the last
    step is terminal: nothing is bootstrapped after it)."""
    advantages = torch.zeros_like(rewards)
    running = torch.zeros(rewards.shape[0])
    for t in reversed(range(rewards.shape[1])):
        following = values[:, t + 1] if t + 1 < rewards.shape[1] else torch.zeros(rewards.shape[0])
        delta = rewards[:, t] + gamma * following - values[:, t]
        running = delta + gamma * lam * running
        advantages[:, t] = running
    return advantages, advantages + values


class ActorCritic(nn.Module):
    """The Transformer-XL body and linear policy and value heads on its last hidden state."""

    def __init__(self, config, actions: int):
        super().__init__()
        from tf_family import TffTransfoXLModel

        self.body = TffTransfoXLModel(config)
        self.policy = nn.Linear(config.d_model, actions)
        self.value = nn.Linear(config.d_model, 1)

    def forward(self, observations: torch.Tensor, segment: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(E, L)`` observations, one segment at a time with the memory: ``(E, L, A)`` logits, ``(E, L)``
        values."""
        hidden, mems = [], None
        for start in range(0, observations.shape[1], segment):
            out = self.body(observations[:, start : start + segment], mems=mems)
            hidden.append(out.last_hidden_state)
            mems = out.mems
        hidden = torch.cat(hidden, dim=1)
        return self.policy(hidden), self.value(hidden).squeeze(-1)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--updates", type=int, default=300, help="PPO updates (one batch of episodes each)")
    parser.add_argument("--eval_every", type=int, default=25)
    parser.add_argument("--episodes", type=int, default=32, help="episodes per update")
    parser.add_argument("--ppo_epochs", type=int, default=4)
    parser.add_argument("--cues", type=int, default=4)
    parser.add_argument("--corridor", type=int, default=30, help="empty steps between the cue and the choice")
    parser.add_argument("--distractors", type=int, default=8, help="corridor observation ids (noise, no cue)")
    parser.add_argument("--segment", type=int, default=16)
    parser.add_argument("--mem_len", type=int, default=16)
    parser.add_argument("--d_model", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--gamma", type=float, default=0.99)
    parser.add_argument("--lam", type=float, default=0.95)
    parser.add_argument("--clip", type=float, default=0.2)
    parser.add_argument("--value_coef", type=float, default=0.5)
    parser.add_argument("--entropy_coef", type=float, default=0.01)
    parser.add_argument("--gate_bias", type=float, default=2.0, help="GTrXL's b_g (2 in the paper)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (1 on a shared machine)")
    parser.add_argument("--solved", type=float, default=0.9, help="success rate that counts as solved")
    parser.add_argument("--eval_episodes", type=int, default=512)
    parser.add_argument("--quick", action="store_true", help="2 seeds, 6 updates: a smoke run")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--name", default="gtrxl_rl")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.updates, args.eval_every, args.eval_episodes = 2, 6, 3, 64
        args.name = f"{args.name}_quick"
    if (args.corridor + 2) % args.segment:
        parser.error(
            f"--corridor {args.corridor}: an episode (corridor + 2 steps) must be a whole number of segments "
            f"(--segment {args.segment}); pass a corridor of k * {args.segment} - 2"
        )
    return args


def build(args, seed: int, overrides: dict) -> ActorCritic:
    torch.manual_seed(seed)
    config = transfo_xl_config(args, args.cues + args.distractors + 1, args.mem_len, overrides)
    return ActorCritic(config, args.cues)


def ppo_loss(args, logits, values, actions, old_log_probs, advantages, returns) -> torch.Tensor:
    """The clipped surrogate, the value loss and the entropy bonus over every step of the batch."""
    dist = torch.distributions.Categorical(logits=logits)
    ratio = torch.exp(dist.log_prob(actions) - old_log_probs)
    surrogate = torch.min(ratio * advantages, ratio.clamp(1 - args.clip, 1 + args.clip) * advantages)
    value_loss = (values - returns).pow(2).mean()
    return -surrogate.mean() + args.value_coef * value_loss - args.entropy_coef * dist.entropy().mean()


def evaluate(model: ActorCritic, held_out, segment: int) -> tuple[float, float]:
    """The stochastic policy's expected success (mean probability of the cue's arm at the junction) and the greedy
    policy's success on the held-out episodes."""
    observations, cues = held_out
    model.eval()
    with torch.no_grad():
        logits, _ = model(observations, segment)
    model.train()
    choice = logits[:, -1].softmax(-1)
    return float(choice.gather(1, cues[:, None]).mean()), float((choice.argmax(-1) == cues).float().mean())


def train_one(args, seed: int, overrides: dict, env: CueCorridor, held_out) -> dict:
    model = build(args, seed, overrides)
    generator = torch.Generator().manual_seed(1000 + seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    curve, greedy, train_success, times = [], [], [], []
    for update in range(1, args.updates + 1):
        start = time.perf_counter()
        observations, cues = episode_batch(env, args.episodes, generator)
        logits, values = model(observations, args.segment)  # the rollout, and the first epoch's forward
        with torch.no_grad():
            dist = torch.distributions.Categorical(logits=logits.detach())
            actions = _sample(logits, generator)
            old_log_probs = dist.log_prob(actions)
            rewards = episode_rewards(cues, actions)
            advantages, returns = gae(rewards, values.detach(), args.gamma, args.lam)
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        train_success.append(float(rewards[:, -1].mean()))
        for epoch in range(args.ppo_epochs):
            if epoch:
                logits, values = model(observations, args.segment)
            loss = ppo_loss(args, logits, values, actions, old_log_probs, advantages, returns)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            optimizer.step()
        times.append(time.perf_counter() - start)
        if update % args.eval_every == 0 or update == args.updates:
            expected, argmax = evaluate(model, held_out, args.segment)
            curve.append((update, expected))
            greedy.append((update, argmax))
    solved = next((update for update, success in curve if success >= args.solved), None)
    return {
        "seed": seed,
        "curve": curve,
        "greedy_curve": greedy,
        "train_success": train_success,
        "final": curve[-1][1],
        "final_greedy": greedy[-1][1],
        "solved_at": solved,
        "update_s": statistics.median(times),
    }


def _sample(logits: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Seeded categorical draws from ``(..., A)`` logits (``Categorical.sample`` takes no generator)."""
    probs = logits.detach().softmax(-1)
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


def summarise(args, results: dict, env: CueCorridor) -> str:
    rows = []
    for name, runs in results.items():
        finals = [run["final"] for run in runs]
        solved = [run["solved_at"] for run in runs if run["solved_at"] is not None]
        late = [statistics.mean(success for _, success in run["curve"][-4:]) for run in runs]  # per seed
        rows.append(
            [
                name,
                f"{statistics.mean(finals):.3f}",
                f"{statistics.stdev(finals):.3f}" if len(finals) > 1 else "-",
                f"{min(finals):.3f} / {max(finals):.3f}",
                f"{statistics.mean(late):.3f} ± {statistics.stdev(late) if len(late) > 1 else 0:.3f}",
                f"{statistics.mean(run['final_greedy'] for run in runs):.3f}",
                f"{len(solved)}/{len(runs)}",
                f"{statistics.median(solved):.0f}" if solved else "-",
                f"{1000 * statistics.median(run['update_s'] for run in runs):.0f} ms",
            ]
        )
    table = markdown_table(
        [
            "model",
            "final success (mean)",
            "std over seeds",
            "min / max",
            "last 4 evals (mean ± std)",
            "greedy success (mean)",
            f"seeds reaching {args.solved:.0%}",
            "median update solved",
            "update time",
        ],
        rows,
    )
    first = next(iter(results.values()))[0]["curve"]
    curves = markdown_table(
        ["model", *[f"update {update}" for update, _ in first]],
        [
            [
                name,
                *[
                    f"{statistics.mean(run['curve'][i][1] for run in runs):.2f} ± "
                    f"{statistics.pstdev(run['curve'][i][1] for run in runs):.2f}"
                    for i in range(len(runs[0]["curve"]))
                ],
            ]
            for name, runs in results.items()
        ],
    )
    segments = env.length // args.segment
    return (
        f"# GTrXL vs Transformer-XL in RL on a memory task ({args.seeds} seeds, {args.updates} PPO updates)\n\n"
        f"Noisy passive T-maze: a cue (one of {args.cues}) at step 0, {args.corridor} corridor steps of random "
        f"distractors, then the choice (+1 if it names the cue): episodes of {env.length} steps = {segments} "
        f"segments of {args.segment}, memory {args.mem_len}, so the cue is {segments - 1} segment(s) before the "
        f"choice; chance {1 / args.cues:.3f}. PPO: {args.episodes} episodes per update, {args.ppo_epochs} epochs, "
        f"clip {args.clip}, GAE gamma {args.gamma} lambda {args.lam}, value coef {args.value_coef}, entropy coef "
        f"{args.entropy_coef}, Adam lr {args.lr}, grad-norm clip 0.5. Width {args.d_model}, {args.layers} layers, "
        f"{args.heads} heads, GTrXL gate bias b_g {args.gate_bias}, the same seeds for every model.\n\n"
        f"Success = the stochastic policy's expected success on {args.eval_episodes} held-out episodes (the mean "
        f"probability of the cue's arm) at the last update; last 4 evals = each seed's mean over its last 4 evaluations "
        f"(RL curves oscillate), then the mean and std over seeds; greedy = the most probable arm's success at the last update.\n\n"
        f"{table}\n\nHeld-out success during training (mean ± population std over seeds):\n\n{curves}\n"
    )


def main(argv=None) -> None:
    args = parse_args(argv)
    setup_threads(args.threads)  # again: a no-op where the module was run as a script
    env = CueCorridor(args.cues, args.corridor, args.distractors)
    held_out = episode_batch(env, args.eval_episodes, torch.Generator().manual_seed(12345))
    results = {name: [] for name in args.models}
    partial = RESULTS_DIR / f"{args.name}.partial.json"
    for seed in range(args.seeds):  # interleaved: every model's seed s before seed s + 1
        for name in args.models:
            run = train_one(args, seed, MODELS[name], env, held_out)
            results[name].append(run)
            print(
                f"{name} seed {seed}: final success {run['final']:.3f} (greedy {run['final_greedy']:.3f}), "
                f"solved at {run['solved_at']}, {run['update_s'] * 1000:.0f} ms/update",
                flush=True,
            )
            partial.write_text(json.dumps({"args": vars(args), "results": results}) + "\n")
    markdown = summarise(args, results, env)
    payload = {"args": vars(args), "chance": 1 / args.cues, "results": results}
    json_path, md_path = write_results(args.name, payload, markdown)
    partial.unlink(missing_ok=True)
    print(markdown)
    print(f"wrote {json_path} and {md_path}")


if __name__ == "__main__":
    main()
