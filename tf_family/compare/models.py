"""The contestants of `tf-family compare`: one shared shape (width, depth, heads, feed-forward width) written into
each architecture's own config fields, the dense baselines (transformers' `LlamaForCausalLM` with SDPA for the causal
section, `RobertaForSequenceClassification` for the encoders) sized to the family's parameter count, and the calls
that train them with the existing recipes (``recipes/causal_lm.py``, ``recipes/knn_lm.py``,
``recipes/sequence_classification.py``)."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

from ..data import SOTU_TOKENIZER_DIR
from ..registry import get_arch
from ..spec import carried_state

# the causal architectures of the family, in the order the report lists them; the dense baseline comes first
CAUSAL_ARCHS = ("transfo_xl", "compressive", "memorizing", "longformer", "reformer", "knn_lm", "calm")
ENCODER_ARCHS = ("longformer", "big_bird", "reformer")
BASELINE = "dense_llama"
ENCODER_BASELINE = "dense_roberta"
# what each model carries or reads at inference ("its best inference setting")
INFERENCE_SETTING = {
    "transfo_xl": "segment memory carried through the document",
    "compressive": "memory and compressed memory carried through the document",
    "memorizing": "XL memory and kNN memory of the whole document carried",
    "longformer": "sliding windows of its training length (stride half of it)",
    "reformer": "sliding windows of its training length (stride half of it)",
    "knn_lm": "the baseline's weights + a datastore of training tokens, sliding windows",
    "calm": "full depth (no exit), sliding windows of its training length",
    BASELINE: "sliding windows of its training length (stride half of it)",
}


@dataclass(frozen=True)
class Shape:
    """The one shape every contestant is built with (its own field names differ)."""

    width: int
    depth: int
    heads: int
    ffn: int
    max_length: int  # longest input any measurement feeds (positions tables are sized to it)
    segment: int  # memory models: tokens per segment (the memory holds as many)
    block: int  # models without memory: tokens per training block
    knn_memory: int  # Memorizing Transformer: kNN entries per row and head in training


def _window(block: int, share: int) -> int:
    return max(2, block // share // 2 * 2)  # even, at least 2


def arch_overrides(arch: str, shape: Shape) -> dict[str, Any]:
    """The config fields that give ``arch`` the shared shape (and a causal, dropout-free setting)."""
    width, depth, heads, ffn = shape.width, shape.depth, shape.heads, shape.ffn
    if width % heads:
        raise ValueError(f"width {width} is not divisible by heads {heads}; pick a width that is.")
    if arch in ("transfo_xl", "compressive", "memorizing"):
        xl = {
            "d_model": width, "d_embed": width, "n_head": heads, "d_head": width // heads, "d_inner": ffn,
            "n_layer": depth, "mem_len": shape.segment, "cutoffs": [], "div_val": 1, "dropout": 0.0,
            "clamp_len": shape.max_length, "pre_lnorm": True,
        }  # fmt: skip
        if arch == "compressive":
            xl.update(cmem_len=shape.segment // 2, compression_rate=2)
        if arch == "memorizing":
            xl.update(knn_layers=[max(1, 3 * depth // 4)], knn_memory_size=shape.knn_memory, knn_top_k=16)
        return xl
    if arch == "longformer":
        return {
            "hidden_size": width, "num_hidden_layers": depth, "num_attention_heads": heads, "intermediate_size": ffn,
            "attention_window": _window(shape.block, 4) * 2, "max_position_embeddings": shape.max_length + 2,
            "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
        }  # fmt: skip
    if arch == "big_bird":
        return {
            "hidden_size": width, "num_hidden_layers": depth, "num_attention_heads": heads, "intermediate_size": ffn,
            "block_size": max(2, shape.block // 16), "num_random_blocks": 2,
            "max_position_embeddings": shape.max_length + 2, "hidden_dropout_prob": 0.0,
            "attention_probs_dropout_prob": 0.0,
        }  # fmt: skip
    if arch == "reformer":
        side = 1 << max(1, (shape.max_length - 1).bit_length() // 2)  # axial positions: side x rest >= max_length
        rest = -(-shape.max_length // side)
        chunk = max(4, shape.block // 8)
        return {
            "hidden_size": width, "attn_layers": (["local", "lsh"] * depth)[:depth], "num_attention_heads": heads,
            "attention_head_size": width // heads, "feed_forward_size": ffn, "local_attn_chunk_length": chunk,
            "lsh_attn_chunk_length": chunk, "num_hashes": 2, "num_buckets": None, "axial_pos_shape": [side, rest],
            "axial_pos_embds_dim": [width // 2, width - width // 2], "max_position_embeddings": side * rest,
            "hidden_dropout_prob": 0.0, "local_attention_probs_dropout_prob": 0.0,
            "lsh_attention_probs_dropout_prob": 0.0, "axial_norm_std": 0.02,
        }  # fmt: skip
    if arch == "calm":
        return {
            "hidden_size": width, "num_hidden_layers": depth, "num_attention_heads": heads,
            "num_key_value_heads": heads, "intermediate_size": ffn, "max_position_embeddings": shape.max_length,
            "tie_word_embeddings": True,  # as the others: untied, its output layer alone was 80 % of the baseline
        }  # fmt: skip
    raise ValueError(f"compare has no shape for --archs {arch!r}; causal: {CAUSAL_ARCHS}, encoders: {ENCODER_ARCHS}.")


def override_arguments(overrides: dict[str, Any]) -> list[str]:
    """``--config_overrides`` KEY=VALUE words (values as JSON) for the recipes."""
    return [f"{key}={json.dumps(value)}" for key, value in overrides.items()]


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


def family_parameters(archs: list[str], shape: Shape, vocab_size: int, extra: dict[str, dict]) -> dict[str, int]:
    """Parameter count of each causal architecture at ``shape`` (built on the meta device: no memory, no time);
    an architecture whose config is refused is left out."""
    counts = {}
    for arch in archs:
        if arch == "knn_lm":
            continue  # the baseline's own weights plus a datastore
        spec = get_arch(arch)
        try:
            with torch.device("meta"):
                config = spec.make_config(
                    "tiny", vocab_size=vocab_size, **{**arch_overrides(arch, shape), **extra.get(arch, {})}
                )
                counts[arch] = count_parameters(spec.model_classes["causal_lm"](config))
        except (ValueError, TypeError):
            continue  # a config refused: that model's own training cell records the error
    return counts


def llama_config(shape: Shape, vocab_size: int, target: int | None, separator_id: int):
    """A `LlamaConfig` of the shared width and depth whose parameter count is nearest ``target`` (the family's
    median), by its feed-forward width and whether it ties its output layer to its embeddings."""
    from transformers import LlamaConfig, LlamaForCausalLM

    def make(ffn: int, tie: bool):
        return LlamaConfig(
            vocab_size=vocab_size, hidden_size=shape.width, num_hidden_layers=shape.depth,
            num_attention_heads=shape.heads, num_key_value_heads=shape.heads, intermediate_size=ffn,
            max_position_embeddings=shape.max_length, tie_word_embeddings=tie, bos_token_id=separator_id,
            eos_token_id=separator_id, pad_token_id=separator_id, attn_implementation="sdpa",
        )  # fmt: skip

    if target is None:
        return make(shape.ffn, True)
    best = None
    for tie in (True, False):
        for ffn in range(8, 8 * shape.ffn + 1, 8):
            with torch.device("meta"):
                count = count_parameters(LlamaForCausalLM(make(ffn, tie)))
            if best is None or abs(count - target) < abs(best[0] - target):
                best = (count, ffn, tie)
    return make(best[1], best[2])


def save_dense_baseline(folder: Path, shape: Shape, target: int | None, seed: int) -> int:
    """Write a freshly initialised `LlamaForCausalLM` (SDPA) and the bundled tokenizer to ``folder`` for the
    causal-LM recipe's ``--model_name_or_path``; returns its parameter count."""
    from transformers import LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(SOTU_TOKENIZER_DIR)
    separator = tokenizer.eos_token_id
    torch.manual_seed(seed)
    model = LlamaForCausalLM(llama_config(shape, len(tokenizer), target, separator))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return count_parameters(model)


def save_roberta_baseline(folder: Path, shape: Shape, num_labels: int, max_length: int, seed: int) -> int:
    """A freshly initialised `RobertaForSequenceClassification` (SDPA) of the shared shape, with the tokenizer the
    encoder recipes build (bundled BPE plus <cls>, <sep>), for ``--model_name_or_path``."""
    import argparse

    from transformers import RobertaConfig, RobertaForSequenceClassification

    from ..training import encoder

    tokenizer = encoder.load_tokenizer(argparse.Namespace(tokenizer_name=None, model_name_or_path=None, arch="x"))
    ids = encoder.token_ids(tokenizer)
    config = RobertaConfig(
        vocab_size=len(tokenizer), hidden_size=shape.width, num_hidden_layers=shape.depth,
        num_attention_heads=shape.heads, intermediate_size=shape.ffn, max_position_embeddings=max_length + 2 + 1,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=num_labels,
        attn_implementation="sdpa", type_vocab_size=1, **ids,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = RobertaForSequenceClassification(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return count_parameters(model)


@contextlib.contextmanager
def quiet():
    """Run a recipe without its progress bars and info logs on the terminal (the grid has its own bar)."""
    previous = os.environ.get("TQDM_DISABLE")
    os.environ["TQDM_DISABLE"] = "1"
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        root.setLevel(level)
        if previous is None:
            os.environ.pop("TQDM_DISABLE", None)
        else:
            os.environ["TQDM_DISABLE"] = previous


def median(values) -> int | None:
    values = list(values)
    return int(statistics.median(values)) if values else None


def has_memory(model) -> bool:
    return carried_state(model) is not None


__all__ = [
    "BASELINE",
    "CAUSAL_ARCHS",
    "ENCODER_ARCHS",
    "ENCODER_BASELINE",
    "INFERENCE_SETTING",
    "Shape",
    "arch_overrides",
    "asdict",
    "count_parameters",
    "family_parameters",
    "has_memory",
    "llama_config",
    "median",
    "override_arguments",
    "quiet",
    "save_dense_baseline",
    "save_roberta_baseline",
]
