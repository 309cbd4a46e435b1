"""Checkpoints of transformers' own BigBird (model_type ``big_bird``, e.g. ``google/bigbird-roberta-base``).

`TffBigBird*.from_pretrained(folder)` reads such a folder through `tf_family.conversion` with the record
`TRANSFORMERS_BIG_BIRD`: the config is translated to `TffBigBirdConfig` (with ``eval_random_blocks="first_block"``,
which is what transformers computes in eval mode; pass ``eval_random_blocks="same"`` to `from_pretrained` to keep
the training pattern) and every tensor renamed and shape-checked into the tf_family layout.
``tf-family convert big-bird IN OUT`` saves the result in the tf_family format. This module is data: it never
imports the modeling file.
"""

from __future__ import annotations

from typing import Any

from ...conversion import ForeignFormat, copy_config_values
from .configuration_big_bird import TffBigBirdConfig

MODEL_TYPE = "big_bird"

_COPIED_CONFIG_KEYS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "max_position_embeddings",
    "type_vocab_size",
    "initializer_range",
    "layer_norm_eps",
    "use_bias",
    "rescale_embeddings",
    "attention_type",
    "block_size",
    "num_random_blocks",
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "sep_token_id",
    "classifier_dropout",
    "tie_word_embeddings",
    "id2label",
    "label2id",
    "problem_type",
)
# keys that carry nothing tf_family needs (besides every config's bookkeeping)
_IGNORED_CONFIG_KEYS = frozenset(
    {"position_embedding_type", "use_cache", "gradient_checkpointing", "is_decoder", "add_cross_attention"}
)

_KEY_RULES = (
    (r"^(bert\.)?embeddings\.LayerNorm\.", r"\1embeddings.layer_norm."),
    (r"^(bert\.)?encoder\.layer\.(\d+)\.attention\.self\.(query|key|value)\.", r"\1layers.\2.attention.\3."),
    (r"^(bert\.)?encoder\.layer\.(\d+)\.attention\.output\.dense\.", r"\1layers.\2.attention.out_proj."),
    (r"^(bert\.)?encoder\.layer\.(\d+)\.attention\.output\.LayerNorm\.", r"\1layers.\2.attention.layer_norm."),
    (r"^(bert\.)?encoder\.layer\.(\d+)\.intermediate\.dense\.", r"\1layers.\2.feed_forward.fc_in."),
    (r"^(bert\.)?encoder\.layer\.(\d+)\.output\.dense\.", r"\1layers.\2.feed_forward.fc_out."),
    (r"^(bert\.)?encoder\.layer\.(\d+)\.output\.LayerNorm\.", r"\1layers.\2.feed_forward.layer_norm."),
    (r"^cls\.predictions\.transform\.dense\.", "lm_head.dense."),
    (r"^cls\.predictions\.transform\.LayerNorm\.", "lm_head.layer_norm."),
    (r"^cls\.predictions\.decoder\.weight$", "lm_head.decoder.weight"),
    (r"^cls\.predictions\.(decoder\.)?bias$", "lm_head.decoder.bias"),
    (r"^qa_classifier\.intermediate\.dense\.", "qa_head.fc_in."),
    (r"^qa_classifier\.output\.dense\.", "qa_head.fc_out."),
    (r"^qa_classifier\.output\.LayerNorm\.", "qa_head.layer_norm."),
    (r"^qa_classifier\.qa_outputs\.", "qa_head.qa_outputs."),
)
_DROPPED_KEYS = (r"embeddings\.(position_ids|token_type_ids)$",)


def translate_config(values: dict[str, Any], **overrides: Any) -> TffBigBirdConfig:
    """The `TffBigBirdConfig` equivalent to a transformers ``big_bird`` config dict (eval random blocks as
    transformers computes them)."""
    if values.get("is_decoder") or values.get("add_cross_attention"):
        raise NotImplementedError(
            "This big_bird checkpoint is a decoder (is_decoder / add_cross_attention); tf_family's BigBird is an "
            "encoder. Load it with transformers' BigBirdForCausalLM instead."
        )
    kwargs = copy_config_values(values, _COPIED_CONFIG_KEYS, _IGNORED_CONFIG_KEYS, MODEL_TYPE)
    kwargs["eval_random_blocks"] = "first_block"
    return TffBigBirdConfig(**{**kwargs, **overrides})


TRANSFORMERS_BIG_BIRD = ForeignFormat(
    name="big-bird",
    source_model_type=MODEL_TYPE,
    description="a transformers 5 big_bird checkpoint -> tf_family format",
    translate_config=translate_config,
    rename_rules=_KEY_RULES,
    dropped=_DROPPED_KEYS,
    # transformers ties cls.predictions.decoder.bias to cls.predictions.bias; keep one
    aliases=(("cls.predictions.bias", "cls.predictions.decoder.bias"),),
    unused=("pooler.",),
)
# Rename transformers ``big_bird`` tensors to ours.
convert_state_dict = TRANSFORMERS_BIG_BIRD.convert_state_dict

__all__ = ["MODEL_TYPE", "TRANSFORMERS_BIG_BIRD", "convert_state_dict", "translate_config"]
