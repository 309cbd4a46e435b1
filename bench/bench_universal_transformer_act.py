"""Universal Transformer with ACT vs a vanilla Transformer of as many parameters on locally generated algorithmic
tasks: length generalisation (Dehghani et al. 2019, section 3.3: copy, reverse, addition, trained on short
sequences and tested on longer ones) and the distribution of ponder steps per token.

A causal language model reads a prompt and must write the answer after a separator; the loss covers the answer only:

- ``copy``: ``x_1 .. x_n SEP x_1 .. x_n`` (tokens uniform over 14 symbols);
- ``reverse``: ``x_1 .. x_n SEP x_n .. x_1``;
- ``addition``: ``a_1 .. a_n + b_1 .. b_n SEP s_1 .. s_{n+1}``, decimal digits least significant first (so that
  every digit of the sum follows the digits it depends on), ``n`` digits per operand, ``s = a + b``.

Every model is trained on the lengths ``--train_lengths`` (one length per batch, in turn) and evaluated on those and
on longer ones (``--eval_lengths``): token accuracy (teacher-forced next-token argmax over the answer) and whole-answer
accuracy, on the same 512 sequences per length for every model and seed. Each ``--seeds`` entry builds every model
afresh from that seed and trains it on the same batches. The models, all with as many parameters (the paper's
equal-parameter comparison; the counts are in the results):

- ``ut``: `TffUniversalTransformerForCausalLM` (hidden 128, 4 heads, feed-forward 208, one shared block),
  ``act_max_steps`` 8, ACT ``basic``; its ponder steps ``N`` per token are reported per length: a histogram over all
  tokens and the mean over the prompt's and over the answer's positions (the positions whose output is scored);
- ``ut_fixed``: the same model with its halting unit frozen at bias -10 and ``act_max_steps`` ``--vanilla_layers``:
  every token halts by force at the last step, a fixed-depth UT as deep as ``vanilla`` (it separates what weight
  sharing and the per-step timing signals do from what the halting does);
- ``vanilla``: ``--vanilla_layers`` separate blocks of the same class (hidden 64, feed-forward 128; not shared, no
  halting), the same sqrt(d)-scaled embeddings and init, the position timing signal added once at the input (the
  UTs add it at every step, as tensor2tensor does), the same tied LM head.

Positions: the sinusoid timing signal of every model is read at ``offset + t`` with a random ``offset`` per training
sequence in ``[0, --position_offset]`` (randomised positions, Ruoss et al. 2023; the UT paper trains with randomised
offsets as well), so a longer evaluation sequence (read at offset 0) uses positions seen in training and the test is
of the mechanism, not of unseen sinusoid phases; the script refuses an offset range too small for that.

    python bench/bench_universal_transformer_act.py --threads 1 --task copy --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import collections
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import loadavg, markdown_table, setup_threads, write_results  # noqa: E402

SEP = 1
VOCAB = 16  # 0 padding (unused), 1 separator, 2..15 the symbols (copy, reverse); addition: 2..11 digits, 12 "+"
DIGIT, PLUS = 2, 12
DROPOUT_OFF = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
MODELS = ("ut", "ut_fixed", "vanilla")


def sequence_length(task: str, length: int) -> int:
    """Tokens in one sequence of ``task`` at length ``n`` (prompt, separator and answer)."""
    return 3 * length + 3 if task == "addition" else 2 * length + 1


def make_batch(task: str, batch: int, length: int, generator, position_offset: int = 0):
    """``(input_ids, labels, position_ids, prompt_length)``; the tensors ``(B, sequence_length(task, n))``, labels
    -100 outside the answer; ``prompt_length`` counts the prompt and the separator."""
    import torch

    if task == "addition":
        digits = torch.randint(0, 10, (batch, 2, length), generator=generator)  # least significant first
        place = 10 ** torch.arange(length + 1)
        total = (digits * place[:length]).sum(-1).sum(-1, keepdim=True)  # (B, 1)
        answer = (total // place) % 10  # (B, n + 1)
        plus = torch.full((batch, 1), PLUS)
        prompt = torch.cat([digits[:, 0] + DIGIT, plus, digits[:, 1] + DIGIT], dim=1)
        answer = answer + DIGIT
    else:
        prompt = torch.randint(2, VOCAB, (batch, length), generator=generator)
        answer = prompt if task == "copy" else prompt.flip(1)
    input_ids = torch.cat([prompt, torch.full((batch, 1), SEP), answer], dim=1)
    labels = input_ids.clone()
    prompt_length = prompt.shape[1] + 1
    labels[:, :prompt_length] = -100
    offsets = torch.randint(0, position_offset + 1, (batch, 1), generator=generator)
    return input_ids, labels, offsets + torch.arange(input_ids.shape[1]), prompt_length


def build_model(name: str, args):
    """A fresh ``ut``, ``ut_fixed`` or ``vanilla`` model from seed ``args.seed``."""
    import torch
    from torch import nn

    from tf_family import create_model
    from tf_family.modeling.heads import LMPredictionHead
    from tf_family.models.universal_transformer.configuration_universal_transformer import (
        TffUniversalTransformerConfig,
    )
    from tf_family.models.universal_transformer.modeling_universal_transformer import (
        TffUniversalTransformerBlock,
        build_allowed_mask,
        timing_signal,
    )

    common = {"vocab_size": VOCAB, "num_attention_heads": 4}
    torch.manual_seed(args.seed)
    if name in ("ut", "ut_fixed"):
        fixed = name == "ut_fixed"
        ut = create_model(
            "universal_transformer",
            "causal_lm",
            "tiny",
            **common,
            hidden_size=args.ut_hidden_size,
            intermediate_size=args.ut_intermediate_size,
            act_max_steps=args.vanilla_layers if fixed else args.act_max_steps,
            act_loss_weight=args.act_loss_weight,
            act_halting_bias_init=-10.0 if fixed else args.act_halting_bias_init,
            act_force_halt_at_max_steps=True if fixed else args.act_force_halt,
            act_type=args.act_type,
            layer_norm_position=args.ut_layer_norm_position,
            step_timing_signal=args.ut_step_timing_signal,
        )
        if fixed:  # every token halts by force at the last step
            ut.transformer.halting.requires_grad_(False)
        return ut

    class VanillaTransformerLM(nn.Module):
        """Fixed depth, one block per layer (the UT's block class), the position signal added once."""

        def __init__(self, config, layers: int):
            super().__init__()
            self.hidden_size = config.hidden_size
            self.embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
            nn.init.normal_(self.embeddings.weight, std=config.hidden_size**-0.5)  # the UT's (tensor2tensor's)
            self.blocks = nn.ModuleList(TffUniversalTransformerBlock(config) for _ in range(layers))
            self.final_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
            self.lm_head = LMPredictionHead(config.hidden_size, config.vocab_size, "gelu", config.layer_norm_eps)
            self.lm_head.decoder.weight = self.embeddings.weight
            for module in self.modules():  # the UT's init: normal(initializer_range) weights, zero biases
                if isinstance(module, nn.Linear):
                    if module is not self.lm_head.decoder:  # (tied: it is the embeddings)
                        nn.init.normal_(module.weight, std=config.initializer_range)
                    nn.init.zeros_(module.bias)

        def forward(self, input_ids, position_ids):
            hidden = self.embeddings(input_ids) * math.sqrt(self.hidden_size)
            hidden = hidden + timing_signal(position_ids, self.hidden_size)
            allowed = build_allowed_mask(torch.ones_like(input_ids, dtype=torch.bool), input_ids.shape[1], True)
            for block in self.blocks:
                hidden, _ = block(hidden, allowed)
            return self.lm_head(self.final_layer_norm(hidden))

    config = TffUniversalTransformerConfig(
        **common, hidden_size=args.hidden_size, intermediate_size=args.intermediate_size, **DROPOUT_OFF
    )
    return VanillaTransformerLM(config, args.vanilla_layers)


def run_model(name, model, input_ids, labels, position_ids):
    """``(loss, logits, ponder_steps or None)``."""
    from torch import nn

    if name != "vanilla":
        outputs = model(input_ids, labels=labels, position_ids=position_ids, use_cache=False)
        return outputs.loss, outputs.logits, outputs.ponder_steps
    logits = model(input_ids, position_ids)
    loss = nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1))
    return loss, logits, None


def lr_factor(step: int, steps: int, warmup_steps: int, schedule: str) -> float:
    """The learning rate at ``step`` (0-based) over ``--lr``: a linear warm-up from ``1 / warmup_steps`` to 1 over
    the first ``warmup_steps`` steps, then ``constant`` (1), or a ``cosine`` or ``linear`` decay to 0 at ``steps``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = (step - warmup_steps) / max(1, steps - warmup_steps)
    return 0.5 * (1 + math.cos(math.pi * progress)) if schedule == "cosine" else 1 - progress


def train_and_evaluate(name, model, args) -> dict:
    """Train ``model`` for ``args.steps`` Adam steps, then evaluate it at every ``args.eval_lengths``."""
    import torch

    parameters = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(parameters, lr=args.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, args.steps, args.warmup_steps, args.lr_schedule)
    )
    generator = torch.Generator().manual_seed(args.seed)
    model.train()
    started = time.perf_counter()
    trace = []  # (step, loss, mean ponder steps) every args.log_every steps
    for step in range(args.steps):
        length = args.train_lengths[step % len(args.train_lengths)]
        input_ids, labels, position_ids, _ = make_batch(args.task, args.batch, length, generator, args.position_offset)
        if args.positions == "none":
            position_ids = torch.zeros_like(position_ids)
        loss, _, ponder = run_model(name, model, input_ids, labels, position_ids)
        optimizer.zero_grad()
        loss.backward()
        if args.grad_clip:
            torch.nn.utils.clip_grad_norm_(parameters, args.grad_clip)
        optimizer.step()
        scheduler.step()
        if args.log_every and step % args.log_every == 0:
            mean_ponder = None if ponder is None else float(ponder.float().mean())
            trace.append([step, float(loss.detach()), mean_ponder])
            print(f"seed {args.seed} {name} step {step} loss {trace[-1][1]:.3f} ponder {mean_ponder}", flush=True)
    result = {
        "parameters": sum(p.numel() for p in model.parameters()),
        "train_seconds": time.perf_counter() - started,
        "trace": trace,
        "eval": {},
    }
    model.eval()
    for length in args.eval_lengths:
        input_ids, labels, position_ids, prompt_length = make_batch(
            args.task, 512, length, torch.Generator().manual_seed(1000 + length)
        )
        if args.positions == "none":
            position_ids = torch.zeros_like(position_ids)
        with torch.no_grad():
            _, logits, ponder_steps = run_model(name, model, input_ids, labels, position_ids)
        predicted, target = logits[:, :-1].argmax(-1), labels[:, 1:]
        scored = target != -100
        row = {
            "token_accuracy": float((predicted[scored] == target[scored]).float().mean()),
            "sequence_accuracy": float(((predicted == target) | ~scored).all(dim=1).float().mean()),
        }
        if ponder_steps is not None and name == "ut":
            steps = ponder_steps.int()
            row["ponder_histogram"] = dict(sorted(collections.Counter(steps.flatten().tolist()).items()))
            row["mean_ponder"] = float(steps.float().mean())
            row["mean_ponder_prompt"] = float(steps[:, : prompt_length - 1].float().mean())
            row["mean_ponder_answer"] = float(steps[:, prompt_length - 1 : -1].float().mean())  # scored outputs
        result["eval"][length] = row
    return result


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="copy", choices=["copy", "reverse", "addition"])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--train_lengths", type=int, nargs="+", default=[2, 3, 4, 5, 6, 7, 8])
    parser.add_argument("--eval_lengths", type=int, nargs="+", default=[8, 12, 16, 24])
    parser.add_argument("--position_offset", type=int, default=40)
    parser.add_argument(
        "--positions",
        default="offset",
        choices=["offset", "none"],
        help="offset: the position timing signal at offset + t (randomised offsets); none: every position id is 0, "
        "for every model, in training and evaluation (the timing signal is one constant vector; order comes from "
        "the causal mask only)",
    )
    parser.add_argument("--hidden_size", type=int, default=64, help="width of the vanilla model")
    parser.add_argument("--intermediate_size", type=int, default=128, help="feed-forward width of the vanilla model")
    parser.add_argument(
        "--ut_hidden_size", type=int, default=128, help="128 (with 208): as many parameters as vanilla"
    )
    parser.add_argument("--ut_intermediate_size", type=int, default=208)
    parser.add_argument(
        "--ut_layer_norm_position",
        default="pre",
        choices=["pre", "post"],
        help="the UTs' layer_norm_position: pre (tensor2tensor's code) or post (the paper's equations)",
    )
    parser.add_argument(
        "--ut_step_timing_signal",
        default="sinusoid",
        choices=["sinusoid", "learned"],
        help="the UTs' step_timing_signal: sinusoid, or learned (tensor2tensor's default)",
    )
    parser.add_argument("--act_max_steps", type=int, default=8)
    parser.add_argument("--act_force_halt", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--act_type", default="basic", choices=["basic", "accumulated"])
    parser.add_argument("--act_loss_weight", type=float, default=0.001)
    parser.add_argument("--act_halting_bias_init", type=float, default=1.0)
    parser.add_argument("--vanilla_layers", type=int, default=4, help="also the depth of ut_fixed")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--warmup_steps", type=int, default=0, help="linear learning-rate warm-up (0: none)")
    parser.add_argument(
        "--lr_schedule",
        default="constant",
        choices=["constant", "cosine", "linear"],
        help="after the warm-up: constant, or a cosine or linear decay to 0 at the last step",
    )
    parser.add_argument("--grad_clip", type=float, default=0.0, help="clip the gradient norm to this (0: never)")
    parser.add_argument("--log_every", type=int, default=100, help="record loss and mean ponder steps (0: never)")
    parser.add_argument("--name", default=None, help="results file name (default universal_transformer_act_<task>)")
    return parser


def summarise(payload: dict, args) -> str:
    """The Markdown report: accuracy mean and per seed, ponder steps of the UT, per evaluation length."""
    runs = payload["runs"]  # {seed: {model: result}}, the seeds finished so far
    seeds = list(runs)

    def values(model, length, key):
        return [runs[seed][model]["eval"][length][key] for seed in seeds]

    rows = []
    for length in args.eval_lengths:
        seen = "seen" if length <= max(args.train_lengths) else "longer"
        row = [f"{length} ({seen})"]
        for model in args.models:
            tokens, sequences = values(model, length, "token_accuracy"), values(model, length, "sequence_accuracy")
            per_seed = ", ".join(f"{value:.3f}" for value in tokens)
            row.append(f"**{statistics.mean(tokens):.3f}** ({per_seed}) / {statistics.mean(sequences):.3f}")
        rows.append(row)
    headers = ["length n"] + [f"{model}: token acc. mean (per seed) / sequence acc. mean" for model in args.models]
    tables = markdown_table(headers, rows)
    if "ut" in args.models:
        ponder_rows = []
        for length in args.eval_lengths:
            histogram = collections.Counter()
            for seed in seeds:
                histogram.update({int(k): v for k, v in runs[seed]["ut"]["eval"][length]["ponder_histogram"].items()})
            total = sum(histogram.values())
            ponder_rows.append(
                [
                    str(length),
                    ", ".join(f"{value:.2f}" for value in values("ut", length, "mean_ponder")),
                    ", ".join(f"{value:.2f}" for value in values("ut", length, "mean_ponder_prompt")),
                    ", ".join(f"{value:.2f}" for value in values("ut", length, "mean_ponder_answer")),
                    " ".join(f"{k}:{100 * v / total:.1f}%" for k, v in sorted(histogram.items())),
                ]
            )
        tables += "\n\nUT+ACT ponder steps N per token (per seed; the histogram pools the seeds' tokens):\n\n"
        tables += markdown_table(
            ["length n", "mean N", "mean N, prompt positions", "mean N, answer positions", "N histogram"], ponder_rows
        )
    described = "; ".join(
        f"{model} {runs[seeds[0]][model]['parameters']} parameters, "
        f"{statistics.mean(runs[seed][model]['train_seconds'] for seed in seeds):.0f} s per seed"
        for model in args.models
    )
    positions = (
        f"positions offset at random by 0..{args.position_offset}"
        if args.positions == "offset"
        else "no positions (every position id 0, every model)"
    )
    return (
        f"# Universal Transformer + ACT vs vanilla Transformer: {args.task}, length generalisation\n\n"
        f"Seeds {seeds} (of {args.args_seeds} asked for); {args.steps} Adam steps per model and seed (lr {args.lr}, "
        f"warm-up {args.warmup_steps} steps then {args.lr_schedule}, gradient clip {args.grad_clip or 'none'}, "
        f"batch {args.batch}) at lengths {args.train_lengths}, {positions}; ut: hidden "
        f"{args.ut_hidden_size}, feed-forward {args.ut_intermediate_size}, one shared block, layer_norm_position "
        f"{args.ut_layer_norm_position}, step_timing_signal {args.ut_step_timing_signal}, act_max_steps "
        f"{args.act_max_steps}, act_type {args.act_type}, act_force_halt_at_max_steps {args.act_force_halt}, "
        f"act_loss_weight {args.act_loss_weight}, act_halting_bias_init {args.act_halting_bias_init}; ut_fixed: the "
        f"same block, {args.vanilla_layers} steps (halting frozen); vanilla: {args.vanilla_layers} layers, hidden "
        f"{args.hidden_size}, feed-forward {args.intermediate_size}; 4 heads ({described}). Evaluated on 512 "
        f"sequences per length (positions from 0). Load average at the start {payload['loadavg_start']} (a shared "
        "machine: accuracy does not depend on it, the seconds do).\n\n"
        f"{tables}\n"
    )


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    longest_train = sequence_length(args.task, max(args.train_lengths))
    longest_eval = sequence_length(args.task, max(args.eval_lengths))
    if args.positions == "offset" and longest_eval > args.position_offset + longest_train:
        raise ValueError(
            f"--position_offset {args.position_offset}: the longest evaluation sequence ({longest_eval} tokens) "
            f"would read positions never seen in training (at most {args.position_offset} + {longest_train}); "
            f"raise --position_offset to at least {longest_eval - longest_train}."
        )
    args.name = args.name or f"universal_transformer_act_{args.task}"
    args.args_seeds = list(args.seeds)
    setup_threads(args.threads)

    payload = {"args": vars(args), "loadavg_start": loadavg(), "runs": {}}
    for seed in args.seeds:
        args.seed = seed
        payload["runs"][str(seed)] = {}
        for name in args.models:
            result = train_and_evaluate(name, build_model(name, args), args)
            payload["runs"][str(seed)][name] = result
            print(seed, name, {n: round(r["token_accuracy"], 3) for n, r in result["eval"].items()}, flush=True)
        markdown = summarise(payload, args)  # after every seed: a run cut short still leaves its finished seeds
        write_results(args.name, payload, markdown)
    print(markdown)


if __name__ == "__main__":
    main()
