"""Build a CALM model from a transformers Llama checkpoint (the way to turn an existing decoder into an exiting one).

`TffCalmForCausalLM.from_pretrained(llama_folder, first_exit=2, ...)` (or ``tf-family convert calm-llama``) reads a
folder saved by transformers' `LlamaForCausalLM` / `LlamaModel` through `tf_family.conversion` with the record
`TRANSFORMERS_LLAMA`: the module names are Llama's, so the weights load one to one, key by key and shape by shape;
the meta classifier, which Llama has not, starts at zero (confidence 0.5 everywhere until fine-tuned with the
anytime loss: ``recipes/causal_lm.py --model_name_or_path <converted>``). Keyword arguments set CALM's fields
(``first_exit``, ``exit_interval``, ``confidence_measure`` …). Rope scaling and ``pretraining_tp`` other than 1 are
refused. This module is data: it never imports the modeling file.
"""

from __future__ import annotations

from typing import Any

import torch

from ...conversion import ForeignFormat, copy_config_values
from .configuration_calm import TffCalmConfig

REFERENCE_MODEL_TYPE = "llama"

_COPIED_CONFIG_KEYS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps", "attention_bias",
    "attention_dropout", "mlp_bias", "initializer_range", "tie_word_embeddings", "pad_token_id", "bos_token_id",
    "eos_token_id", "use_cache",
)  # fmt: skip
_IGNORED_CONFIG_KEYS = frozenset(
    {"rope_parameters", "rope_theta", "rope_scaling", "pretraining_tp", "id2label", "label2id", "problem_type"}
)


def translate_config(reference: dict[str, Any], **overrides: Any) -> TffCalmConfig:
    """The `TffCalmConfig` of a transformers ``llama`` ``config.json`` (as a dict), with CALM's ``overrides``."""
    rope = dict(reference.get("rope_parameters") or {})
    if reference.get("rope_scaling"):
        rope.update(reference["rope_scaling"])
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise NotImplementedError(f"rope_type={rope_type!r}: TffCalmConfig implements Llama's default rope only.")
    if reference.get("pretraining_tp", 1) != 1:
        raise NotImplementedError(f"pretraining_tp={reference['pretraining_tp']}: only 1 converts.")
    kwargs = copy_config_values(reference, _COPIED_CONFIG_KEYS, _IGNORED_CONFIG_KEYS, REFERENCE_MODEL_TYPE)
    kwargs["rope_base"] = float(rope.get("rope_theta", reference.get("rope_theta", 10000.0)))
    return TffCalmConfig(**{**kwargs, **overrides})


def _add_meta_classifier(
    source: dict[str, torch.Tensor], converted: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Llama has no meta classifier: it starts at zero (a constant confidence of 0.5)."""
    reference = converted.get("lm_head.weight", converted.get("model.embed_tokens.weight"))
    if reference is not None and "meta_classifier.weight" not in converted:
        converted["meta_classifier.weight"] = reference.new_zeros(2, reference.shape[1])
        converted["meta_classifier.bias"] = reference.new_zeros(2)
    return converted


TRANSFORMERS_LLAMA = ForeignFormat(
    name="calm-llama",
    source_model_type=REFERENCE_MODEL_TYPE,
    description="a transformers Llama checkpoint -> a CALM early-exit model (tf_family format)",
    translate_config=translate_config,
    dropped=(r"rotary_emb\.inv_freq$",),
    transform=_add_meta_classifier,
    default_task="causal_lm",
)

__all__ = ["REFERENCE_MODEL_TYPE", "TRANSFORMERS_LLAMA", "translate_config"]
