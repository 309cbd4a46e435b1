"""Checkpoints of transformers' own Longformer (model_type ``longformer``, e.g. ``allenai/longformer-base-4096``).

`TffLongformer*.from_pretrained(folder)` reads such a folder through `tf_family.conversion` with the record
`TRANSFORMERS_LONGFORMER`: the config is translated to `TffLongformerConfig` and every tensor renamed (and
shape-checked) into the tf_family layout; config fields passed to `from_pretrained` (``attention_mode="sparse"``)
override the translated ones. ``tf-family convert longformer IN OUT`` saves the result in the tf_family format.
This module is data: it never imports the modeling file.
"""

from __future__ import annotations

from typing import Any

from ...conversion import ForeignFormat, copy_config_values
from .configuration_longformer import TffLongformerConfig

MODEL_TYPE = "longformer"

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
    "attention_window",
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "sep_token_id",
    "tie_word_embeddings",
    "id2label",
    "label2id",
    "problem_type",
    "classifier_dropout",
)
# keys that carry nothing tf_family needs (besides every config's bookkeeping), or settings with one fixed meaning
# here
_IGNORED_CONFIG_KEYS = frozenset(
    {
        "onnx_export",
        "position_embedding_type",
        "use_cache",
        "gradient_checkpointing",
        "ignore_attention_mask",
        "attention_mode",
        "is_decoder",
        "add_cross_attention",
    }
)

_KEY_RULES = (
    (r"^(longformer\.)?embeddings\.LayerNorm\.", r"\1embeddings.layer_norm."),
    (r"^(longformer\.)?encoder\.layer\.(\d+)\.attention\.self\.(query|key|value)_global\.",
     r"\1layers.\2.attention.global_\3."),
    (r"^(longformer\.)?encoder\.layer\.(\d+)\.attention\.self\.(query|key|value)\.",
     r"\1layers.\2.attention.\3."),
    (r"^(longformer\.)?encoder\.layer\.(\d+)\.attention\.output\.dense\.", r"\1layers.\2.attention.out_proj."),
    (r"^(longformer\.)?encoder\.layer\.(\d+)\.attention\.output\.LayerNorm\.",
     r"\1layers.\2.attention.layer_norm."),
    (r"^(longformer\.)?encoder\.layer\.(\d+)\.intermediate\.dense\.", r"\1layers.\2.feed_forward.fc_in."),
    (r"^(longformer\.)?encoder\.layer\.(\d+)\.output\.dense\.", r"\1layers.\2.feed_forward.fc_out."),
    (r"^(longformer\.)?encoder\.layer\.(\d+)\.output\.LayerNorm\.", r"\1layers.\2.feed_forward.layer_norm."),
    (r"^(longformer\.)?pooler\.dense\.", r"\1pooler."),
    (r"^lm_head\.bias$", "lm_head.decoder.bias"),
)  # fmt: skip
_DROPPED_KEYS = (r"embeddings\.position_ids$",)


def translate_config(values: dict[str, Any], **overrides: Any) -> TffLongformerConfig:
    """The `TffLongformerConfig` equivalent to a transformers ``longformer`` config dict."""
    kwargs = copy_config_values(values, _COPIED_CONFIG_KEYS, _IGNORED_CONFIG_KEYS, MODEL_TYPE)
    option = overrides.get("position_embedding_type", "absolute")
    if option != "absolute":  # the checkpoint's weights are a learned absolute table
        raise ValueError(
            f"position_embedding_type={option!r} cannot load a transformers Longformer checkpoint: its weights hold "
            "learned absolute positions; leave position_embedding_type='absolute'."
        )
    return TffLongformerConfig(**{**kwargs, **overrides})


TRANSFORMERS_LONGFORMER = ForeignFormat(
    name="longformer",
    source_model_type=MODEL_TYPE,
    description="a transformers 5 longformer checkpoint -> tf_family format",
    translate_config=translate_config,
    rename_rules=_KEY_RULES,
    dropped=_DROPPED_KEYS,
    # the original allenai checkpoints keep the body under "roberta."
    renamed_prefixes=(("roberta.", "longformer."),),
    # transformers ties lm_head.decoder.bias to lm_head.bias; keep one
    aliases=(("lm_head.bias", "lm_head.decoder.bias"),),
    unused=("pooler.",),
)
# Rename transformers ``longformer`` tensors (or the original allenai ``roberta.``-prefixed ones) to ours.
convert_state_dict = TRANSFORMERS_LONGFORMER.convert_state_dict

__all__ = ["MODEL_TYPE", "TRANSFORMERS_LONGFORMER", "convert_state_dict", "translate_config"]
