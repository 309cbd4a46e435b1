"""SPALM vs kNN-LM vs Transformer-XL on the bundled State of the Union corpus, the same datastore for both retrieval
models (issue 41, SPALM fidelity).

1. **Transformer-XL**: a tiny `TffTransfoXLLMHeadModel` (plain softmax, tied embeddings, the bundled 8k BPE
   tokenizer) trained from scratch on blocks of the train split (1790-1994) for ``--train-steps`` AdamW steps.
2. **Datastore**: (final hidden state, next token) over ``--datastore-tokens`` training tokens (the latest
   addresses before the last ``--gate-tokens``), built twice: by the kNN-LM's builder on the Transformer-XL
   (`tf_family.retrieval.build_datastore`, key at the LM head's input) and by SPALM's (`build_datastore` on its copy
   of the stack, key at ``retrieval_point``). The two share one ``content_sha256`` (asserted): the same keys and
   values, one datastore.
3. **kNN-LM**: the Transformer-XL wrapped with that datastore; λ chosen on validation from ``--lmbdas`` (k =
   ``--k``, exact L2 search).
4. **SPALM**: the Transformer-XL's weights copied into `TffSpalmForCausalLM` (the stack and the softmax are the
   same tensors' values), the datastore attached, and only the gate ``w_g`` trained (``--gate-steps`` AdamW steps)
   on the last ``--gate-tokens`` of the train split, which the datastore does not hold (on datastore text every
   position retrieves its own next token). The paper fine-tunes more of the model; this bench isolates the gate.
5. **Perplexity** on the first ``--eval-tokens`` of validation (1995-2009) and test (2010 on), every block read on
   its own (no memory carried between blocks, the same for the three models).

Run: ``python bench/bench_spalm.py --threads 1`` (a few minutes on one core); ``--quick`` for a smoke run.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

from common import markdown_table, setup_threads, write_results


def _threads() -> int:
    if "--threads" in sys.argv:
        return int(sys.argv[sys.argv.index("--threads") + 1])
    return 2


setup_threads(_threads())

import torch  # noqa: E402  (after setup_threads)
from transformers import AutoTokenizer  # noqa: E402
from transformers.utils import logging as transformers_logging  # noqa: E402

from tf_family.data import SOTU_TOKENIZER_DIR, load_sotu, pack_into_blocks  # noqa: E402
from tf_family.data.packing import LMBlocks  # noqa: E402
from tf_family.models.knn_lm.modeling_knn_lm import TffKNNLMForCausalLM  # noqa: E402
from tf_family.models.spalm.configuration_spalm import TffSpalmConfig  # noqa: E402
from tf_family.models.spalm.modeling_spalm import TffSpalmForCausalLM  # noqa: E402
from tf_family.models.transfo_xl.configuration_transfo_xl import TffTransfoXLConfig  # noqa: E402
from tf_family.models.transfo_xl.modeling_transfo_xl import TffTransfoXLLMHeadModel  # noqa: E402
from tf_family.retrieval.datastore import build_datastore  # noqa: E402

transformers_logging.set_verbosity_error()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="smoke setting (under a minute)")
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--train-steps", type=int, default=400)
    parser.add_argument("--datastore-tokens", type=int, default=32_768)
    parser.add_argument("--gate-tokens", type=int, default=16_384)
    parser.add_argument("--gate-steps", type=int, default=60)
    parser.add_argument("--gate-batch-size", type=int, default=8)
    parser.add_argument("--finetune-lr", type=float, default=5e-4)
    parser.add_argument("--eval-tokens", type=int, default=8_192)
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--lmbdas", type=float, nargs="+", default=[0.05, 0.1, 0.2, 0.3, 0.5])
    args = parser.parse_args()
    if args.quick:
        args.train_steps, args.datastore_tokens, args.gate_tokens = 30, 4096, 2048
        args.gate_steps, args.eval_tokens = 10, 1024
    return args


# ------------------------------------------------------------------------------------------------------------ data
def split_blocks(tokenizer, split: str, block_size: int) -> LMBlocks:
    documents = tokenizer(list(load_sotu()[split]["text"]), add_special_tokens=False)["input_ids"]
    return pack_into_blocks(documents, block_size, tokenizer.eos_token_id)


def rows(blocks: LMBlocks, start: int, stop: int) -> LMBlocks:
    part = slice(max(0, start), max(0, stop))
    return LMBlocks(blocks.input_ids[part], blocks.labels[part], blocks.starts_document[part], blocks.pad_token_id)


def batches(blocks: LMBlocks, size: int) -> list[dict]:
    return [blocks.batch(range(i, min(i + size, len(blocks)))) for i in range(0, len(blocks), size)]


def blocks_of(blocks: LMBlocks, tokens: int) -> int:
    return max(1, math.ceil(tokens / blocks.block_size))


# ------------------------------------------------------------------------------------------------------- training
def train(model, parameters, data: LMBlocks, steps: int, batch_size: int, lr: float, seed: int) -> float:
    """AdamW steps on random batches of ``data`` (labels as the recipes give them: next tokens, -100 ignored);
    returns the seconds taken."""
    optimizer = torch.optim.AdamW(parameters, lr=lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed)
    model.train()
    started = time.perf_counter()
    for step in range(steps):
        picked = torch.randint(0, len(data), (batch_size,), generator=generator).tolist()
        batch = data.batch(picked)
        for group in optimizer.param_groups:  # linear warm-up over 5 %, then cosine decay
            warm = max(1, steps // 20)
            group["lr"] = lr * min(1.0, (step + 1) / warm) * 0.5 * (1 + math.cos(math.pi * step / steps))
        loss = next_token_loss(model(input_ids=batch["input_ids"], use_cache=False).logits, batch["labels"])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    return time.perf_counter() - started


def next_token_loss(log_probs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean NLL of ``labels`` (aligned next tokens, -100 ignored) under ``(B, T, V)`` log-probabilities."""
    return torch.nn.functional.nll_loss(log_probs.reshape(-1, log_probs.shape[-1]), labels.reshape(-1))


@torch.no_grad()
def perplexity(model, data: LMBlocks, batch_size: int, **kwargs) -> tuple[float, int]:
    total, count = 0.0, 0
    for batch in batches(data, batch_size):
        log_probs = model(input_ids=batch["input_ids"], use_cache=False, **kwargs).logits.float()
        keep = batch["labels"] != -100
        picked = log_probs.gather(-1, batch["labels"].clamp_min(0)[..., None])[..., 0]
        total -= float(picked[keep].sum())
        count += int(keep.sum())
    return math.exp(total / count), count


@torch.no_grad()
def mean_gate(model, data: LMBlocks, batch_size: int) -> float:
    gates = [model(input_ids=b["input_ids"], use_cache=False).gate.mean() for b in batches(data, batch_size)]
    return float(torch.stack(gates).mean())


# ------------------------------------------------------------------------------------------------------------- main
def main() -> None:
    args = parse_args()
    started = time.perf_counter()
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(SOTU_TOKENIZER_DIR)
    train_blocks = split_blocks(tokenizer, "train", args.block_size)
    gate_count = blocks_of(train_blocks, args.gate_tokens)
    store_count = blocks_of(train_blocks, args.datastore_tokens)
    gate_blocks = rows(train_blocks, len(train_blocks) - gate_count, len(train_blocks))
    store_blocks = rows(train_blocks, len(train_blocks) - gate_count - store_count, len(train_blocks) - gate_count)
    validation = split_blocks(tokenizer, "validation", args.block_size)
    validation = rows(validation, 0, blocks_of(validation, args.eval_tokens))
    test = split_blocks(tokenizer, "test", args.block_size)
    test = rows(test, 0, blocks_of(test, args.eval_tokens))

    # ---- 1. Transformer-XL
    shape = {
        "vocab_size": len(tokenizer), "cutoffs": [], "div_val": 1, "d_model": args.width, "n_head": 2,
        "d_head": args.width // 2, "d_inner": 4 * args.width, "n_layer": args.layers, "mem_len": args.block_size,
        "clamp_len": 4 * args.block_size, "same_length": False, "dropout": 0.0, "eos_token_id": tokenizer.eos_token_id,
    }  # fmt: skip
    xl = TffTransfoXLLMHeadModel(TffTransfoXLConfig(**shape)).eval()
    xl_seconds = train(xl, xl.parameters(), train_blocks, args.train_steps, args.batch_size, 2e-3, seed=0)
    print(f"Transformer-XL trained in {xl_seconds:.0f} s", flush=True)

    # ---- 2. one datastore, built by both builders
    spalm = TffSpalmForCausalLM(TffSpalmConfig(**shape, k=args.k)).eval()
    missing, unexpected = spalm.load_state_dict(xl.state_dict(), strict=False)
    assert missing == ["gate.weight"] and not unexpected, (missing, unexpected)
    datastore = spalm.build_datastore(batches(store_blocks, 32), show_progress=False)
    knn_datastore = build_datastore(xl, batches(store_blocks, 32), show_progress=False)
    same = datastore.description["content_sha256"] == knn_datastore.description["content_sha256"]
    assert same, "the kNN-LM's and SPALM's builders stored different keys"
    print(f"datastore: {datastore.size} keys (the same content for both models)", flush=True)

    # ---- 3. kNN-LM, λ on validation
    knn = TffKNNLMForCausalLM.from_base(xl, k=args.k, lmbda=args.lmbdas[0], check_datastore=False)
    knn.set_datastore(datastore, force=True)  # the same datastore object SPALM reads (fingerprinted by its stack)
    knn_validation = {x: perplexity(knn, validation, 32, lmbda=x)[0] for x in args.lmbdas}
    best_lmbda = min(knn_validation, key=knn_validation.get)
    print(f"kNN-LM validation perplexity by lambda: {knn_validation}", flush=True)

    # ---- 4. SPALM: the gate trained on held-out training text; then (the paper's setting) the whole model, with a
    # Transformer-XL fine-tuned on the same text for the same steps as its control
    spalm_before = perplexity(spalm, validation, 32)[0]
    for name, parameter in spalm.named_parameters():
        parameter.requires_grad_(name == "gate.weight")
    steps, size = args.gate_steps, args.gate_batch_size
    gate_seconds = train(spalm, [spalm.gate.weight], gate_blocks, steps, size, 5e-2, seed=1)
    print(f"SPALM gate trained in {gate_seconds:.0f} s", flush=True)
    torch.manual_seed(2)  # a fresh gate (g near 0.5): one trained shut above has no gradient left to reopen it
    full = TffSpalmForCausalLM(TffSpalmConfig(**shape, k=args.k, check_datastore=False)).eval()
    full.load_state_dict({**xl.state_dict(), "gate.weight": full.gate.weight.detach().clone()})
    full.set_datastore(datastore)  # keys stay the pretrained stack's while the stack is fine-tuned (the paper's)
    for parameter in full.parameters():
        parameter.requires_grad_(True)
    full_seconds = train(full, full.parameters(), gate_blocks, steps, size, args.finetune_lr, seed=1)
    control = TffTransfoXLLMHeadModel(TffTransfoXLConfig(**shape)).eval()
    control.load_state_dict(xl.state_dict())
    control_seconds = train(control, control.parameters(), gate_blocks, steps, size, args.finetune_lr, seed=1)
    print(
        f"SPALM fine-tuned in {full_seconds:.0f} s, its Transformer-XL control in {control_seconds:.0f} s", flush=True
    )

    # ---- 5. perplexity
    results = {}
    for split, data in (("validation", validation), ("test", test)):
        xl_ppl, count = perplexity(xl, data, 32)
        results[split] = {
            "tokens": count,
            "transfo_xl": xl_ppl,
            "knn_lm": perplexity(knn, data, 32, lmbda=best_lmbda)[0],
            "spalm": perplexity(spalm, data, 32)[0],
            "spalm_mean_gate": mean_gate(spalm, data, 32),
            "transfo_xl_finetuned": perplexity(control, data, 32)[0],
            "spalm_finetuned": perplexity(full, data, 32)[0],
            "spalm_finetuned_mean_gate": mean_gate(full, data, 32),
        }
        print(split, results[split], flush=True)
    total_seconds = time.perf_counter() - started
    payload = {
        "settings": vars(args),
        "parameters": {"transfo_xl": sum(p.numel() for p in xl.parameters()), "spalm_extra": args.width},
        "datastore_keys": datastore.size,
        "datastore_content_sha256": datastore.description["content_sha256"],
        "knn_lm_validation_by_lambda": knn_validation,
        "knn_lm_lambda": best_lmbda,
        "spalm_validation_before_gate_training": spalm_before,
        "results": results,
        "seconds": {
            "transfo_xl_training": xl_seconds,
            "gate_training": gate_seconds,
            "spalm_finetuning": full_seconds,
            "transfo_xl_finetuning": control_seconds,
            "total": total_seconds,
        },
    }
    table = markdown_table(
        ["split", "tokens", "Transformer-XL", f"kNN-LM (λ={best_lmbda}, k={args.k})", "SPALM, gate trained",
         "(its mean gate)", "Transformer-XL fine-tuned", "SPALM fine-tuned", "(its mean gate)"],
        [
            [split, r["tokens"], f"{r['transfo_xl']:.2f}", f"{r['knn_lm']:.2f}", f"{r['spalm']:.2f}",
             f"{r['spalm_mean_gate']:.3f}", f"{r['transfo_xl_finetuned']:.2f}", f"{r['spalm_finetuned']:.2f}",
             f"{r['spalm_finetuned_mean_gate']:.3f}"]
            for split, r in results.items()
        ],
    )  # fmt: skip
    markdown = (
        "# SPALM vs kNN-LM vs Transformer-XL (bundled corpus, perplexity)\n\n"
        f"One tiny Transformer-XL ({payload['parameters']['transfo_xl']:,} parameters, width {args.width}, "
        f"{args.layers} layers, plain softmax over {len(tokenizer)} BPE tokens) trained {args.train_steps} steps of "
        f"{args.batch_size} x {args.block_size} tokens on the train split; one datastore of {datastore.size:,} "
        "(final hidden state, next token) pairs from the train split (the same content built by the kNN-LM's and by "
        f"SPALM's builder, sha256 {datastore.description['content_sha256'][:12]}…); kNN-LM λ picked on validation. "
        f"'SPALM, gate trained' = the Transformer-XL's weights plus the gate w_g ({args.width} parameters) trained "
        f"{args.gate_steps} steps of {args.gate_batch_size} blocks on the last {gate_blocks.input_ids.numel():,} "
        "train tokens, which the datastore does not hold. 'SPALM fine-tuned' = the Transformer-XL's weights with a "
        f"fresh gate, every weight trained as long on the same text (lr {args.finetune_lr}; the keys stay the pretrained stack's, as in the paper), "
        "against 'Transformer-XL fine-tuned', the Transformer-XL trained the same way without retrieval. "
        f"k = {args.k}, exact L2 search; every block read on its own.\n\n"
        f"{table}\n\n"
        f"SPALM before gate training (w_g at its init): validation perplexity {spalm_before:.2f}. kNN-LM validation "
        f"perplexity by λ: {', '.join(f'{x}: {p:.2f}' for x, p in knn_validation.items())}. Total "
        f"{total_seconds:.0f} s (Transformer-XL training {xl_seconds:.0f} s, gate training {gate_seconds:.0f} s, "
        f"fine-tuning {full_seconds:.0f} s + {control_seconds:.0f} s)."
    )
    write_results("spalm_quick" if args.quick else "spalm", payload, markdown)


if __name__ == "__main__":
    main()
