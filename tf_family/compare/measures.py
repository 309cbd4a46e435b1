"""What `tf-family compare` measures on a trained model, each a function returning plain numbers:

1. `perplexity_by_position`: perplexity per position bucket on held-out long documents, each model at its own best
   inference setting (memory models carry their memory through the document; the others read sliding windows of
   their training length, half of each window scored, so every scored token sees at least half a window);
2. `passkey_accuracy`: a key of five digits planted in real text, asked for ``distance`` tokens later; the trained
   language model is then trained on the task (the same steps and samples for every model, at every distance of
   the grid, inside and beyond a dense model's window) and scored by teacher-forced digit accuracy on new samples.
   A model without memory reads the last ``window`` tokens of a sample (its training length): beyond that distance
   the key is out of its sight, and chance is what it can score;
3. ``cost`` (its own module, run in a child process so that peak memory is the model's alone).

`perplexity_rows` and `passkey_rows` run them on one trained model of a grid and return result rows.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ..modeling.losses import IGNORE_INDEX
from ..training.language_modeling import start_memory
from .models import has_memory
from .presets import passkey_train_distances
from .rows import row

KEY_LENGTH = 5
QUESTION = " What is the pass key? The pass key is"
CHANCE = 1 / 9  # a digit 1-9


def bucket_edges(first: int, length: int) -> list[int]:
    """Position bucket edges 0, first, 2 first, 4 first, ... up to ``length`` (the last bucket ends at it)."""
    edges = [0]
    edge = first
    while edge < length:
        edges.append(edge)
        edge *= 2
    return [*edges, length]


def bucket_label(low: int, high: int) -> str:
    def short(n: int) -> str:
        return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)

    return f"{short(low)}-{short(high)}"


def _next_token_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(B, T) NLL of ``targets`` (log-softmax is idempotent: adaptive-softmax log-probabilities work too)."""
    return -torch.log_softmax(logits.float(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def _memory_nll(model, ids: torch.Tensor, segment: int) -> torch.Tensor:
    """Per-position NLL (B, T - 1) reading ``ids`` in segments with the model's memory carried (a kNN memory large
    enough for the whole document)."""
    memory = start_memory(model, ids.shape[0], ids.shape[1])
    pieces = []
    for start in range(0, ids.shape[1] - 1, segment):
        chunk = ids[:, start : start + segment + 1]
        out = model(input_ids=chunk[:, :-1], mems=memory)
        memory = out.mems
        pieces.append(_next_token_nll(out.logits, chunk[:, 1:]))
    return torch.cat(pieces, dim=1).cpu()


def _window_nll(model, ids: torch.Tensor, window: int) -> torch.Tensor:
    """Per-position NLL (B, T - 1) reading sliding windows of ``window`` tokens with stride ``window // 2``: the
    first window scores all its positions, each later one its second half."""
    length = ids.shape[1]
    nll = torch.zeros(ids.shape[0], length - 1)
    stride = max(1, window // 2)
    start = 0
    scored_to = 0  # positions < scored_to have their NLL
    while scored_to < length - 1:
        chunk = ids[:, start : start + window + 1]
        logits = model(input_ids=chunk[:, :-1]).logits
        values = _next_token_nll(logits, chunk[:, 1:])  # (B, n)
        first = scored_to - start
        nll[:, scored_to : start + values.shape[1]] = values[:, first:].cpu()
        scored_to = start + values.shape[1]
        start += stride
    return nll


def perplexity_by_position(
    model, documents: Sequence[Sequence[int]], edges: list[int], segment: int, window: int
) -> dict[str, float]:
    """Perplexity of each position bucket over ``documents`` (all of length ``edges[-1]`` + 1 tokens), plus
    ``overall``. ``segment``: memory models' segment; ``window``: the others' sliding window."""
    ids = torch.tensor([list(doc) for doc in documents], device=model.device)
    model.eval()
    with torch.no_grad():
        nll = _memory_nll(model, ids, segment) if has_memory(model) else _window_nll(model, ids, window)
    result = {}
    for low, high in zip(edges, edges[1:], strict=False):
        result[bucket_label(low, high)] = math.exp(nll[:, low:high].mean().item())
    result["overall"] = math.exp(nll.mean().item())
    return result


# ---------------------------------------------------------------------------------------------------------- passkey
def passkey_sample(tokenizer, filler: list[int], distance: int, generator: torch.Generator):
    """A key of five distinct digits 1-9 (one token each in the bundled tokenizer) in an introduction, ``distance``
    tokens of real text, the question and the answer; labels (aligned: the next token) score the answer only."""
    digits = (torch.randperm(9, generator=generator)[:KEY_LENGTH] + 1).tolist()
    key = " ".join(str(d) for d in digits)
    intro = tokenizer(f" The pass key is {key}. Remember it. ", add_special_tokens=False)["input_ids"]
    if len(filler) <= distance:
        raise ValueError(f"the passkey filler holds {len(filler)} tokens; distance {distance} needs more text.")
    start = int(torch.randint(0, len(filler) - distance, (1,), generator=generator))
    question = tokenizer(QUESTION, add_special_tokens=False)["input_ids"]
    answer = tokenizer(f" {key}", add_special_tokens=False)["input_ids"]
    if len(answer) != KEY_LENGTH:
        raise ValueError(f"the tokenizer splits the key {key!r} into {len(answer)} tokens, not one per digit.")
    ids = intro + filler[start : start + distance] + question + answer
    labels = [IGNORE_INDEX] * (len(ids) - len(answer)) + answer
    return ids, labels[1:] + [IGNORE_INDEX]


def _batch(samples, keep: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad in front to one length (the answers line up at the end); ``keep``: only the last ``keep`` tokens."""
    length = max(len(ids) for ids, _ in samples)
    ids = torch.tensor([[0] * (length - len(i)) + i for i, _ in samples])
    labels = torch.tensor([[IGNORE_INDEX] * (length - len(t)) + t for _, t in samples])
    if keep is not None and length > keep:
        ids, labels = ids[:, -keep:], labels[:, -keep:]
    return ids, labels


def _takes(model, name: str) -> bool:
    """Whether ``model``'s forward names the argument ``name`` (not just ``**kwargs``)."""
    return name in inspect.signature(model.forward).parameters


def _passkey_step(model, samples, segment: int, window: int, optimizer=None, **call) -> tuple[int, int]:
    """One batch: loss on the answer tokens (and an optimizer step when given); returns (correct, scored). ``call``:
    extra arguments of the model's forward."""
    memory_model = has_memory(model)
    ids, labels = _batch(samples, None if memory_model else window)
    ids, labels = ids.to(model.device), labels.to(model.device)
    pieces = [(s, s + segment) for s in range(0, ids.shape[1], segment)] if memory_model else [(0, ids.shape[1])]
    memory = start_memory(model, ids.shape[0], ids.shape[1]) if memory_model else None
    # the answers end every row (`_batch` pads in front): a model that can project only the last positions onto the
    # vocabulary (transformers' ``logits_to_keep``) does so, the same loss at a fraction of the vocabulary's cost
    keep = 0 if memory_model or not _takes(model, "logits_to_keep") else KEY_LENGTH + 1
    if keep and (labels[:, :-keep] != IGNORE_INDEX).any():
        raise RuntimeError(f"a passkey answer starts more than {keep} tokens before the end of its row.")
    correct = scored = 0
    for low, high in pieces:
        kwargs = {"mems": memory, **call} if memory_model else {**call, **({"logits_to_keep": keep} if keep else {})}
        with torch.set_grad_enabled(optimizer is not None):
            out = model(input_ids=ids[:, low:high], **kwargs)
        if memory_model:
            memory = out.mems
        target = labels[:, low:high][:, -keep:] if keep else labels[:, low:high]
        counted = target != IGNORE_INDEX
        if not counted.any():
            continue
        logits = out.logits[counted]  # (N, V): the scored positions only
        if optimizer is not None:
            F.cross_entropy(torch.log_softmax(logits.float(), -1), target[counted]).backward()
        correct += int((logits.argmax(-1) == target[counted]).sum())
        scored += int(counted.sum())
    if optimizer is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
    return correct, scored


def passkey_accuracy(
    model,
    tokenizer,
    filler: list[int],
    distances: list[int],
    segment: int,
    window: int,
    settings: dict,
    train_distances: list[int] | None = None,
) -> dict[str, float]:
    """Fine-tune ``model`` on passkey samples at random ``train_distances`` (default: ``distances``; ``settings``:
    steps, batch, learning_rate, eval_samples, seed, and optionally ``train_call``, extra forward arguments for the
    training steps only, e.g. `RETRIEVAL_OFF`), then return the digit accuracy at each of ``distances``."""
    generator = torch.Generator().manual_seed(settings["seed"])
    train_distances = list(distances if train_distances is None else train_distances)
    if settings["steps"]:
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=settings["learning_rate"])
        for _ in range(settings["steps"]):
            distance = train_distances[int(torch.randint(len(train_distances), (1,), generator=generator))]
            samples = [passkey_sample(tokenizer, filler, distance, generator) for _ in range(settings["batch"])]
            _passkey_step(model, samples, segment, window, optimizer, **settings.get("train_call", {}))
    model.eval()
    test = torch.Generator().manual_seed(settings["seed"] + 1)
    result = {}
    with torch.no_grad():
        for distance in distances:
            samples = [passkey_sample(tokenizer, filler, distance, test) for _ in range(settings["eval_samples"])]
            correct = scored = 0
            for i in range(0, len(samples), settings["batch"]):
                c, s = _passkey_step(model, samples[i : i + settings["batch"]], segment, window)
                correct, scored = correct + c, scored + s
            result[str(distance)] = correct / max(scored, 1)
    return result


# A model built around the dense baseline (the kNN-LM: its LM plus a datastore) trains its LM alone, as the paper
# does (Khandelwal et al. 2020 train the LM, then add the datastore; a frozen datastore has nothing to learn), and
# is scored with retrieval on. Its forward's per-call weight of the kNN distribution, 0: the LM alone.
RETRIEVAL_OFF = {"lmbda": 0.0}


# ------------------------------------------------------------------------------------------------------ grid cells
def perplexity_rows(grid, model: str, seed: int) -> list[dict]:
    """Perplexity by position of ``model`` (trained with ``seed``) on the grid's held-out documents."""
    documents = grid.data.eval_documents()
    length = len(documents[0]) - 1
    edges = bucket_edges(grid.settings["first_bucket"], length)
    result = perplexity_by_position(
        grid.load(model, seed), documents, edges, grid.settings["segment"], grid.settings["block"]
    )
    return [
        row("causal", model, "perplexity by position", value, setting=bucket, documents=len(documents), seed=seed)
        for bucket, value in result.items()
    ]


UNIGRAM = "unigram"  # the reference row of the perplexity table: the add-one unigram model of the training tokens


def unigram_rows(grid) -> list[dict]:
    """Perplexity by position of the unigram model on the grid's held-out documents: the floor to beat."""
    documents = grid.data.eval_documents()
    length = len(documents[0]) - 1
    log_probs = grid.data.unigram_log_probs()
    targets = torch.tensor([list(doc[1:]) for doc in documents])
    nll = -log_probs[targets].float()  # (B, T - 1)
    result = {}
    edges = bucket_edges(grid.settings["first_bucket"], length)
    for low, high in zip(edges, edges[1:], strict=False):
        result[bucket_label(low, high)] = math.exp(nll[:, low:high].mean().item())
    result["overall"] = math.exp(nll.mean().item())
    return [
        row("causal", UNIGRAM, "perplexity by position", value, setting=bucket, documents=len(documents))
        for bucket, value in result.items()
    ]


def passkey_rows(grid, model: str, seed: int) -> list[dict]:
    """Passkey accuracy of ``model`` (trained with ``seed``) at each distance of the grid, after its task training."""
    settings = grid.settings
    task = {
        "steps": settings["passkey_steps"],
        "batch": settings["passkey_batch"],
        "learning_rate": settings["passkey_learning_rate"],
        "eval_samples": settings["passkey_eval_samples"],
        "seed": seed,
        "train_call": RETRIEVAL_OFF if grid.wraps_baseline(model) else {},
    }
    result = passkey_accuracy(
        grid.load(model, seed),
        grid.data.tokenizer,
        grid.data.filler(),
        settings["passkey_distances"],
        settings["segment"],
        settings["block"],
        task,
        passkey_train_distances(settings),
    )
    return [
        row("causal", model, "passkey accuracy", value, setting=f"distance {distance}", seed=seed)
        for distance, value in result.items()
    ]


__all__ = [
    "CHANCE",
    "UNIGRAM",
    "KEY_LENGTH",
    "bucket_edges",
    "bucket_label",
    "passkey_accuracy",
    "passkey_rows",
    "RETRIEVAL_OFF",
    "passkey_sample",
    "perplexity_by_position",
    "perplexity_rows",
    "unigram_rows",
]
