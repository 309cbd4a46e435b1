"""Load checkpoints of transformers' own Longformer (model_type ``longformer``, e.g. ``allenai/longformer-base-4096``).

`TffLongformer*.from_pretrained(folder)` calls `load_transformers_longformer` when the folder's ``config.json`` says
``longformer``: the config is translated to `TffLongformerConfig` and every tensor renamed (and shape-checked) into
the tf_family layout; config fields passed to `from_pretrained` (``attention_mode="sparse"``) override the translated
ones. ``tf-family convert longformer IN OUT`` saves the result in the tf_family format.
"""

from __future__ import annotations

import os
from typing import Any

from transformers import LongformerConfig
from transformers.utils import logging

from ...checkpoint_utils import load_checked_state_dict, read_config_dict, read_weights, rename_keys, split_load_kwargs
from .configuration_longformer import TffLongformerConfig

logger = logging.get_logger(__name__)

MODEL_TYPE = "longformer"

_COPIED_CONFIG_KEYS = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act",
    "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings", "type_vocab_size",
    "initializer_range", "layer_norm_eps", "attention_window", "pad_token_id", "bos_token_id", "eos_token_id",
    "sep_token_id", "tie_word_embeddings", "id2label", "label2id", "problem_type", "classifier_dropout",
)  # fmt: skip
# keys that carry nothing tf_family needs (bookkeeping, or settings with one fixed meaning here)
_IGNORED_CONFIG_KEYS = {
    "model_type", "architectures", "transformers_version", "dtype", "torch_dtype", "onnx_export", "_name_or_path",
    "output_attentions", "output_hidden_states", "return_dict", "chunk_size_feed_forward", "is_encoder_decoder",
    "num_labels", "tokenizer_class", "position_embedding_type", "use_cache", "gradient_checkpointing",
    "ignore_attention_mask", "attention_mode", "finetuning_task", "is_decoder", "add_cross_attention",
}  # fmt: skip

_KEY_RULES = [
    (r"^(longformer\.|roberta\.)?embeddings\.LayerNorm\.", r"\1embeddings.layer_norm."),
    (r"^(longformer\.|roberta\.)?encoder\.layer\.(\d+)\.attention\.self\.(query|key|value)_global\.",
     r"\1layers.\2.attention.global_\3."),
    (r"^(longformer\.|roberta\.)?encoder\.layer\.(\d+)\.attention\.self\.(query|key|value)\.",
     r"\1layers.\2.attention.\3."),
    (r"^(longformer\.|roberta\.)?encoder\.layer\.(\d+)\.attention\.output\.dense\.", r"\1layers.\2.attention.out_proj."),
    (r"^(longformer\.|roberta\.)?encoder\.layer\.(\d+)\.attention\.output\.LayerNorm\.",
     r"\1layers.\2.attention.layer_norm."),
    (r"^(longformer\.|roberta\.)?encoder\.layer\.(\d+)\.intermediate\.dense\.", r"\1layers.\2.feed_forward.fc_in."),
    (r"^(longformer\.|roberta\.)?encoder\.layer\.(\d+)\.output\.dense\.", r"\1layers.\2.feed_forward.fc_out."),
    (r"^(longformer\.|roberta\.)?encoder\.layer\.(\d+)\.output\.LayerNorm\.", r"\1layers.\2.feed_forward.layer_norm."),
    (r"^(longformer\.|roberta\.)?pooler\.dense\.", r"\1pooler."),
    (r"^lm_head\.bias$", "lm_head.decoder.bias"),
    (r"^classifier\.(dense|out_proj)\.", r"\1."),
]  # fmt: skip
_DROPPED_KEYS = (r"embeddings\.position_ids$",)


def is_transformers_longformer(path: str | os.PathLike, config: Any = None) -> bool:
    """Whether ``path`` (or ``config``) is a checkpoint of transformers' ``longformer`` model."""
    if config is not None and not isinstance(config, (str, os.PathLike)):
        return isinstance(config, LongformerConfig)
    values = read_config_dict(path)
    return values is not None and values.get("model_type") == MODEL_TYPE


def _config_kwargs(values: dict[str, Any]) -> dict[str, Any]:
    """The values of a transformers ``longformer`` config dict that tf_family copies (unknown keys are logged)."""
    unknown = sorted(set(values) - set(_COPIED_CONFIG_KEYS) - _IGNORED_CONFIG_KEYS)
    if unknown:
        logger.warning(f"Ignoring longformer config keys tf_family does not use: {unknown}.")
    kwargs = {key: values[key] for key in _COPIED_CONFIG_KEYS if key in values}
    if isinstance(kwargs.get("id2label"), dict):
        kwargs["id2label"] = {int(k): v for k, v in kwargs["id2label"].items()}
    return kwargs


def translate_config(values: dict[str, Any], **overrides: Any) -> TffLongformerConfig:
    """The `TffLongformerConfig` equivalent to a transformers ``longformer`` config dict."""
    return TffLongformerConfig(**{**_config_kwargs(values), **overrides})


def convert_state_dict(state_dict: dict) -> dict:
    """Rename transformers ``longformer`` tensors (or the original allenai ``roberta.``-prefixed ones) to ours."""
    if "lm_head.bias" in state_dict:  # transformers ties lm_head.decoder.bias to lm_head.bias; keep one
        state_dict = {key: value for key, value in state_dict.items() if key != "lm_head.decoder.bias"}
    renamed = rename_keys(state_dict, _KEY_RULES, _DROPPED_KEYS)
    return {
        ("longformer." + k.removeprefix("roberta.") if k.startswith("roberta.") else k): v for k, v in renamed.items()
    }


def load_transformers_longformer(cls: type, path: str | os.PathLike, **kwargs: Any):
    """Build ``cls`` from a transformers ``longformer`` checkpoint folder (or cached Hub id).

    Keyword arguments: ``config`` (a transformers `LongformerConfig`), ``dtype``, the Hub arguments of
    `from_pretrained`, and `TffLongformerConfig` overrides (``num_labels=3`` ...).
    """
    hub_kwargs, config, dtype, overrides = split_load_kwargs(dict(kwargs))
    overrides.pop("attn_implementation", None)
    values = config.to_dict() if isinstance(config, LongformerConfig) else read_config_dict(path, hub_kwargs)
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


__all__ = [
    "convert_folder",
    "convert_state_dict",
    "is_transformers_longformer",
    "load_transformers_longformer",
    "translate_config",
]


def convert_folder(source: str | os.PathLike, output_dir: str | os.PathLike):
    """What ``tf-family convert`` runs: load a transformers ``longformer`` checkpoint into the tf_family class of
    the same task (from its ``architectures``; the base model otherwise) and save it in the tf_family format."""
    from . import modeling_longformer

    values = read_config_dict(source)
    if values is None or values.get("model_type") != MODEL_TYPE:
        raise ValueError(f"{source!s} is not a transformers longformer checkpoint (config.json model_type).")
    architecture = (values.get("architectures") or ["LongformerModel"])[0]
    cls = getattr(modeling_longformer, "Tff" + architecture, modeling_longformer.TffLongformerModel)
    model = cls.from_pretrained(source)
    model.save_pretrained(output_dir)
    return model
