"""Memorizing Transformer (Wu et al. 2022): kNN-layer overhead, perplexity against memory size, passkey retrieval.

Three parts, each small enough for 2 shared CPU cores (``--parts``):

* **overhead**: one training step (forward, backward, AdamW; memory carried) of a Memorizing Transformer whose kNN
  layer reads a memory already holding 2k / 8k / 32k entries per row and head, against the same model without kNN
  layer (Transformer-XL, same weights otherwise), timed interleaved in one run; also one evaluation step and
  decoding (one token per forward, memory carried, as `generate()` does) with an 8k memory against none.
* **native** (not in the default parts): the larger model's training step at 8k entries with tf_family's native kNN
  kernels and with the PyTorch path (the same results), against Transformer-XL, interleaved in one process.
* **perplexity**: a Memorizing Transformer and a Transformer-XL of the same size, trained with the same budget on
  the bundled State of the Union addresses (ordered document streams, memory carried and reset at document starts),
  then the validation perplexity of the Memorizing model evaluated with kNN memory sizes 0 / 512 / 2k / 8k and of
  the Transformer-XL.
* **passkey**: a five-digit key planted in real text (SOTU), followed by filler text of a given distance, then the
  question; the answer digits are scored. The distance exceeds the local window and the XL cache (segment + mem_len)
  so only the kNN memory can carry the key. The model is trained on the task at short and long distances, then
  evaluated with and without its kNN memory (memory size 0) as the distance grows.

Run: ``python bench/bench_memorizing.py`` (overhead, perplexity, passkey; ``--parts native`` for the kernels against
the PyTorch path; ``--quick`` for a smoke run). Results go to ``bench/results/memorizing_<parts>[_quick].{json,md}``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

from common import format_seconds, loadavg, markdown_table, setup_threads, time_interleaved, write_results

setup_threads(2)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from tf_family import TffMemorizingConfig, TffMemorizingForCausalLM  # noqa: E402
from tf_family.data import SOTU_TOKENIZER_DIR, build_document_streams, load_sotu, schedule_streams  # noqa: E402
from tf_family.data.packing import IGNORE_INDEX  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", nargs="*", default=["overhead", "perplexity", "passkey"],
                        choices=["overhead", "native", "perplexity", "passkey"])  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="tiny sizes, a smoke run")
    parser.add_argument("--overhead_models", nargs="*", default=["small", "larger"], choices=list(OVERHEAD_MODELS))
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds of the overhead part")
    parser.add_argument("--train_steps", type=int, default=300)
    parser.add_argument("--passkey_steps", type=int, default=2400)
    parser.add_argument("--passkey_lr", type=float, default=4e-3)
    parser.add_argument("--passkey_near", type=int, nargs=2, default=[4, 40], help="training distances in the window")
    parser.add_argument("--passkey_far", type=int, nargs=2, default=[136, 256], help="training distances beyond it")
    parser.add_argument("--passkey_far_from", type=float, default=0.3, help="share of the steps before far batches")
    parser.add_argument("--passkey_far_batch", type=int, default=8, help="samples in a far batch")
    parser.add_argument("--passkey_repeat_share", type=float, default=0.25, help="share of repeated-span samples")
    parser.add_argument("--passkey_probe_every", type=int, default=50, help="print probe accuracies (0: never)")
    parser.add_argument("--passkey_save", help="save the trained passkey model into this folder")
    parser.add_argument("--passkey_weights", help="evaluate these passkey weights instead of training")
    parser.add_argument("--eval_documents", type=int, default=4)
    parser.add_argument("--passkey_eval_samples", type=int, default=64)
    return parser.parse_args()


# the passkey model: two layers (the fewest that can copy: a previous-token head below the kNN layer, which then
# matches it) at half the small model's width, so the copy is learned within the CPU budget; the gate starts open
# (sigmoid(3) = 0.95): with it at 0.5 the local attention learned a copy tied to the trained distances, which the
# position-free retrieval could not take over beyond the window
PASSKEY_MODEL = {"d_model": 64, "n_head": 4, "d_head": 16, "d_inner": 256, "n_layer": 2, "knn_layers": [1],
                 "knn_gate_init": 3.0}  # fmt: skip


def model_config(quick: bool, **overrides) -> TffMemorizingConfig:
    fields = {"vocab_size": 8192, "d_model": 128, "n_head": 4, "d_head": 32, "d_inner": 512, "n_layer": 4,
              "mem_len": 64, "dropout": 0.0, "knn_layers": [2], "knn_top_k": 32, "knn_memory_size": 2048,
              "pre_lnorm": True}  # fmt: skip
    if quick:
        fields.update(d_model=32, d_inner=64, n_layer=2, knn_layers=[1], n_head=2, d_head=16, mem_len=16)
    return TffMemorizingConfig(**{**fields, **overrides})


def filled_memory(model, batch: int, size: int, generator: torch.Generator):
    """A memory holding ``size`` random unit keys (and values) per row and head."""
    config = model.config
    memory = model.empty_memory(batch, size)
    shape = (batch, config.n_head, size, config.d_head)
    keys = [F.normalize(torch.randn(shape, generator=generator), dim=-1) for _ in config.knn_layers]
    values = [torch.randn(shape, generator=generator) for _ in config.knn_layers]
    return type(memory)(None, memory.knn.write(keys, values))


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)


# --------------------------------------------------------------------------------------------------------- overhead
OVERHEAD_MODELS = {
    # name: (config overrides, batch, segment length)
    "small": ({}, 2, 128),
    "larger": (
        {"d_model": 512, "n_head": 8, "d_head": 64, "d_inner": 2048, "n_layer": 8, "knn_layers": [5], "mem_len": 256},
        2,
        256,
    ),  # fmt: skip
}


def search_floor(config, batch: int, length: int, size: int, generator: torch.Generator) -> dict:
    """The retrieval of one training step alone, on the shapes of the kNN layer (queries ``(B, H, T, Dh)`` against
    ``size`` keys per row and head): the score product alone (in the chunks the search uses, no selection) and the
    whole exact search (product + masks + top-k), and meliad's bucketed search."""
    from tf_family.memory import bucketed_top_k, exact_top_k

    heads, width, k = config.n_head, config.d_head, config.knn_top_k
    queries = F.normalize(torch.randn(batch, heads, length, width, generator=generator), dim=-1)
    keys = F.normalize(torch.randn(batch, heads, size, width, generator=generator), dim=-1)
    allowed = torch.ones(batch, 1, 1, size, dtype=torch.bool)
    flat_queries, flat_keys = queries.flatten(0, 1), keys.flatten(0, 1)
    chunk = -(-size // max(1, round((size / k) ** 0.5)))

    def product():
        for start in range(0, size, chunk):
            torch.bmm(flat_queries, flat_keys[:, start : start + chunk].transpose(1, 2))

    return {
        f"search floor {size}: score product": product,
        f"search {size}: exact top-k": lambda: exact_top_k(queries, keys, allowed, k),
        f"search {size}: bucketed (meliad)": lambda: bucketed_top_k(queries, keys, allowed, k),
    }


def overhead_for(args, name: str) -> tuple[dict, str]:
    overrides, batch, length = OVERHEAD_MODELS[name]
    sizes = [256, 512, 1024] if args.quick else [2048, 8192, 32768]
    if args.quick:
        batch, length, overrides = 2, 32, {}
    generator = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    knn_model = TffMemorizingForCausalLM(model_config(args.quick, **overrides)).train()
    xl_model = TffMemorizingForCausalLM(model_config(args.quick, **{**overrides, "knn_layers": []})).train()
    xl_model.load_state_dict(knn_model.state_dict(), strict=False)
    ids = torch.randint(0, 8192, (batch, length + 1), generator=generator)
    inputs, labels = ids[:, :-1], ids[:, 1:]
    states = {}

    def train_step(label, model, optimizer):
        def step():
            out = model(inputs, mems=states[label])
            lm_loss(out.logits, labels).backward()
            optimizer.step()
            optimizer.zero_grad()
            states[label] = out.mems

        return step

    steps = {}
    for label, model, size in [("Transformer-XL (no kNN layer)", xl_model, 0)] + [
        (f"kNN layer, {size} entries", knn_model, size) for size in sizes
    ]:
        states[label] = filled_memory(model, batch, size, generator)
        steps[label] = train_step(label, model, torch.optim.AdamW(model.parameters(), lr=1e-5))
    for size in sizes:
        steps.update(search_floor(knn_model.config, batch, length, size, generator))
    times = time_interleaved(steps, rounds=3 if args.quick else args.rounds)
    base = statistics.median(times["Transformer-XL (no kNN layer)"])
    rows = []
    for size in [0, *sizes]:
        label = "Transformer-XL (no kNN layer)" if size == 0 else f"kNN layer, {size} entries"
        median = statistics.median(times[label])
        ratios = [step / xl - 1 for step, xl in zip(times[label], times["Transformer-XL (no kNN layer)"], strict=True)]
        row = [label, format_seconds(median), f"{(median / base - 1) * 100:+.1f} %",
               f"{statistics.median(ratios) * 100:+.1f} %"]  # fmt: skip
        if size:
            for part in (f"search floor {size}: score product", f"search {size}: exact top-k",
                         f"search {size}: bucketed (meliad)"):  # fmt: skip
                search = statistics.median(times[part])
                row.append(f"{format_seconds(search)} ({search / base * 100:.1f} %)")
        else:
            row += ["", "", ""]
        rows.append(row)
    config = knn_model.config
    parameters = sum(p.numel() for p in xl_model.parameters()) / 1e6
    markdown = (
        f"#### Model `{name}`: {config.n_layer} layers, d_model {config.d_model}, {config.n_head} heads x "
        f"{config.d_head}, d_inner {config.d_inner}, mem_len {config.mem_len}, {parameters:.1f} M parameters, kNN "
        f"layer {config.knn_layers}, k = {config.knn_top_k}; batch {batch} x {length} tokens\n\n"
        + markdown_table(
            [
                "training step",
                "median",
                "vs Transformer-XL",
                "median of per-round ratios",
                "floor: score product alone (% of XL step)",
                "exact search alone",
                "bucketed search alone",
            ],  # fmt: skip
            rows,
        )
    )
    return {"times_s": times}, markdown


def overhead(args) -> dict:
    results, sections = {}, []
    for name in args.overhead_models:
        results[name], markdown = overhead_for(args, name)
        sections.append(markdown)
    # evaluation and decoding on the small model
    generator = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    size = 512 if args.quick else 8192
    batch, length = 2, 32 if args.quick else 128
    knn_model = TffMemorizingForCausalLM(model_config(args.quick)).eval()
    xl_model = TffMemorizingForCausalLM(model_config(args.quick, knn_layers=[])).eval()
    xl_model.load_state_dict(knn_model.state_dict(), strict=False)
    inputs = torch.randint(0, 8192, (batch, length), generator=generator)
    eval_states = {"xl": filled_memory(xl_model, batch, 0, generator),
                   "knn": filled_memory(knn_model, batch, size, generator)}  # fmt: skip
    decode_tokens = 8 if args.quick else 32

    def eval_step(name, model):
        def step():
            with torch.no_grad():
                eval_states[name] = model(inputs, mems=eval_states[name]).mems

        return step

    def decode(model, memory_size):
        filled = filled_memory(model, 1, memory_size, generator)

        def run():
            memory = filled.clone()  # decoding writes in place
            token = inputs[:1, -1:]
            with torch.no_grad():
                for _ in range(decode_tokens):
                    out = model(token, mems=memory)
                    memory, token = out.mems, out.logits[:, -1:].argmax(-1)

        return run

    other_times = time_interleaved(
        {
            "eval: Transformer-XL": eval_step("xl", xl_model),
            f"eval: kNN {size}": eval_step("knn", knn_model),
            "decode: Transformer-XL": decode(xl_model, 0),
            f"decode: kNN {size}": decode(knn_model, size),
        },
        rounds=3 if args.quick else args.rounds,
    )
    other = []
    for kind in ("eval", "decode"):
        xl = statistics.median(other_times[f"{kind}: Transformer-XL"])
        knn = statistics.median(other_times[f"{kind}: kNN {size}"])
        tokens = batch * length if kind == "eval" else decode_tokens
        other.append([kind, f"{tokens / xl:,.0f}", f"{tokens / knn:,.0f}", f"{(knn / xl - 1) * 100:+.1f} %"])
    markdown = (
        "### kNN-layer overhead\n\nTraining step = forward + backward + AdamW with the memory carried (the kNN "
        "memory pre-filled with random unit keys, written in place); medians of interleaved rounds in one run. The "
        "last three columns time the retrieval of one step alone on the kNN layer's shapes (in parentheses: as a "
        "share of the Transformer-XL step): the score product alone is the floor of any exact search; the exact "
        "search is `exact_top_k` as the model runs it (the native kernel where it is built: the products in "
        "cache-sized tiles and a selection against a rising threshold; else PyTorch's two-stage top-k); meliad's "
        "bucketed search is approximate (recall of the true top-32 about 0.6, `tests/memory/test_knn_memory.py`). "
        "A shared machine moves single rounds by several points: the median of the per-round ratios is the steadier "
        "figure.\n\n"
        + "\n\n".join(sections)
        + f"\n\nEvaluation (model `small`, batch {batch} x {length}, no grad) and decoding (batch 1, one token per "
        f"forward, {decode_tokens} tokens, memory carried and written as `generate()` does) with a {size}-entry memory:\n\n"
        + markdown_table(["", "Transformer-XL tok/s", f"kNN {size} tok/s", "time vs Transformer-XL"], other)
    )
    return {"models": results, "other_times_s": other_times, "markdown": markdown}


# ------------------------------------------------------------------------------------------------------ perplexity
def native_paths(args) -> dict:
    """The larger model's training step at 8k entries with the native kNN kernels (search and pair products) and
    without them (PyTorch's grouped search and gathered pairs: the same results), against Transformer-XL, all three
    interleaved in one process: the per-round differences are steadier than across processes."""
    from tf_family.attention import native

    overrides, batch, length = OVERHEAD_MODELS["larger"]
    size = 1024 if args.quick else 8192
    if args.quick:
        batch, length, overrides = 2, 32, {}
    generator = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    models = {"native": TffMemorizingForCausalLM(model_config(args.quick, **overrides)).train()}
    models["pytorch"] = TffMemorizingForCausalLM(model_config(args.quick, **overrides)).train()
    models["pytorch"].load_state_dict(models["native"].state_dict())
    models["xl"] = TffMemorizingForCausalLM(model_config(args.quick, **{**overrides, "knn_layers": []})).train()
    models["xl"].load_state_dict(models["native"].state_dict(), strict=False)
    ids = torch.randint(0, 8192, (batch, length + 1), generator=generator)
    states = {
        name: filled_memory(model, batch, 0 if name == "xl" else size, generator) for name, model in models.items()
    }
    optimizers = {name: torch.optim.AdamW(model.parameters(), lr=1e-5) for name, model in models.items()}
    kernels = native.extension()

    def step(name):
        def run():
            native._state["module"] = None if name == "pytorch" else kernels  # the PyTorch path: no kernel
            try:
                out = models[name](ids[:, :-1], mems=states[name])
                lm_loss(out.logits, ids[:, 1:]).backward()
                optimizers[name].step()
                optimizers[name].zero_grad()
                states[name] = out.mems
            finally:
                native._state["module"] = kernels

        return run

    times = time_interleaved(
        {name: step(name) for name in ("xl", "native", "pytorch")}, 3 if args.quick else args.rounds
    )
    rows = []
    for name in ("native", "pytorch"):
        ratios = [step / xl - 1 for step, xl in zip(times[name], times["xl"], strict=True)]
        extra = [step - xl for step, xl in zip(times[name], times["xl"], strict=True)]
        rows.append([name, format_seconds(statistics.median(times[name])), f"{statistics.median(ratios) * 100:+.1f} %",
                     format_seconds(statistics.median(extra))])  # fmt: skip
    markdown = (
        f"### Native kNN kernels against the PyTorch path\n\nModel `larger`, {size} entries, batch {batch} x "
        f"{length}: training steps interleaved in one process ({len(times['xl'])} rounds; Transformer-XL step "
        f"{format_seconds(statistics.median(times['xl']))}; the kernels {'built' if kernels is not None else 'NOT built'})."
        "\n\n" + markdown_table(["kNN layer", "step", "median of per-round ratios", "median extra time"], rows)
    )
    return {"times_s": times, "markdown": markdown}


def sotu_streams(tokenizer, split: str, limit: int | None, block: int):
    texts = load_sotu()[split]["text"]
    texts = texts[:limit] if limit else texts
    docs = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    return build_document_streams(docs, block, tokenizer.eos_token_id), sum(map(len, docs))


def train_lm(model, blocks, doc_blocks, steps: int, batch: int, lr: float) -> float:
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 20))
    memory, epoch, done, losses = None, 0, 0, []
    while done < steps:
        for global_batch in schedule_streams(doc_blocks, batch, seed=0, epoch=epoch):
            data = blocks.batch(global_batch)
            out = model(data["input_ids"], mems=memory, reset_mems=None if memory is None else data["reset"])
            loss = lm_loss(out.logits, data["labels"])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step(), scheduler.step(), optimizer.zero_grad()
            memory, done = out.mems, done + 1
            losses.append(loss.item())
            if done >= steps:
                break
        epoch, memory = epoch + 1, None
    return statistics.mean(losses[-20:])


def evaluate_lm(model, blocks, doc_blocks, batch: int, memory_size: int | None) -> dict:
    """Validation perplexity with an evaluation memory of ``memory_size`` kNN entries (None: the model's default,
    or no kNN memory for a model without kNN layer). Also returns the per-token losses (to compare memory sizes
    token by token) and how much the predictions move along the text (the spread over positions of the
    log-probabilities of the first block: a model that collapsed to token frequencies has none, and then no
    memory can change its outputs)."""
    model.eval()
    losses, spread = [], None
    memory = None if memory_size is None else model.empty_memory(batch, memory_size)
    with torch.no_grad():
        for global_batch in schedule_streams(doc_blocks, batch, seed=0, shuffle=False):
            data = blocks.batch(global_batch)
            reset = None if memory is None else data["reset"]
            out = model(data["input_ids"], mems=memory, reset_mems=reset)
            if memory_size is not None and out.mems.knn.capacity != memory_size:
                raise RuntimeError(f"evaluation asked for {memory_size} kNN entries, the model read "
                                   f"{out.mems.knn.capacity}")  # fmt: skip
            labels = data["labels"]
            loss = F.cross_entropy(out.logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX,
                                   reduction="none")  # fmt: skip
            losses.append(loss[labels.flatten() != IGNORE_INDEX])
            if spread is None:
                spread = out.logits[0].float().log_softmax(-1).std(0).mean().item()
            memory = out.mems
    losses = torch.cat(losses)
    return {"ppl": math.exp(losses.mean().item()), "count": losses.numel(), "losses": losses, "spread": spread}


def perplexity(args) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(SOTU_TOKENIZER_DIR)
    block, batch = (32, 2) if args.quick else (128, 4)
    steps = 10 if args.quick else args.train_steps
    (train_blocks, train_docs), train_tokens = sotu_streams(tokenizer, "train", 6 if args.quick else None, block)
    (eval_blocks, eval_docs), eval_tokens = sotu_streams(tokenizer, "validation", args.eval_documents, block)
    results, rows = {}, []
    for name, overrides in (("Memorizing", {}), ("Transformer-XL", {"knn_layers": []})):
        torch.manual_seed(0)
        model = TffMemorizingForCausalLM(model_config(args.quick, vocab_size=len(tokenizer), **overrides))
        start = time.perf_counter()
        last = train_lm(model, train_blocks, train_docs, steps, batch, 1e-3)
        minutes = (time.perf_counter() - start) / 60
        sizes = [0, 512, 2048, 8192] if name == "Memorizing" else [None]
        without = None
        for size in sizes:
            evaluation = evaluate_lm(model, eval_blocks, eval_docs, batch, size)
            ppl, count = evaluation["ppl"], evaluation["count"]
            results[f"{name} / {size}"] = ppl
            label = "(no kNN layer)" if size is None else f"{size}"
            without = evaluation["losses"] if size == 0 else without
            moved = (
                "" if without is None or size in (0, None) else f"{(evaluation['losses'] - without).abs().mean():.4f}"
            )
            rows.append([name, label, f"{ppl:.2f}", moved, f"{evaluation['spread']:.3f}", f"{last:.3f}",
                         f"{minutes:.1f} min"])  # fmt: skip
    config = model_config(args.quick)
    markdown = (
        f"### Validation perplexity against kNN memory size\n\nSOTU, trained {steps} steps of {batch} streams x "
        f"{block} tokens ({steps * batch * block:,} tokens of {train_tokens:,}), AdamW lr 1e-3, seed 0; both models "
        f"{config.n_layer} layers, d_model {config.d_model}, mem_len {config.mem_len}; the Memorizing model trained "
        f"with a {config.knn_memory_size}-entry kNN memory at layer {config.knn_layers}, k = {config.knn_top_k}. "
        f"Validation: the first {args.eval_documents} addresses of 1995-2009 ({count:,} scored tokens), read in "
        f"{batch} ordered streams with the memories carried. The model is pre-LN (the post-LN model of the earlier runs collapsed to token frequencies within 150 "
        "steps: its log-probabilities did not move along the text, spread 8e-5, so no memory size could change "
        "them). Columns: mean absolute change of the per-token loss against memory size 0 on the same weights; "
        "spread of the log-probabilities over the positions of the first block (0 = the model ignores its "
        "input).\n\n"
        + markdown_table(
            [
                "model",
                "kNN memory at evaluation",
                "val ppl",
                "mean |loss change| vs memory 0",
                "log-prob spread",
                "last train loss",
                "training time",
            ],
            rows,
        )  # fmt: skip
    )
    return {"perplexity": results, "markdown": markdown}


# ---------------------------------------------------------------------------------------------------------- passkey
QUESTION = " What is the pass key? The pass key is"
KEY_LENGTH = 5


def passkey_sample(tokenizer, filler: list[int], distance: int, generator: torch.Generator):
    """A key of five distinct digits 1-9 (each a single token of the SOTU tokenizer, `` 3``; `` 0`` is two) in an
    introduction, then ``distance`` tokens of real text, then the question; the labels score the answer digits only."""
    digits = (torch.randperm(9, generator=generator)[:KEY_LENGTH] + 1).tolist()
    key = " ".join(str(d) for d in digits)
    intro = tokenizer(f" The pass key is {key}. Remember it. ", add_special_tokens=False)["input_ids"]
    start = int(torch.randint(0, len(filler) - distance, (1,), generator=generator))
    question = tokenizer(QUESTION, add_special_tokens=False)["input_ids"]
    answer = tokenizer(f" {key}", add_special_tokens=False)["input_ids"]
    if len(answer) != KEY_LENGTH:
        raise ValueError(f"the tokenizer splits the key {key!r} into {len(answer)} tokens, not one per digit.")
    ids = intro + filler[start : start + distance] + question + answer
    targets = [IGNORE_INDEX] * (len(ids) - len(answer)) + answer  # the answer tokens are scored
    return torch.tensor(ids), torch.tensor(targets[1:] + [IGNORE_INDEX])  # labels: the next token


def repeat_sample(filler: list[int], distance: int, generator: torch.Generator, span: int = 24):
    """The passkey's mechanism with more scored tokens: a span of real text, ``distance`` tokens of filler, then the
    same span again, whose tokens from the third on are scored (the question of a passkey sample repeats its
    introduction the same way: the answer continues the repetition)."""
    first, start = (int(torch.randint(0, len(filler) - n, (1,), generator=generator)) for n in (span, distance))
    ids = filler[first : first + span] + filler[start : start + distance] + filler[first : first + span]
    targets = [IGNORE_INDEX] * (len(ids) - span + 2) + ids[len(ids) - span + 2 :]
    return torch.tensor(ids), torch.tensor(targets[1:] + [IGNORE_INDEX])


def run_passkey(model, samples, segment: int, memory_size: int | None, train: bool, optimizer=None):
    """Feed a batch of samples segment by segment (both memories carried) and return the loss and the accuracy on
    the scored tokens. The output layer runs on the scored positions only (the 8192-way softmax at every position
    would be most of the step). ``memory_size``: kNN entries per row and head; None: the whole sample fits (training;
    nothing is evicted, so any larger memory gives the same result); 0: no kNN memory."""
    length = max(len(s[0]) for s in samples)  # tokenisations differ by a token or two: pad in front
    ids = torch.stack([F.pad(s[0], (length - len(s[0]), 0)) for s in samples])
    labels = torch.stack([F.pad(s[1], (length - len(s[1]), 0), value=IGNORE_INDEX) for s in samples])
    size = -(-length // segment) * segment if memory_size is None else memory_size
    memory = model.empty_memory(len(samples), size)
    total, correct, scored = 0.0, 0, 0
    for start in range(0, length, segment):
        out = model.transformer(ids[:, start : start + segment], mems=memory)
        memory, target = out.mems, labels[:, start : start + segment]
        counted = target != IGNORE_INDEX
        if counted.any():
            logprobs = model.lm_head(out.last_hidden_state[counted])  # (N, V), N scored positions
            loss = F.nll_loss(logprobs, target[counted])
            if train:
                loss.backward()
            total += loss.item()
            correct += int((logprobs.argmax(-1) == target[counted]).sum())
            scored += int(counted.sum())
    if train:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step(), optimizer.zero_grad()
    return total, correct / max(scored, 1)


def passkey_batches(tokenizer, filler, steps: int, batch: int, near: tuple[int, int], far: tuple[int, int],
                    generator: torch.Generator, far_from: float, repeat_share: float, far_batch: int):  # fmt: skip
    """The training curriculum: until ``far_from`` of the steps, every batch plants the key within the local window
    (distances ``near``), where the layers learn to find and copy it (with local attention and with the kNN
    retrieval, which in ``knn_retrieval="token"`` also reaches the segment); then every other batch plants it
    beyond the window (``far``), where only the kNN memory reaches it, with ``far_batch`` samples (a far sample is
    several times as long as a near one). A ``repeat_share`` of each batch are
    `repeat_sample` (the same copy with more scored tokens), the rest passkey samples. All samples of a batch share
    one distance."""
    for step in range(steps):
        is_far = step >= far_from * steps and step % 2
        low, high = far if is_far else near
        distance = int(torch.randint(low, high + 1, (1,), generator=generator))
        size = far_batch if is_far else batch
        repeats = round(size * repeat_share)
        samples = [passkey_sample(tokenizer, filler, distance, generator) for _ in range(size - repeats)]
        yield distance, samples + [repeat_sample(filler, distance, generator) for _ in range(repeats)]


def train_passkey(args, tokenizer, filler, config, steps, batch, segment, near, far):
    """Train a fresh model on the curriculum; every ``--passkey_probe_every`` steps print the digit accuracy at
    distances 32 (inside the local window) and 256 (beyond it) with the kNN memory and without (memory size 0)."""
    torch.manual_seed(0)
    model = TffMemorizingForCausalLM(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.passkey_lr)
    warmup = max(1, steps // 20)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup))
    generator, probe_generator = torch.Generator().manual_seed(0), torch.Generator().manual_seed(321)
    probes = {d: [passkey_sample(tokenizer, filler, d, probe_generator) for _ in range(16)] for d in (32, 256)}
    batches = passkey_batches(tokenizer, filler, steps, batch, near, far, generator, args.passkey_far_from,
                              args.passkey_repeat_share, args.passkey_far_batch)  # fmt: skip
    start = time.perf_counter()
    history = []
    for step, (distance, samples) in enumerate(batches):
        history.append((distance, run_passkey(model, samples, segment, None, True, optimizer)[1]))
        scheduler.step()
        if args.passkey_probe_every and (step + 1) % args.passkey_probe_every == 0:
            model.eval()
            with torch.no_grad():
                probe = {d: [round(run_passkey(model, s, segment, size, False)[1], 3) for size in (None, 0)]
                         for d, s in probes.items()}  # fmt: skip
            model.train()
            recent = statistics.mean(a for _, a in history[-args.passkey_probe_every :])
            gates = [round(torch.sigmoid(layer.knn_gate).mean().item(), 3) for layer in model.transformer.layers
                     if hasattr(layer, "knn_gate")]  # fmt: skip
            print(f"step {step + 1} ({time.perf_counter() - start:.0f} s): train accuracy {recent:.3f}, probe "
                  f"accuracy [with memory, without] {probe}, mean gate {gates}", flush=True)  # fmt: skip
    return model, history, (time.perf_counter() - start) / 60


def passkey(args) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(SOTU_TOKENIZER_DIR)
    texts = load_sotu()["train"]["text"][:40]
    filler = [t for text in texts for t in tokenizer(text, add_special_tokens=False)["input_ids"]]
    segment, batch = (16, 4) if args.quick else (64, 32)
    near, far = ((4, 12), (40, 64)) if args.quick else (tuple(args.passkey_near), tuple(args.passkey_far))
    distances = [8, 32, 64] if args.quick else [32, 128, 256, 512, 1024, 2048]
    steps = 6 if args.quick else args.passkey_steps
    memory_size = 4096
    overrides = {} if args.quick else PASSKEY_MODEL
    config = model_config(args.quick, vocab_size=len(tokenizer), mem_len=segment, knn_memory_size=memory_size,
                          **overrides)  # fmt: skip
    if args.passkey_weights:  # weights trained by this loop in another process (its log says how)
        model = TffMemorizingForCausalLM.from_pretrained(args.passkey_weights)
        loaded = model.config.to_dict()
        if any(loaded.get(name) != value for name, value in config.to_diff_dict().items() if name.startswith(
            ("vocab", "d_", "n_", "mem_len", "knn_", "pre_lnorm", "cutoffs")
        )):  # fmt: skip
            raise ValueError(f"{args.passkey_weights} does not hold this benchmark's passkey model configuration.")
        history, minutes, trained = [], float("nan"), f"loaded from `{args.passkey_weights}`"
    else:
        model, history, minutes = train_passkey(args, tokenizer, filler, config, steps, batch, segment, near, far)
        trained = f"{minutes:.1f} min"
        if args.passkey_save:
            model.save_pretrained(args.passkey_save)
    model.eval()
    rows, results = [], {}
    test_generator = torch.Generator().manual_seed(123)
    count = 16 if args.quick else args.passkey_eval_samples
    for distance in distances:
        samples = [passkey_sample(tokenizer, filler, distance, test_generator) for _ in range(count)]
        accuracy = {}
        with torch.no_grad():
            for label, size in (("with kNN memory", memory_size), ("without (memory size 0)", 0)):
                accuracy[label] = statistics.mean(
                    run_passkey(model, samples[i : i + batch], segment, size, False)[1]
                    for i in range(0, len(samples), batch)
                )
        results[distance] = accuracy
        rows.append([distance, f"{accuracy['with kNN memory']:.3f}", f"{accuracy['without (memory size 0)']:.3f}"])
    late_near = [a for d, a in history[-40:] if d <= near[1]]
    late_far = [a for d, a in history[-40:] if d > near[1]]
    late = (
        f"answer accuracy over the last 40 steps: {statistics.mean(late_near or [0]):.3f} near, "
        f"{statistics.mean(late_far or [0]):.3f} far"
        if history
        else "its training log is bench/results/memorizing_passkey_training.log"
    )
    markdown = (
        f"### Passkey retrieval\n\nA key of {KEY_LENGTH} distinct digits 1-9 (one token each) in real text (SOTU), then "
        f"`distance` tokens of SOTU filler, then the question; accuracy on the {KEY_LENGTH} answer digits "
        f"(teacher-forced; chance 1/9 for the first digit, at most 1/5 for the last one given the others). Local "
        f"window: segment {segment} + XL cache {segment} tokens, so beyond {2 * segment} tokens the key is out of "
        f"reach except through the kNN memory ({memory_size} entries at evaluation, k = {config.knn_top_k}). Model: "
        f"{config.n_layer} layers, d_model {config.d_model}, {config.n_head} heads x {config.d_head}, d_inner "
        f'{config.d_inner}, pre-LN, kNN layer {config.knn_layers} (gate bias initialised to {config.knn_gate_init}), `knn_retrieval="{config.knn_retrieval}"`. '
        f"Trained {steps} steps of {batch} samples (AdamW {args.passkey_lr}, warm-up {max(1, steps // 20)} steps; "
        f"the answer tokens scored, the output layer run on them only; {round(batch * args.passkey_repeat_share)} "
        f"samples of each batch are a 24-token span of text repeated after the same filler, its second copy scored; "
        f"during training the kNN memory holds the whole sample), curriculum: distances {near} for the first "
        f"{args.passkey_far_from:.0%} of the steps, then {near} and {far} alternating, far batches of {args.passkey_far_batch} samples (training: {trained}; {late}); "
        f"evaluated on {count} fresh samples per distance, with the kNN memory and with memory size 0 (the same "
        f"weights).\n\n" + markdown_table(["distance (tokens)", "with kNN memory", "without (memory size 0)"], rows)
    )
    return {"passkey": {str(k): v for k, v in results.items()}, "train_accuracy": history, "markdown": markdown}


def main() -> None:
    args = parse_args()
    started = time.perf_counter()
    payload, sections = {"args": vars(args)}, []
    parts = (("overhead", overhead), ("native", native_paths), ("perplexity", perplexity), ("passkey", passkey))
    for part, run in parts:
        if part in args.parts:
            result = run(args)
            sections.append(result.pop("markdown"))
            payload[part] = result
    note = (
        f"Wall time {(time.perf_counter() - started) / 60:.1f} min on a machine shared with other work (2 cores; "
        f"loadavg at the end {loadavg()}): timings are indicative; the ratios come from interleaved rounds."
    )
    name = "memorizing" + "".join(f"_{part}" for part in args.parts) + ("_quick" if args.quick else "")
    write_results(name, payload, "\n\n".join([*sections, note]))


if __name__ == "__main__":
    main()
