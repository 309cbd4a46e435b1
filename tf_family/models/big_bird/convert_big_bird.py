"""Load checkpoints of transformers' own BigBird (model_type ``big_bird``, e.g. ``google/bigbird-roberta-base``).

`TffBigBird*.from_pretrained(folder)` calls `load_transformers_big_bird` when the folder's ``config.json`` says
``big_bird``: the config is translated to `TffBigBirdConfig` (with ``eval_random_blocks="first_block"``, which is
what transformers computes in eval mode; pass ``eval_random_blocks="same"`` to `from_pretrained` to keep the training
pattern) and every tensor renamed and shape-checked into the tf_family layout.
``tf-family convert big-bird IN OUT`` saves the result in the tf_family format.
"""

from __future__ import annotations

import os
from typing import Any

from transformers import BigBirdConfig
from transformers.utils import logging

from ...checkpoint_utils import load_checked_state_dict, read_config_dict, read_weights, rename_keys, split_load_kwargs
from .configuration_big_bird import TffBigBirdConfig

logger = logging.get_logger(__name__)

MODEL_TYPE = "big_bird"

_COPIED_CONFIG_KEYS = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act",
    "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings", "type_vocab_size",
    "initializer_range", "layer_norm_eps", "use_bias", "rescale_embeddings", "attention_type", "block_size",
    "num_random_blocks", "pad_token_id", "bos_token_id", "eos_token_id", "sep_token_id", "classifier_dropout",
    "tie_word_embeddings", "id2label", "label2id", "problem_type",
)  # fmt: skip
_IGNORED_CONFIG_KEYS = {
    "model_type", "architectures", "transformers_version", "dtype", "torch_dtype", "_name_or_path",
    "output_attentions", "output_hidden_states", "return_dict", "chunk_size_feed_forward", "is_encoder_decoder",
    "num_labels", "tokenizer_class", "position_embedding_type", "use_cache", "gradient_checkpointing",
    "finetuning_task", "is_decoder", "add_cross_attention",
}  # fmt: skip

_KEY_RULES = [
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
    (r"^classifier\.(dense|out_proj)\.", r"\1."),
    (r"^qa_classifier\.intermediate\.dense\.", "qa_head.fc_in."),
    (r"^qa_classifier\.output\.dense\.", "qa_head.fc_out."),
    (r"^qa_classifier\.output\.LayerNorm\.", "qa_head.layer_norm."),
    (r"^qa_classifier\.qa_outputs\.", "qa_head.qa_outputs."),
]
_DROPPED_KEYS = (r"embeddings\.(position_ids|token_type_ids)$",)


# Copied from tf_family.models.longformer.convert_longformer.is_transformers_longformer with Longformer->BigBird, longformer->big_bird
def is_transformers_big_bird(path: str | os.PathLike, config: Any = None) -> bool:
    """Whether ``path`` (or ``config``) is a checkpoint of transformers' ``big_bird`` model."""
    if config is not None and not isinstance(config, (str, os.PathLike)):
        return isinstance(config, BigBirdConfig)
    values = read_config_dict(path)
    return values is not None and values.get("model_type") == MODEL_TYPE


# Copied from tf_family.models.longformer.convert_longformer._config_kwargs with longformer->big_bird
def _config_kwargs(values: dict[str, Any]) -> dict[str, Any]:
    """The values of a transformers ``big_bird`` config dict that tf_family copies (unknown keys are logged)."""
    unknown = sorted(set(values) - set(_COPIED_CONFIG_KEYS) - _IGNORED_CONFIG_KEYS)
    if unknown:
        logger.warning(f"Ignoring big_bird config keys tf_family does not use: {unknown}.")
    kwargs = {key: values[key] for key in _COPIED_CONFIG_KEYS if key in values}
    if isinstance(kwargs.get("id2label"), dict):
        kwargs["id2label"] = {int(k): v for k, v in kwargs["id2label"].items()}
    return kwargs


def translate_config(values: dict[str, Any], **overrides: Any) -> TffBigBirdConfig:
    """The `TffBigBirdConfig` equivalent to a transformers ``big_bird`` config dict (eval random blocks as
    transformers computes them)."""
    if values.get("is_decoder") or values.get("add_cross_attention"):
        raise NotImplementedError(
            "This big_bird checkpoint is a decoder (is_decoder / add_cross_attention); tf_family's BigBird is an "
            "encoder. Load it with transformers' BigBirdForCausalLM instead."
        )
    kwargs = _config_kwargs(values)
    kwargs["eval_random_blocks"] = "first_block"
    return TffBigBirdConfig(**{**kwargs, **overrides})


def convert_state_dict(state_dict: dict) -> dict:
    """Rename transformers ``big_bird`` tensors to ours."""
    if "cls.predictions.bias" in state_dict:  # transformers ties decoder.bias to it; keep one
        state_dict = {key: value for key, value in state_dict.items() if key != "cls.predictions.decoder.bias"}
    return rename_keys(state_dict, _KEY_RULES, _DROPPED_KEYS)


# Copied from tf_family.models.longformer.convert_longformer.load_transformers_longformer with Longformer->BigBird, longformer->big_bird
def load_transformers_big_bird(cls: type, path: str | os.PathLike, **kwargs: Any):
    """Build ``cls`` from a transformers ``big_bird`` checkpoint folder (or cached Hub id).

    Keyword arguments: ``config`` (a transformers `BigBirdConfig`), ``dtype``, the Hub arguments of
    `from_pretrained`, and `TffBigBirdConfig` overrides (``num_labels=3`` ...).
    """
    hub_kwargs, config, dtype, overrides = split_load_kwargs(dict(kwargs))
    overrides.pop("attn_implementation", None)
    values = config.to_dict() if isinstance(config, BigBirdConfig) else read_config_dict(path, hub_kwargs)
    if values is None:
        raise FileNotFoundError(f"No config.json found in {path!s}.")
    tff_config = translate_config(values, **overrides)
    tff_config.architectures = [cls.__name__]
    model = cls(tff_config)
    tied = set(getattr(model, "_tied_weights_keys", None) or {}) if tff_config.tie_word_embeddings else set()
    state_dict = convert_state_dict(read_weights(path, hub_kwargs))
    load_checked_state_dict(model, state_dict, f"{model.base_model_prefix}.", tied)
    if dtype is not None:
        model = model.to(dtype)
    return model.eval()


# Copied from tf_family.models.longformer.convert_longformer.convert_folder with Longformer->BigBird, longformer->big_bird
def convert_folder(source: str | os.PathLike, output_dir: str | os.PathLike):
    """What ``tf-family convert`` runs: load a transformers ``big_bird`` checkpoint into the tf_family class of
    the same task (from its ``architectures``; the base model otherwise) and save it in the tf_family format."""
    from . import modeling_big_bird

    values = read_config_dict(source)
    if values is None or values.get("model_type") != MODEL_TYPE:
        raise ValueError(f"{source!s} is not a transformers big_bird checkpoint (config.json model_type).")
    architecture = (values.get("architectures") or ["BigBirdModel"])[0]
    cls = getattr(modeling_big_bird, "Tff" + architecture, modeling_big_bird.TffBigBirdModel)
    model = cls.from_pretrained(source)
    model.save_pretrained(output_dir)
    return model


__all__ = ["convert_folder", "convert_state_dict", "is_transformers_big_bird", "load_transformers_big_bird",
           "translate_config"]  # fmt: skip
