"""Checkpoints of transformers' own Reformer (model_type ``reformer``: ``google/reformer-enwik8``,
``google/reformer-crime-and-punishment``, transformers 4.x and 5.x key layouts).

`TffReformer*.from_pretrained(folder)` reads such a folder through `tf_family.conversion` with the record
`TRANSFORMERS_REFORMER`: the config is translated to `TffReformerConfig` (with ``chunk_wrap_around=True``, so outputs
reproduce transformers'; pass ``chunk_wrap_around=False`` to `from_pretrained` for the clean chunking) and every
tensor renamed and shape-checked. The output head's bias is loaded and applied: ``lm_head.decoder.bias`` where the folder has it (what
transformers 4.x (tied to ``lm_head.bias``) and 5.24+ apply), else ``lm_head.bias`` (a 5.23 folder: 5.23 saved that
bias but never added it, so it holds its initial value unless the folder came from elsewhere).
``tf-family convert reformer IN OUT`` saves the result in the tf_family format. This module is data: it never
imports the modeling file.
"""

from __future__ import annotations

from typing import Any

from transformers.utils import logging

from ...conversion import ForeignFormat, copy_config_values
from .configuration_reformer import TffReformerConfig

logger = logging.get_logger(__name__)

MODEL_TYPE = "reformer"

_COPIED_CONFIG_KEYS = (
    "vocab_size",
    "hidden_size",
    "attn_layers",
    "num_attention_heads",
    "attention_head_size",
    "feed_forward_size",
    "hidden_act",
    "hidden_dropout_prob",
    "lsh_attention_probs_dropout_prob",
    "local_attention_probs_dropout_prob",
    "lsh_attn_chunk_length",
    "lsh_num_chunks_before",
    "lsh_num_chunks_after",
    "local_attn_chunk_length",
    "local_num_chunks_before",
    "local_num_chunks_after",
    "num_hashes",
    "num_buckets",
    "axial_pos_shape",
    "axial_pos_embds_dim",
    "axial_norm_std",
    "max_position_embeddings",
    "chunk_size_lm_head",
    "chunk_size_feed_forward",
    "layer_norm_eps",
    "initializer_range",
    "pad_token_id",
    "eos_token_id",
    "bos_token_id",
    "tie_word_embeddings",
    "id2label",
    "label2id",
    "problem_type",
    "classifier_dropout",
)
# translated below, or settings with one fixed meaning here
_IGNORED_CONFIG_KEYS = frozenset(
    {
        "hash_seed",
        "is_decoder",
        "axial_pos_embds",
        "use_cache",
        "num_hidden_layers",
        "add_cross_attention",
        "target_mapping",
    }
)

_LAYER = r"^(reformer\.)?encoder\.layers\.(\d+)\."
_KEY_RULES = (
    (_LAYER + r"attention\.layer_norm\.", r"\1layers.\2.attention.layer_norm."),
    (_LAYER + r"attention\.self_attention\.(query_key|query|key|value)\.", r"\1layers.\2.attention.\3."),
    (_LAYER + r"attention\.output\.dense\.", r"\1layers.\2.attention.output."),
    (_LAYER + r"feed_forward\.layer_norm\.", r"\1layers.\2.feed_forward.layer_norm."),
    (_LAYER + r"feed_forward\.dense\.dense\.", r"\1layers.\2.feed_forward.fc_in."),
    (_LAYER + r"feed_forward\.output\.dense\.", r"\1layers.\2.feed_forward.fc_out."),
    (r"^(reformer\.)?encoder\.layer_norm\.", r"\1layer_norm."),
    (r"^lm_head\.bias$", "lm_head.decoder.bias"),
)


def translate_config(values: dict[str, Any], **overrides: Any) -> TffReformerConfig:
    """The `TffReformerConfig` equivalent to a transformers ``reformer`` config dict."""
    kwargs = copy_config_values(values, _COPIED_CONFIG_KEYS, _IGNORED_CONFIG_KEYS, MODEL_TYPE)
    if isinstance(kwargs.get("num_buckets"), tuple):
        kwargs["num_buckets"] = list(kwargs["num_buckets"])
    hash_seed = values.get("hash_seed")
    if hash_seed is None:
        logger.warning("The reformer config has hash_seed=None (random rotations every call); using hash_seed=0.")
    kwargs.update(
        hash_seed=0 if hash_seed is None else hash_seed,
        causal=bool(values.get("is_decoder", False)),
        position_embedding_type="axial" if values.get("axial_pos_embds", True) else "absolute",
        chunk_wrap_around=True,
    )
    return TffReformerConfig(**{**kwargs, **overrides})


TRANSFORMERS_REFORMER = ForeignFormat(
    name="reformer",
    source_model_type=MODEL_TYPE,
    description="a transformers reformer checkpoint (4.x or 5.x) -> tf_family format",
    translate_config=translate_config,
    rename_rules=_KEY_RULES,
    # 4.x ties lm_head.decoder.bias to lm_head.bias and saves both; 5.24+ saves both and applies only the decoder's
    aliases=(("lm_head.decoder.bias", "lm_head.bias"),),
    default_task="causal_lm",
)
# Rename transformers ``reformer`` tensors to ours.
convert_state_dict = TRANSFORMERS_REFORMER.convert_state_dict

__all__ = ["MODEL_TYPE", "TRANSFORMERS_REFORMER", "convert_state_dict", "translate_config"]
