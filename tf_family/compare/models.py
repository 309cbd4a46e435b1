"""The contestants of `tf-family compare`: one shared shape (width, depth, heads, feed-forward width) written into
each architecture's own config fields, the dense baselines (transformers' `LlamaForCausalLM` with SDPA for the causal
section, `RobertaForSequenceClassification` for the encoders) sized to the family's parameter count, and the calls
that train them with the existing recipes (``recipes/causal_lm.py``, ``recipes/knn_lm.py``,
``recipes/sequence_classification.py``)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

from ..data import SOTU_TOKENIZER_DIR
from ..registry import get_arch
from ..spec import carried_state
from .family import Shape, shape_overrides, wraps_base_config

BASELINE = "dense_llama"
ENCODER_BASELINE = "dense_roberta"
# how each kind of model reads a long document at inference ("its best inference setting")
MEMORY_SETTING = {
    "segment_memory": "segment memory carried through the document",
    "compressive_memory": "memory and compressed memory carried through the document",
    "knn_memory": "XL memory and kNN memory of the whole document carried",
}
WINDOW_SETTING = "sliding windows of its training length (stride half of it)"
RETRIEVAL_SETTING = "the baseline's weights + a datastore of training tokens, sliding windows"


def inference_setting(model: str) -> str:
    """How ``model`` reads a held-out document in the perplexity measure."""
    from ..registry import ARCHITECTURES

    spec = ARCHITECTURES.get(model)
    if spec is None:
        return WINDOW_SETTING
    if spec.carried_state is not None:
        return MEMORY_SETTING.get(spec.carried_state, "its memory carried through the document")
    if wraps_base_config(spec):
        return RETRIEVAL_SETTING
    return WINDOW_SETTING


def arch_overrides(arch: str, shape: Shape) -> dict[str, Any]:
    """The config fields that give ``arch`` the shared shape (and a dropout-free setting): `shape_overrides`."""
    return shape_overrides(get_arch(arch), shape)


def override_arguments(overrides: dict[str, Any]) -> list[str]:
    """``--config_overrides`` KEY=VALUE words (values as JSON) for the recipes."""
    return [f"{key}={json.dumps(value)}" for key, value in overrides.items()]


def flags(options: dict[str, Any]) -> list[str]:
    """``{"--name": value}`` as the words of a command line."""
    return [word for name, value in options.items() for word in (name, str(value))]


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


def family_parameters(archs: list[str], shape: Shape, vocab_size: int, extra: dict[str, dict]) -> dict[str, int]:
    """Parameter count of each causal architecture at ``shape`` (built on the meta device: no memory, no time);
    an architecture whose config is refused is left out."""
    counts = {}
    for arch in archs:
        spec = get_arch(arch)
        if wraps_base_config(spec):
            continue  # the baseline's own weights plus a datastore
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
            vocab_size=vocab_size,
            hidden_size=shape.width,
            num_hidden_layers=shape.depth,
            num_attention_heads=shape.heads,
            num_key_value_heads=shape.heads,
            intermediate_size=ffn,
            max_position_embeddings=shape.max_length,
            tie_word_embeddings=tie,
            bos_token_id=separator_id,
            eos_token_id=separator_id,
            pad_token_id=separator_id,
            attn_implementation="sdpa",
        )

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


def save_roberta_baseline(
    folder: Path, shape: Shape, num_labels: int, max_length: int, seed: int, tokenizer_name: str | None = None
) -> int:
    """A freshly initialised `RobertaForSequenceClassification` (SDPA) of the shared shape, with the tokenizer the
    encoder recipes build (``tokenizer_name``, default the bundled BPE, plus <cls>, <sep>), for
    ``--model_name_or_path``."""
    import argparse

    from transformers import RobertaConfig, RobertaForSequenceClassification

    from ..training import encoder

    namespace = argparse.Namespace(tokenizer_name=tokenizer_name, model_name_or_path=None, arch="x")
    tokenizer = encoder.load_tokenizer(namespace)
    ids = encoder.token_ids(tokenizer)
    config = RobertaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.width,
        num_hidden_layers=shape.depth,
        num_attention_heads=shape.heads,
        intermediate_size=shape.ffn,
        max_position_embeddings=max_length + 2 + 1,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=num_labels,
        attn_implementation="sdpa",
        type_vocab_size=1,
        **ids,
    )
    torch.manual_seed(seed)
    model = RobertaForSequenceClassification(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return count_parameters(model)


def median(values) -> int | None:
    values = list(values)
    return int(statistics.median(values)) if values else None


def has_memory(model) -> bool:
    return carried_state(model) is not None


__all__ = [
    "BASELINE",
    "ENCODER_BASELINE",
    "Shape",
    "arch_overrides",
    "count_parameters",
    "family_parameters",
    "flags",
    "has_memory",
    "inference_setting",
    "llama_config",
    "median",
    "override_arguments",
    "save_dense_baseline",
    "save_roberta_baseline",
]
