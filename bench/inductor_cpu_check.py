"""``torch.compile`` with its default backend (Inductor: generated C++ on a CPU) of a whole sparse model's training
step, against eager: Longformer, BigBird and Reformer, each under ``"sdpa"`` and ``"flex_attention"``, the tiny
test configs with a padded row. Reports whether the compile succeeds, the largest output and gradient differences
from eager, and the wall time (compilation included: minutes per case on 2 cores, which is why this is not a CI
test; `tests/attention/test_compile.py` checks the traced graphs with the ``eager`` / ``aot_eager`` backends).

    python bench/inductor_cpu_check.py
    python bench/inductor_cpu_check.py --archs reformer --implementations sdpa
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO))

from common import markdown_table, setup_threads, write_results  # noqa: E402

LENGTHS = {"longformer": 40, "big_bird": 40, "reformer": 48}  # the tiny models' sparse paths
NO_DROPOUT = {"lsh_attention_probs_dropout_prob": 0.0, "local_attention_probs_dropout_prob": 0.0}


def check(name: str, implementation: str) -> dict:
    import torch
    import torch._dynamo

    from tests.common.tester import build, make_inputs, without_labels
    from tf_family.registry import ARCHITECTURES

    torch._dynamo.reset()
    spec = ARCHITECTURES[name]
    task = "causal_lm" if "causal_lm" in spec.model_classes else "base"
    model = build(spec, task, **(NO_DROPOUT if name == "reformer" else {}))
    model.set_attn_implementation(implementation)
    inputs = without_labels(make_inputs(spec, model.config, task, batch=2, length=LENGTHS[name]))
    mask = torch.ones_like(inputs["input_ids"])
    mask[1, -3:] = 0
    inputs["attention_mask"] = mask
    model.train()

    def step(run):
        model.zero_grad()
        out = next(iter(run(**inputs).values()))
        out.float().square().mean().backward()
        grads = {n: torch.zeros_like(p) if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}
        return out.detach(), grads

    start = time.perf_counter()
    try:
        want_out, want = step(model)
        got_out, got = step(torch.compile(model))
    except Exception as error:  # reported, not raised: the table says which case fails and why
        return {"ok": False, "seconds": time.perf_counter() - start, "error": f"{type(error).__name__}: {error}"[:500]}
    return {
        "ok": True,
        "seconds": time.perf_counter() - start,
        "output_diff": float((got_out - want_out).abs().max()),
        "gradient_diff": max(float((got[n] - want[n]).abs().max()) for n in want),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--archs", nargs="+", default=list(LENGTHS), choices=list(LENGTHS))
    parser.add_argument("--implementations", nargs="+", default=["sdpa", "flex_attention"])
    args = parser.parse_args(argv)
    setup_threads()
    results, rows = [], []
    for name in args.archs:
        for implementation in args.implementations:
            result = {"arch": name, "implementation": implementation, **check(name, implementation)}
            results.append(result)
            print(result, flush=True)
            diffs = f"{result['output_diff']:.1e} / {result['gradient_diff']:.1e}" if result["ok"] else "-"
            compiled = "yes" if result["ok"] else f"no: {result['error']}"
            rows.append([name, implementation, compiled, diffs, f"{result['seconds']:.0f} s"])
    table = markdown_table(
        ["model", "attn_implementation", "Inductor compiles", "max |diff| output / gradients", "wall (with compile)"],
        rows,
    )
    markdown = (
        "# torch.compile (Inductor, CPU) of a training step against eager\n\n"
        "Tiny test configs, batch 2 with a padded row; forward, `square().mean()` loss, backward.\n\n" + table + "\n"
    )
    write_results("inductor_cpu_check", {"results": results}, markdown)
    print(markdown)


if __name__ == "__main__":
    main()
