"""Reformer causal LM: how far ``model.to(torch.bfloat16)`` moves the logits from float32, per seed, for ours and for
transformers' `ReformerModelWithLMHead` on the same weights (issue 42, item 4).

Two shapes: the registry's ``tiny`` variant (local + LSH layers, LSH chunk 16) and the causal LSH + local shape of
the parity test (local, LSH, LSH, local; chunks of 4). For each seed a transformers model is initialised with
``torch.manual_seed(seed)`` and loaded into ours (`from_pretrained`) twice: with our chunking (``tff``:
``chunk_wrap_around=False``, rounds apart, bucket-causal LSH) and transformers' (``tff-compat``); ``tff, fp32
buckets``: ours with the float32 forward's LSH buckets replayed in the bf16 forward (the arithmetic alone, without
the hash decisions that bf16 rounding flips). ``init:``: the same on our model as initialised by itself with the same
seed (what the common tester checks), transformers' holding its weights. Inputs: 2 rows of 24 random tokens
(``torch.Generator().manual_seed(seed)``).

Error = max |bf16 - fp32| / max |fp32| over the logits centred per position (a log-softmax does not see the
centre); ``--metric norm`` gives the common tester's ||bf16 - fp32|| / ||fp32|| instead.

Then, over ``--flip-seeds`` seeds, how often a bf16 forward flips a bucket decision and lands over 2 %, against
float32 arithmetic on the bf16-rounded weights (no precision inside the model can do better than that).

    PYTHONPATH=$PWD python bench/reformer_bf16_error.py [--seeds 10] [--metric max|norm] [--flip-seeds 60]
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch
import transformers

import tf_family
from tf_family.models.reformer.configuration_reformer import TffReformerConfig
from tf_family.models.reformer.convert_reformer import convert_state_dict
from tf_family.models.reformer.modeling_reformer import TffReformerAttention
from tf_family.registry import ARCHITECTURES

LENGTH, BATCH = 24, 2
SHAPES = {
    "tiny": dict(ARCHITECTURES["reformer"].variants["tiny"]),
    "lsh+local": {
        "vocab_size": 61,
        "hidden_size": 32,
        "num_attention_heads": 2,
        "attention_head_size": 8,
        "feed_forward_size": 40,
        "attn_layers": ["local", "lsh", "lsh", "local"],
        "local_attn_chunk_length": 4,
        "lsh_attn_chunk_length": 4,
        "num_hashes": 2,
        "num_buckets": 4,
        "axial_pos_shape": [4, 8],
        "axial_pos_embds_dim": [12, 20],
        "axial_norm_std": 0.1,
        "hidden_dropout_prob": 0.0,
        "local_attention_probs_dropout_prob": 0.0,
    },
}


def hf_config(shape: dict) -> transformers.ReformerConfig:
    values = {**shape, "lsh_attention_probs_dropout_prob": 0.0, "is_decoder": True, "hash_seed": 0}
    values.setdefault("max_position_embeddings", 64)
    values["max_position_embeddings"] = max(values["max_position_embeddings"], 64)
    return transformers.ReformerConfig(**values)


def centred(logits: torch.Tensor) -> torch.Tensor:
    logits = logits.double()
    return logits - logits.mean(-1, keepdim=True)


class ReplayedBuckets:
    """Within ``with``: our LSH layers record their buckets (``record=True``), else hash again, count the decisions
    that differ from the recorded ones and (``replay=True``) use the recorded ones."""

    def __init__(self):
        self.buckets, self.record, self.replay, self.flips = {}, True, True, 0

    def __enter__(self):
        self.original = TffReformerAttention.hash

        def hash_(attention, shared, num_hashes, seed):
            buckets = self.original(attention, shared, num_hashes, seed)
            if self.record:
                self.buckets[attention.layer_idx] = buckets
                return buckets
            self.flips += int((buckets != self.buckets[attention.layer_idx]).sum())
            return self.buckets[attention.layer_idx] if self.replay else buckets

        TffReformerAttention.hash = hash_
        return self

    def __exit__(self, *exc):
        TffReformerAttention.hash = self.original


def error(model, ids: torch.Tensor, metric: str, replay: bool = False) -> float:
    """bf16 against float32 (``replay``: the bf16 forward uses the float32 forward's buckets)."""
    model = model.float().eval()
    with torch.no_grad(), ReplayedBuckets() as buckets:
        buckets.record = True
        expected = centred(model(input_ids=ids).logits)
        buckets.record, buckets.replay = False, replay
        got = centred(model.to(torch.bfloat16)(input_ids=ids).logits)
    model.float()
    if metric == "norm":
        return float((got - expected).norm() / expected.norm())
    return float((got - expected).abs().max() / expected.abs().max())


def hf_from_ours(ours: tf_family.TffReformerForCausalLM, shape: dict) -> transformers.ReformerModelWithLMHead:
    """transformers' model holding our model's weights (names mapped by the repository's converter)."""
    hf = transformers.ReformerModelWithLMHead(hf_config(shape)).eval()
    ours_state = ours.state_dict()
    state = {}
    for name, tensor in hf.state_dict().items():
        (mapped,) = convert_state_dict({name: tensor})
        state[name] = torch.zeros_like(tensor) if name == "lm_head.bias" else ours_state[mapped]  # unused by 5.24
    hf.load_state_dict(state)
    return hf


def measure(shape_name: str, seed: int, metric: str) -> dict:
    """The errors of one seed: ``tff`` / ``tff-compat`` / ``transformers`` on transformers' initial weights, and
    the same three (``init:``) on ours."""
    shape = SHAPES[shape_name]
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, shape["vocab_size"], (BATCH, LENGTH), generator=generator)
    torch.manual_seed(seed)
    hf = transformers.ReformerModelWithLMHead(hf_config(shape)).eval()
    row = {"transformers": error(hf, ids, metric)}
    with tempfile.TemporaryDirectory() as folder:
        hf.save_pretrained(folder)
        for name, wrap in (("tff", False), ("tff-compat", True)):
            ours = tf_family.TffReformerForCausalLM.from_pretrained(folder, chunk_wrap_around=wrap)
            row[name] = error(ours, ids, metric)
            if not wrap:
                row["tff, fp32 buckets"] = error(ours, ids, metric, replay=True)
    torch.manual_seed(seed)
    config = TffReformerConfig(**shape, hash_seed=0)
    ours = tf_family.TffReformerForCausalLM(config)
    row["init: tff"] = error(ours, ids, metric)
    row["init: transformers"] = error(hf_from_ours(ours, shape), ids, metric)
    compat = tf_family.TffReformerForCausalLM(TffReformerConfig(**shape, hash_seed=0, chunk_wrap_around=True))
    compat.load_state_dict(ours.state_dict())
    row["init: tff-compat"] = error(compat, ids, metric)
    return row


def flip_rates(shape_name: str, seeds: int) -> str:
    """Over ``seeds`` seeds of our own init: how many bf16 forwards flip at least one bucket decision and how many
    are more than 2 % away, against float32 arithmetic on the bf16-rounded weights (``.to(bfloat16).float()``)."""
    counts = {"bf16": [0, 0], "float32 on rounded weights": [0, 0]}
    for seed in range(seeds):
        shape = SHAPES[shape_name]
        ids = torch.randint(1, shape["vocab_size"], (BATCH, LENGTH), generator=torch.Generator().manual_seed(seed))
        torch.manual_seed(seed)
        for name, dtype in (("bf16", torch.bfloat16), ("float32 on rounded weights", torch.float32)):
            model = tf_family.TffReformerForCausalLM(TffReformerConfig(**shape, hash_seed=0)).eval()
            with torch.no_grad(), ReplayedBuckets() as buckets:
                expected = centred(model(input_ids=ids).logits)
                buckets.record, buckets.replay = False, False
                got = centred(model.to(torch.bfloat16).to(dtype)(input_ids=ids).logits)
            counts[name][0] += buckets.flips > 0
            counts[name][1] += float((got - expected).abs().max() / expected.abs().max()) > 0.02
            torch.manual_seed(seed)
    return "; ".join(
        f"{name}: {f}/{seeds} seeds flip a bucket, {b}/{seeds} over 2 %" for name, (f, b) in counts.items()
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--metric", choices=("max", "norm"), default="max")
    parser.add_argument("--flip-seeds", type=int, default=60, help="seeds of the flip count (0: skip it)")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    tf_family_logger = transformers.utils.logging.get_logger("tf_family")
    tf_family_logger.setLevel("ERROR")
    columns = (
        "tff",
        "tff, fp32 buckets",
        "tff-compat",
        "transformers",
        "init: tff",
        "init: tff-compat",
        "init: transformers",
    )
    for shape_name in SHAPES:
        print(f"\n{shape_name} ({args.metric} error, %)")
        print("| seed | " + " | ".join(columns) + " |")
        print("|---" * (len(columns) + 1) + "|")
        worst = dict.fromkeys(columns, 0.0)
        for seed in range(args.seeds):
            row = measure(shape_name, seed, args.metric)
            worst = {k: max(worst[k], row[k]) for k in columns}
            print(f"| {seed} | " + " | ".join(f"{100 * row[k]:.2f}" for k in columns) + " |", flush=True)
        print("| max | " + " | ".join(f"{100 * worst[k]:.2f}" for k in columns) + " |")
        if args.flip_seeds:
            print(f"\n{shape_name}, ours (max error): {flip_rates(shape_name, args.flip_seeds)}", flush=True)


if __name__ == "__main__":
    main()
