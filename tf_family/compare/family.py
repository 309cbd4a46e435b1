"""Who takes part in `tf-family compare`, read from the registry (`tf_family.registry.ARCHITECTURES`) at run time:
an architecture joins the grid by registering, with no change here.

- causal contestants: every architecture with a ``causal_lm`` model class;
- encoder contestants: every architecture with a ``sequence_classification`` model class that reads both ways (it
  also has a ``masked_lm`` class, or no ``causal_lm`` one);
- groups, for ``--quick``'s subset (`group_of`): the group a config class declares (a ``compare_group``
  attribute), else what a model carries between calls (`ArchSpec.carried_state`: segment memory, compressive
  memory, kNN memory), ``retrieval`` for a model built around a base model's config (a datastore over a trained
  LM), ``adaptive computation`` for a config with exit or halting fields, and ``attention`` for the rest (the
  sparse, hashed, low-rank and kernelised attentions).

The shared shape goes into each architecture's own config fields by the names those fields have (`shape_overrides`),
never by architecture: a width field (``hidden_size``, ``d_model``, ``n_embd``, ``dim``), a depth field, a heads
field, a feed-forward field, position tables, dropout set to 0, lists with one entry per layer resized to the depth,
and the memory, window and bucket fields of the zoo's mechanisms sized from the segment and block.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

WIDTH_FIELDS = ("hidden_size", "d_model", "n_embd", "dim", "d_embed")
DEPTH_FIELDS = ("num_hidden_layers", "n_layer", "num_layers")
HEADS_FIELDS = ("num_attention_heads", "n_head", "num_heads", "num_key_value_heads")
HEAD_WIDTH_FIELDS = ("d_head", "head_dim", "attention_head_size")
FFN_FIELDS = ("intermediate_size", "d_inner", "feed_forward_size", "n_inner", "ffn_dim")
POSITION_FIELDS = ("max_position_embeddings", "n_positions", "max_seq_len", "max_sequence_length")


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


def _even(value: int) -> int:
    return max(2, value // 2 * 2)


def _axial(shape: Shape) -> dict[str, Any]:
    side = 1 << max(1, (shape.max_length - 1).bit_length() // 2)  # axial positions: side x rest >= max_length
    rest = -(-shape.max_length // side)
    return {
        "axial_pos_shape": [side, rest],
        "axial_pos_embds_dim": [shape.width // 2, shape.width - shape.width // 2],
        "max_position_embeddings": side * rest,
    }


# field name -> its value at the shared shape (applied when the architecture's config has the field); the memory,
# window and bucket fields of the zoo's mechanisms, sized from the segment and block as the papers size them
FIELD_RULES: dict[str, Callable[[Shape, Any], Any]] = {
    "mem_len": lambda s, v: s.segment,
    "cmem_len": lambda s, v: s.segment // 2,
    "compression_rate": lambda s, v: 2,
    "knn_memory_size": lambda s, v: s.knn_memory,
    "knn_top_k": lambda s, v: 16,
    "knn_layers": lambda s, v: [max(1, 3 * s.depth // 4)],
    "clamp_len": lambda s, v: s.max_length,
    "pre_lnorm": lambda s, v: True,
    "cutoffs": lambda s, v: [],
    "div_val": lambda s, v: 1,
    "attention_window": lambda s, v: _even(s.block // 4) * 2,
    "attention_dilation": lambda s, v: 1,
    "num_random_blocks": lambda s, v: 2,
    "local_attn_chunk_length": lambda s, v: max(4, s.block // 8),
    "lsh_attn_chunk_length": lambda s, v: max(4, s.block // 8),
    "num_buckets": lambda s, v: None,
    "num_hashes": lambda s, v: 2,
    "axial_norm_std": lambda s, v: 0.02,
    "tie_word_embeddings": lambda s, v: True,
}
# BigBird's block_size is its attention block (the recipes' block is the training length): only where the config
# also has num_random_blocks
BLOCK_SPARSE_RULE = ("block_size", lambda s, v: max(2, s.block // 16))


def _stored_fields(config) -> dict[str, Any]:
    """The fields a config stores (its ``to_dict``), not the aliases of its ``attribute_map``."""
    return config.to_dict()


def shape_overrides(spec, shape: Shape) -> dict[str, Any]:
    """The config fields that give ``spec``'s architecture the shared ``shape`` (dropout-free), found by field
    name in its tiny variant's config."""
    if shape.width % shape.heads:
        raise ValueError(f"width {shape.width} is not divisible by heads {shape.heads}; pick a width that is.")
    tiny = spec.make_config("tiny")
    fields = _stored_fields(tiny)
    depth_before = next((fields[n] for n in DEPTH_FIELDS if isinstance(fields.get(n), int)), None)
    per_layer = [n for n, v in fields.items() if isinstance(v, list | tuple) and v and len(v) == depth_before]
    if depth_before is None and isinstance(fields.get("attn_layers"), list):
        per_layer.append("attn_layers")  # a list of layer kinds is the depth itself
    out: dict[str, Any] = {}
    for names, value in (
        (WIDTH_FIELDS, shape.width),
        (DEPTH_FIELDS, shape.depth),
        (HEADS_FIELDS, shape.heads),
        (HEAD_WIDTH_FIELDS, shape.width // shape.heads),
        (FFN_FIELDS, shape.ffn),
        (POSITION_FIELDS, shape.max_length + 2),
    ):
        out.update({name: value for name in names if name in fields and fields[name] is not None})
    for name, value in fields.items():
        if "dropout" in name and isinstance(value, float):
            out[name] = 0.0
    for name, rule in FIELD_RULES.items():
        if name in fields:
            out[name] = rule(shape, fields[name])
    if "num_random_blocks" in fields and BLOCK_SPARSE_RULE[0] in fields:
        out[BLOCK_SPARSE_RULE[0]] = BLOCK_SPARSE_RULE[1](shape, fields[BLOCK_SPARSE_RULE[0]])
    if "axial_pos_shape" in fields:
        out.update(_axial(shape))
    for name in per_layer:  # one entry per layer: the pattern repeated to the new depth, a rule's scalar for each
        if name in out and isinstance(out[name], list | tuple):
            continue  # a rule gave the whole list (no cutoffs, one kNN layer, the axial shape)
        pattern = [out[name]] if name in out else list(fields[name])
        out[name] = (pattern * shape.depth)[: shape.depth]
    return out


# --------------------------------------------------------------------------------------------------- contestants
def _registry():
    from ..registry import ARCHITECTURES

    return ARCHITECTURES


def wraps_base_config(spec) -> bool:
    """A model built around another model's config (the kNN-LM: a trained LM plus a datastore)."""
    return "base_config" in spec.variants.get("tiny", {})


def causal_archs() -> tuple[str, ...]:
    """Every architecture of the registry with a causal-LM model class, in registry order."""
    return tuple(name for name, spec in _registry().items() if "causal_lm" in spec.model_classes)


def encoder_archs() -> tuple[str, ...]:
    """Every architecture with a sequence-classification model class that reads both ways."""
    out = []
    for name, spec in _registry().items():
        tasks = spec.model_classes
        if "sequence_classification" in tasks and ("masked_lm" in tasks or "causal_lm" not in tasks):
            out.append(name)
    return tuple(out)


ADAPTIVE_FIELD_WORDS = ("exit", "halt")


def group_of(name: str) -> str:
    """The group ``--quick`` draws one model from (module docstring)."""
    spec = _registry()[name]
    declared = getattr(spec.config_class, "compare_group", None)
    if isinstance(declared, str):
        return declared
    if spec.carried_state is not None:
        return spec.carried_state
    if wraps_base_config(spec):
        return "retrieval"
    fields = _stored_fields(spec.make_config("tiny"))
    if any(word in field for field in fields for word in ADAPTIVE_FIELD_WORDS):
        return "adaptive computation"
    return "attention"


def quick_subset(names: tuple[str, ...] | list[str]) -> list[str]:
    """The first model of each group, in registry order (the dense baseline is added by the grid)."""
    seen: set[str] = set()
    chosen = []
    for name in names:
        group = group_of(name)
        if group not in seen:
            seen.add(group)
            chosen.append(name)
    return chosen


__all__ = [
    "FIELD_RULES",
    "Shape",
    "causal_archs",
    "encoder_archs",
    "group_of",
    "quick_subset",
    "shape_overrides",
    "wraps_base_config",
]
