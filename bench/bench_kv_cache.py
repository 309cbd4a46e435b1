"""Decoding with `tf_family.modeling.cache.GrowingCache` against transformers' `DynamicCache`.

`DynamicCache` concatenates every layer's keys and values at every decoding step (a copy of the whole cache per
step); `GrowingCache` writes the new positions into buffers with room to spare. This times greedy decoding steps
(one new token per row, the cache filled by a prompt first) of CALM (the benchmark's ``small`` decoder: 8 layers,
width 256) and a causal Longformer (4 layers, width 256, window 256) with each cache, in interleaved rounds, for a
short and a long prompt. The tokens are the same with both (tests/test_growing_cache.py).

Run::

    cd bench && OMP_WAIT_POLICY=PASSIVE python bench_kv_cache.py
"""

from __future__ import annotations

import argparse
import statistics

from common import loadavg, markdown_table, setup_threads, time_interleaved, write_results

setup_threads(2)

import torch  # noqa: E402  (after setup_threads: OpenMP reads OMP_WAIT_POLICY when torch loads)
from transformers import DynamicCache  # noqa: E402

from tf_family.modeling.cache import GrowingCache  # noqa: E402
from tf_family.registry import get_arch  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--prompts", type=int, nargs="+", default=[64, 2000], help="prompt lengths (tokens)")
    parser.add_argument("--steps", type=int, default=32, help="decoding steps timed per call")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--name", default="kv_cache")
    return parser.parse_args()


def build_models() -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    calm = get_arch("calm")
    longformer = get_arch("longformer")
    overrides = {"hidden_size": 256, "num_attention_heads": 4, "intermediate_size": 1024, "num_hidden_layers": 4,
                 "attention_window": 256, "attention_dilation": 1, "max_position_embeddings": 4200}  # fmt: skip
    return {
        "CALM small (8 layers, width 256)": calm.model_classes["causal_lm"](
            calm.config_class(**{**dict(calm.variants["small"]), "max_position_embeddings": 4200})
        ).eval(),  # fmt: skip
        "Longformer causal (4 layers, width 256, window 256)": longformer.model_classes["causal_lm"](
            longformer.tiny_config(**overrides)
        ).eval(),
    }


def decode(model, prompt: torch.Tensor, steps: int, make_cache):
    """Time ``steps`` greedy decoding steps after the prompt's forward (which is not timed): returns a step function
    for `time_interleaved` that runs prompt + steps but records nothing itself."""

    @torch.no_grad()
    def run():
        cache = make_cache(model.config)
        out = model(prompt, cache=cache, use_cache=True)
        token = out.logits[:, -1:].argmax(-1)
        for _ in range(steps):
            out = model(token, cache=out.cache, use_cache=True)
            token = out.logits[:, -1:].argmax(-1)

    return run


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    caches = {"DynamicCache": lambda config: DynamicCache(config=config), "GrowingCache": GrowingCache}
    rows, results = [], []
    for model_name, model in build_models().items():
        for length in args.prompts:
            prompt = torch.randint(1, model.config.vocab_size, (args.batch, length))
            steps = {}
            for cache_name, make in caches.items():
                steps[f"{cache_name} prompt only"] = decode(model, prompt, 0, make)
                steps[cache_name] = decode(model, prompt, args.steps, make)
            times = time_interleaved(steps, rounds=args.rounds, warmups=1)
            medians = {name: statistics.median(values) for name, values in times.items()}
            per_step = {name: 1000 * (medians[name] - medians[f"{name} prompt only"]) / args.steps for name in caches}
            speedup = per_step["DynamicCache"] / per_step["GrowingCache"]
            results.append({"model": model_name, "prompt": length, "batch": args.batch, "times_s": times,
                            "step_ms": per_step, "speedup": speedup})  # fmt: skip
            rows.append([model_name, length, f"{per_step['DynamicCache']:.2f}", f"{per_step['GrowingCache']:.2f}",
                         f"**{speedup:.2f}x**"])  # fmt: skip
            print(rows[-1], flush=True)
    markdown = (
        f"# Decoding with GrowingCache against DynamicCache\n\nGreedy decoding at batch {args.batch}: ms per step "
        f"(one new token per row; (prompt + {args.steps} steps − prompt alone) / {args.steps}, medians of "
        f"{args.rounds} interleaved rounds; random weights and tokens, the same for both caches).\n\n"
        + markdown_table(["model", "prompt tokens", "DynamicCache ms/step", "GrowingCache ms/step", "speed-up"], rows)
        + f"\n\nloadavg at the end {loadavg()}.\n"
    )
    write_results(args.name, {"args": vars(args), "results": results}, markdown)
    print(markdown)


if __name__ == "__main__":
    main()
