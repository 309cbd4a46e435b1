"""Linear-time attention: training step time and saved activations against length for the Performer, the Linear
Transformer and RFA (causal) next to a dense causal Llama with SDPA of the same size; the generation cache's size
after prompts of growing length against Llama's DynamicCache; and the step time of our Performer and Linformer
against performer-pytorch's PerformerLM and linformer's LinformerLM on the same config.

Step times are interleaved within each length (one call of each contestant per round, the order reversed every
other round, medians); ratios come from the same run. "Saved activations" is the total size of the distinct tensors
autograd saved for the backward pass during one forward (`torch.autograd.graph.saved_tensors_hooks`), a measured
proxy for training memory that does not depend on the allocator or on other processes; it is not peak RSS.

    python bench/bench_linear_attention.py
    python bench/bench_linear_attention.py --dry-run   # tiny sizes, seconds (the CI test)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import loadavg, markdown_table, setup_threads, time_interleaved, write_results  # noqa: E402

KERNELISED = {"Performer (favor)": "favor", "Linear Transformer (elu)": "elu", "RFA": "rfa"}
DENSE = "dense Llama, SDPA"


def build_kernelised(feature_map: str, args, max_len: int):
    from tf_family.models.performer.configuration_performer import TffPerformerConfig
    from tf_family.models.performer.modeling_performer import TffPerformerForCausalLM

    config = TffPerformerConfig(
        vocab_size=args.vocab,
        hidden_size=args.width,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        intermediate_size=4 * args.width,
        hidden_dropout_prob=0.0,
        max_position_embeddings=max_len,
        feature_map=feature_map,
        causal=True,
        num_random_features=args.features,
    )
    return TffPerformerForCausalLM(config)


def build_llama(args, max_len: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.width,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        intermediate_size=4 * args.width,
        max_position_embeddings=max_len,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config)


def lm_step(model, ids):
    def step():
        model.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()

    return step


def raw_step(model, ids, loss_fn):
    def step():
        model.zero_grad(set_to_none=True)
        loss_fn(model(ids), ids).backward()

    return step


def saved_bytes(step_forward) -> int:
    """Bytes of the distinct storages autograd saves during ``step_forward()`` (the forward only, no backward)."""
    import torch

    storages: dict[int, int] = {}

    def pack(tensor):
        if tensor.device.type == "cpu" and tensor.numel():
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = step_forward()
    del out
    return sum(storages.values())


def summarise(times: dict[str, list[float]]) -> dict[str, dict]:
    return {name: {"median_s": statistics.median(t), "min_s": min(t), "times_s": t} for name, t in times.items()}


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f}"


def mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f}"


def part_scaling(args, record: dict, flush) -> None:
    import torch

    for length in args.lengths:
        if time.perf_counter() - record["_start"] > args.budget_s:
            record["not_measured"].append(f"scaling at {length} tokens: over the --budget-s")
            continue
        torch.manual_seed(0)
        ids = torch.randint(1, args.vocab, (1, length))
        models = {name: build_kernelised(fmap, args, length).train() for name, fmap in KERNELISED.items()}
        models[DENSE] = build_llama(args, length).train()
        memory = {
            name: saved_bytes(lambda model=model, ids=ids: model(input_ids=ids, labels=ids).loss)
            for name, model in models.items()
        }
        times = time_interleaved(
            {name: lm_step(model, ids) for name, model in models.items()}, rounds=args.rounds, warmups=1
        )
        cell = {"length": length, "loadavg": loadavg(), "saved_bytes": memory, "step": summarise(times)}
        dense = cell["step"][DENSE]["median_s"]
        cell["dense_over_model"] = {name: dense / cell["step"][name]["median_s"] for name in KERNELISED}
        record["scaling"].append(cell)
        del models
        flush()


def part_cache(args, record: dict, flush) -> None:
    import torch
    from transformers import DynamicCache

    max_len = max(args.prompts) + 1
    models = {name: build_kernelised(fmap, args, max_len).eval() for name, fmap in KERNELISED.items()}
    llama = build_llama(args, max_len).eval()
    for prompt in args.prompts:
        ids = torch.randint(1, args.vocab, (1, prompt), generator=torch.Generator().manual_seed(prompt))
        row = {"prompt": prompt}
        with torch.no_grad():
            for name, model in models.items():
                cache = model(input_ids=ids, use_cache=True).cache
                row[name] = sum(t.nbytes for state in cache.states for t in state)
            output = llama(input_ids=ids, use_cache=True, cache=DynamicCache(config=llama.config))
            cache = output.cache if getattr(output, "cache", None) is not None else output.past_key_values
            row[DENSE] = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)
        record["cache"].append(row)
    flush()


def part_references(args, record: dict, flush) -> None:
    import torch
    import torch.nn.functional as F

    def token_loss(logits, ids):
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))

    try:
        from linformer import LinformerLM
        from performer_pytorch import PerformerLM
    except ImportError as error:
        record["not_measured"].append(f"references: {error}")
        return
    from tf_family.models.linformer.configuration_linformer import TffLinformerConfig
    from tf_family.models.linformer.modeling_linformer import TffLinformerForMaskedLM

    for length in args.ref_lengths:
        if time.perf_counter() - record["_start"] > args.budget_s:
            record["not_measured"].append(f"references at {length} tokens: over the --budget-s")
            continue
        torch.manual_seed(0)
        ids = torch.randint(1, args.vocab, (1, length))
        dim_head = args.width // args.heads
        theirs_performer = PerformerLM(
            num_tokens=args.vocab,
            max_seq_len=length,
            dim=args.width,
            depth=args.layers,
            heads=args.heads,
            dim_head=dim_head,
            causal=True,
            ff_mult=4,
            nb_features=args.features,
            rotary_position_emb=False,
            tie_embed=True,
        ).train()
        ours_performer = build_kernelised("favor", args, length).train()
        k = min(args.linformer_k, length)
        theirs_linformer = LinformerLM(
            num_tokens=args.vocab, dim=args.width, seq_len=length, depth=args.layers, k=k, heads=args.heads
        ).train()
        ours_linformer = TffLinformerForMaskedLM(
            TffLinformerConfig(
                vocab_size=args.vocab,
                hidden_size=args.width,
                num_hidden_layers=args.layers,
                num_attention_heads=args.heads,
                intermediate_size=4 * args.width,
                hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0,
                max_position_embeddings=length,
                projected_length=k,
                projection_sharing="headwise",
            )
        ).train()
        steps = {
            "ours Performer (causal)": lm_step(ours_performer, ids),
            "performer-pytorch PerformerLM (causal)": raw_step(theirs_performer, ids, token_loss),
            "ours Linformer (masked LM head)": lm_step(ours_linformer, ids),
            "linformer LinformerLM": raw_step(theirs_linformer, ids, token_loss),
        }
        times = summarise(time_interleaved(steps, rounds=args.rounds, warmups=1))
        params = {
            "ours Performer (causal)": sum(p.numel() for p in ours_performer.parameters()),
            "performer-pytorch PerformerLM (causal)": sum(p.numel() for p in theirs_performer.parameters()),
            "ours Linformer (masked LM head)": sum(p.numel() for p in ours_linformer.parameters()),
            "linformer LinformerLM": sum(p.numel() for p in theirs_linformer.parameters()),
        }
        record["references"].append(
            {
                "length": length,
                "linformer_k": k,
                "loadavg": loadavg(),
                "step": times,
                "parameters": params,
                "attn_implementation": {
                    "ours Performer (causal)": ours_performer.config._attn_implementation,
                    "ours Linformer (masked LM head)": ours_linformer.config._attn_implementation,
                },
            }
        )
        flush()


def markdown(args, record: dict) -> str:
    lines = [
        "# Linear-time attention: step time, saved activations, cache size, PyPI references",
        "",
        f"{args.layers} layers, width {args.width}, {args.heads} heads, FFN {4 * args.width}, vocabulary {args.vocab}, "
        f"batch 1, float32, {args.features or 'default'} random features, dropout 0. Training step = forward + "
        f"backward of the LM loss (no optimiser). Step times: median (min) in ms over {args.rounds} interleaved "
        "rounds after one warm-up, one process. Saved activations: distinct storages autograd keeps for backward in "
        "one forward (MiB), not peak RSS. The machine is shared with other sessions' runs: the load average is recorded "
        "per length; trust the same-row ratios more than the absolute times.",
        "",
        "## 1. Training step against length (causal)",
        "",
    ]
    names = [*KERNELISED, DENSE]
    rows = []
    for cell in record["scaling"]:
        step = cell["step"]
        rows.append(
            [
                cell["length"],
                *(f"{ms(step[n]['median_s'])} ({ms(step[n]['min_s'])})" for n in names),
                *(f"{cell['dense_over_model'][n]:.2f}" for n in KERNELISED),
                *(mib(cell["saved_bytes"][n]) for n in names),
                cell["loadavg"][0] if cell["loadavg"] else "-",
            ]
        )
    headers = ["T", *(f"{n} ms" for n in names), *(f"dense / {n}" for n in KERNELISED)]
    headers += [*(f"{n} saved MiB" for n in names), "load (1 min)"]
    lines.append(markdown_table(headers, rows))
    for name in KERNELISED:
        faster = [c["length"] for c in record["scaling"] if c["dense_over_model"][name] > 1]
        slower = [c["length"] for c in record["scaling"] if c["dense_over_model"][name] <= 1]
        lines.append(
            f"\n- {name}: faster than dense SDPA at T = {faster or 'none measured'}; not faster at "
            f"T = {slower or 'none measured'}."
        )
    lines += ["", "## 2. Generation cache size after a prompt (bytes)", ""]
    rows = [[row["prompt"], *(row[n] for n in names)] for row in record["cache"]]
    lines.append(markdown_table(["prompt tokens", *names], rows))
    lines += ["", "## 3. Step time against the PyPI references (same config, interleaved)", ""]
    rows = []
    for cell in record["references"]:
        step = cell["step"]
        for ours, theirs in (
            ("ours Performer (causal)", "performer-pytorch PerformerLM (causal)"),
            ("ours Linformer (masked LM head)", "linformer LinformerLM"),
        ):
            rows.append(
                [
                    cell["length"],
                    ours,
                    f"{ms(step[ours]['median_s'])} ({ms(step[ours]['min_s'])})",
                    theirs,
                    f"{ms(step[theirs]['median_s'])} ({ms(step[theirs]['min_s'])})",
                    f"{step[theirs]['median_s'] / step[ours]['median_s']:.2f}",
                    f"{cell['parameters'][ours]} / {cell['parameters'][theirs]}",
                    cell["loadavg"][0] if cell["loadavg"] else "-",
                ]
            )
    lines.append(
        markdown_table(
            ["T", "ours", "ms", "reference", "ms", "reference / ours", "parameters ours / ref", "load (1 min)"], rows
        )
    )
    lines.append(
        "\nReferences: performer-pytorch with absolute learned positions (`rotary_position_emb=False`), tied "
        "embeddings, `nb_features` as ours; LinformerLM's `k` = our `projected_length`, our `projection_sharing='headwise'`"
        " (one E, F per layer shared by its heads, LinformerLM's layout); LinformerLM unties its output layer. Their losses: cross-entropy on their logits (ours: the models' "
        "own loss)."
    )
    implementations = {n: i for cell in record["references"] for n, i in cell.get("attn_implementation", {}).items()}
    if implementations:
        lines.append(
            "Ours as built (default `attn_implementation`): "
            + ", ".join(f"{name}: `{impl}`" for name, impl in implementations.items())
            + " (the Linformer computes its softmax over the projected slots with PyTorch's SDPA under `sdpa` and "
            "`tff_native`, the explicit twin under `eager`; the kernelised models have no softmax to dispatch)."
        )
    if record["not_measured"]:
        lines += ["", "Not measured: " + "; ".join(record["not_measured"]) + "."]
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    parser.add_argument("--prompts", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--ref-lengths", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--features", type=int, default=None, help="random features (default: Dh ln Dh)")
    parser.add_argument("--linformer-k", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--budget-s", type=float, default=600.0, help="skip the cells that start after this")
    parser.add_argument("--parts", nargs="+", default=["scaling", "cache", "references"])
    parser.add_argument("--name", default="linear_attention")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default: bench/results)")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes, seconds")
    args = parser.parse_args(argv)
    if args.dry_run:
        args.lengths, args.prompts, args.ref_lengths = [64, 128], [8, 32], [64]
        args.layers, args.width, args.heads, args.features, args.linformer_k, args.rounds = 1, 32, 2, 8, 16, 2
        args.name += "_dry_run"
    setup_threads()
    import common

    if args.out is not None:
        common.RESULTS_DIR = args.out

    record = {"scaling": [], "cache": [], "references": [], "not_measured": [], "_start": time.perf_counter()}

    def flush():
        payload = {key: value for key, value in record.items() if not key.startswith("_")}
        write_results(
            args.name,
            {"args": {**vars(args), "out": str(args.out) if args.out else None}, **payload},
            markdown(args, record),
        )

    parts = {"scaling": part_scaling, "cache": part_cache, "references": part_references}
    for part in args.parts:
        parts[part](args, record, flush)
    flush()
    print((common.RESULTS_DIR / f"{args.name}.md").read_text())  # noqa: T201


if __name__ == "__main__":
    main()
