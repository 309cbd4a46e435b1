"""Universal Transformer with ACT vs a vanilla Transformer of as many parameters on a locally generated copy task: length
generalisation (Dehghani et al. 2019, section 3.3) and the ponder steps per token.

A causal language model reads ``x_1 .. x_n SEP`` and must write ``x_1 .. x_n`` again (the loss covers the copy only;
tokens uniform over 14 symbols). Both models are trained on lengths ``--train_lengths`` and evaluated on those and on
longer ones (``--eval_lengths``): token accuracy (teacher-forced next-token argmax over the copy) and whole-copy
accuracy. The two models:

- ``ut``: `TffUniversalTransformerForCausalLM` (by default hidden 128, 4 heads, feed-forward 208, one shared block:
  as many parameters as ``vanilla``, the paper's equal-parameter comparison; ``--ut_hidden_size 64
  --ut_intermediate_size 128`` gives the same width instead), ``act_max_steps`` 8, ACT ``basic``, its ponder steps
  ``N`` per token reported as a histogram per length; ``--freeze_halting`` with ``--act_halting_bias_init -10`` makes
  it a fixed-depth UT (every token halts by force at ``act_max_steps``);
- ``vanilla``: ``--vanilla_layers`` separate blocks of the same class (hidden 64, feed-forward 128; not shared, no
  halting), the same sqrt(d)-scaled embeddings and init, the position timing signal added once at the input, the
  same tied LM head.

Positions: the sinusoid timing signal of both models is read at ``offset + t`` with a random ``offset`` per training
sequence in ``[0, --position_offset]`` (randomised positions, Ruoss et al. 2023), so a longer evaluation sequence
(read at offset 0) uses positions seen in training and the test is of the mechanism, not of unseen sinusoid phases.

    python bench/bench_universal_transformer_act.py --threads 1
"""

from __future__ import annotations

import argparse
import collections
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import markdown_table, setup_threads, write_results  # noqa: E402

SEP = 1
VOCAB = 16  # 0 padding (unused), 1 separator, 2..15 the symbols
DROPOUT_OFF = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


def make_batch(batch: int, length: int, generator, position_offset: int = 0):
    """``(input_ids, labels, position_ids)``, each ``(B, 2n + 1)``; labels -100 outside the copy."""
    import torch

    tokens = torch.randint(2, VOCAB, (batch, length), generator=generator)
    input_ids = torch.cat([tokens, torch.full((batch, 1), SEP), tokens], dim=1)
    labels = input_ids.clone()
    labels[:, : length + 1] = -100
    offsets = torch.randint(0, position_offset + 1, (batch, 1), generator=generator)
    return input_ids, labels, offsets + torch.arange(input_ids.shape[1])


def build_models(args):
    """``{"ut": ..., "vanilla": ...}``, both fresh from the same seed."""
    import torch
    from torch import nn

    from tf_family import create_model
    from tf_family.modeling.heads import LMPredictionHead
    from tf_family.models.universal_transformer.modeling_universal_transformer import (
        TffUniversalTransformerBlock,
        build_allowed_mask,
        timing_signal,
    )

    common = {"vocab_size": VOCAB, "num_attention_heads": 4}
    torch.manual_seed(args.seed)
    ut = create_model(
        "universal_transformer",
        "causal_lm",
        "tiny",
        **common,
        hidden_size=args.ut_hidden_size,
        intermediate_size=args.ut_intermediate_size,
        act_max_steps=args.act_max_steps,
        act_loss_weight=args.act_loss_weight,
        act_halting_bias_init=args.act_halting_bias_init,
        act_force_halt_at_max_steps=args.act_force_halt,
        act_type=args.act_type,
    )

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

    if args.freeze_halting:  # with a low act_halting_bias_init: a fixed-depth UT (halts by force at act_max_steps)
        ut.transformer.halting.requires_grad_(False)
    torch.manual_seed(args.seed)
    vanilla_config = ut.config.__class__(
        **common, hidden_size=args.hidden_size, intermediate_size=args.intermediate_size, **DROPOUT_OFF
    )
    vanilla = VanillaTransformerLM(vanilla_config, args.vanilla_layers)
    return {"ut": ut, "vanilla": vanilla}


def run_model(name, model, input_ids, labels, position_ids):
    """``(loss, logits, ponder_steps or None)``."""
    from torch import nn

    if name == "ut":
        outputs = model(input_ids, labels=labels, position_ids=position_ids, use_cache=False)
        return outputs.loss, outputs.logits, outputs.ponder_steps
    logits = model(input_ids, position_ids)
    loss = nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1))
    return loss, logits, None


def train_and_evaluate(name, model, args) -> dict:
    import torch

    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    generator = torch.Generator().manual_seed(args.seed)
    model.train()
    started = time.perf_counter()
    for step in range(args.steps):
        if name == "ut" and args.act_loss_ramp_steps:  # tau from 0 to act_loss_weight, linearly
            model.config.act_loss_weight = args.act_loss_weight * min(1.0, step / args.act_loss_ramp_steps)
        length = args.train_lengths[step % len(args.train_lengths)]
        loss, _, _ = run_model(name, model, *make_batch(args.batch, length, generator, args.position_offset))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    result = {
        "parameters": sum(p.numel() for p in model.parameters()),
        "train_seconds": time.perf_counter() - started,
        "eval": {},
    }
    model.eval()
    for length in args.eval_lengths:
        input_ids, labels, position_ids = make_batch(512, length, torch.Generator().manual_seed(1000 + length))
        with torch.no_grad():
            _, logits, ponder_steps = run_model(name, model, input_ids, labels, position_ids)
        predicted, target = logits[:, :-1].argmax(-1), labels[:, 1:]
        scored = target != -100
        row = {
            "token_accuracy": float((predicted[scored] == target[scored]).float().mean()),
            "sequence_accuracy": float(((predicted == target) | ~scored).all(dim=1).float().mean()),
        }
        if ponder_steps is not None:
            row["ponder_histogram"] = dict(sorted(collections.Counter(ponder_steps.flatten().int().tolist()).items()))
            row["mean_ponder"] = float(ponder_steps.float().mean())
        result["eval"][length] = row
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--train_lengths", type=int, nargs="+", default=[2, 3, 4, 5, 6, 7, 8])
    parser.add_argument("--eval_lengths", type=int, nargs="+", default=[8, 12, 16, 24])
    parser.add_argument("--position_offset", type=int, default=40)
    parser.add_argument("--hidden_size", type=int, default=64, help="width of the vanilla model")
    parser.add_argument("--intermediate_size", type=int, default=128, help="feed-forward width of the vanilla model")
    parser.add_argument(
        "--ut_hidden_size", type=int, default=128, help="128 (with 208): as many parameters as vanilla"
    )
    parser.add_argument("--ut_intermediate_size", type=int, default=208)
    parser.add_argument("--act_max_steps", type=int, default=8)
    parser.add_argument("--act_force_halt", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--act_type", default="basic", choices=["basic", "accumulated"])
    parser.add_argument(
        "--freeze_halting",
        action="store_true",
        help="do not train the halting unit (with --act_halting_bias_init -10: every token takes act_max_steps steps)",
    )
    parser.add_argument("--act_loss_ramp_steps", type=int, default=0, help="ramp tau from 0 over these steps")
    parser.add_argument("--act_loss_weight", type=float, default=0.001)
    parser.add_argument("--act_halting_bias_init", type=float, default=1.0)
    parser.add_argument("--vanilla_layers", type=int, default=4)
    parser.add_argument("--models", nargs="+", default=["ut", "vanilla"], choices=["ut", "vanilla"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--name", default="universal_transformer_act")
    args = parser.parse_args(argv)
    if max(args.eval_lengths) * 2 + 1 > args.position_offset + max(args.train_lengths) * 2 + 1:
        raise ValueError(
            f"--position_offset {args.position_offset}: the longest evaluation sequence ({max(args.eval_lengths)}) "
            "would read positions never seen in training; raise --position_offset to at least "
            f"{2 * (max(args.eval_lengths) - max(args.train_lengths))}."
        )
    setup_threads(args.threads)

    models = build_models(args)
    payload = {"args": vars(args), "models": {}}
    for name in args.models:
        payload["models"][name] = train_and_evaluate(name, models[name], args)
        print(name, payload["models"][name], flush=True)

    rows = []
    for length in args.eval_lengths:
        seen = "seen" if length <= max(args.train_lengths) else "longer"
        row = [f"{length} ({seen})"]
        for name in args.models:
            result = payload["models"][name]["eval"][length]
            row.append(f"{result['token_accuracy']:.3f} / {result['sequence_accuracy']:.3f}")
        if "ut" in args.models:
            result = payload["models"]["ut"]["eval"][length]
            row.append(f"{result['mean_ponder']:.2f}")
            row.append(" ".join(f"{k}:{v}" for k, v in result["ponder_histogram"].items()))
        rows.append(row)
    headers = ["copy length n"] + [f"{name} token / sequence accuracy" for name in args.models]
    if "ut" in args.models:
        headers += ["UT mean N", "UT N histogram (tokens)"]
    described = ", ".join(
        f"{name} {payload['models'][name]['parameters']} parameters, trained in "
        f"{payload['models'][name]['train_seconds']:.0f} s"
        for name in args.models
    )
    markdown = (
        "# Universal Transformer + ACT vs vanilla Transformer: copy, length generalisation\n\n"
        f"{args.steps} Adam steps each (lr {args.lr}, batch {args.batch}) at copy lengths {args.train_lengths}, "
        f"positions offset at random by 0..{args.position_offset}; UT hidden {args.ut_hidden_size}, feed-forward "
        f"{args.ut_intermediate_size}, one shared block, act_max_steps {args.act_max_steps}, act_type "
        f"{args.act_type}, act_force_halt_at_max_steps {args.act_force_halt}, act_loss_weight {args.act_loss_weight}"
        f"{f' (ramped from 0 over {args.act_loss_ramp_steps} steps)' if args.act_loss_ramp_steps else ''}, "
        f"act_halting_bias_init {args.act_halting_bias_init}{', halting unit frozen' if args.freeze_halting else ''}; "
        f"vanilla {args.vanilla_layers} layers, hidden {args.hidden_size}, feed-forward {args.intermediate_size}; 4 "
        f"heads ({described}). Evaluated on 512 sequences per length (positions from 0).\n\n"
        f"{markdown_table(headers, rows)}\n"
    )
    write_results(args.name, payload, markdown)
    print(markdown)


if __name__ == "__main__":
    main()
