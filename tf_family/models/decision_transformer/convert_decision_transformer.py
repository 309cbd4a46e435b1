"""Load transformers' ``decision_transformer`` checkpoints (e.g. `edbeeching/decision-transformer-gym-hopper-medium`).

`TffDecisionTransformerModel.from_pretrained(folder)` accepts a folder (or cached Hub id) saved by transformers'
`DecisionTransformerModel`: `translate_config` maps its ``config.json`` to a `TffDecisionTransformerConfig` and
`convert_state_dict` renames and reshapes the weights, key by key and shape by shape:

- GPT-2 `Conv1D` weights are stored ``(in, out)``; ours are `nn.Linear` ``(out, in)``: transposed;
- transformers' GPT-2 adds the position embedding of position 0 to every token (its position ids are all zero);
  that constant goes into the bias of `embed_ln`, which is applied right before it (exact);
- the unused word embedding (``vocab_size`` 1) and the rest of the position table are dropped, as are the causal
  mask buffers older checkpoints saved (``attn.bias``, ``attn.masked_bias``).

The state statistics and the return scale of such a checkpoint live in its model card, not in its config: pass
them as keyword arguments (``state_mean=[...], state_std=[...], return_scale=1000.0, target_return=3600.0``) and
they are stored in the converted config. ``.bin`` weights are read with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import torch
from safetensors.torch import load_file
from transformers.utils import cached_file, logging

from .configuration_decision_transformer import TffDecisionTransformerConfig

logger = logging.get_logger(__name__)

REFERENCE_MODEL_TYPE = "decision_transformer"

_COPIED_CONFIG_KEYS = (
    "state_dim", "act_dim", "hidden_size", "max_ep_len", "action_tanh", "n_layer", "n_head", "n_inner",
    "activation_function", "resid_pdrop", "embd_pdrop", "attn_pdrop", "layer_norm_epsilon", "initializer_range",
)  # fmt: skip
# keys of transformers' config that carry nothing this model needs (GPT-2 text settings, bookkeeping)
_IGNORED_CONFIG_KEYS = {
    "vocab_size", "n_positions", "use_cache", "bos_token_id", "eos_token_id", "pad_token_id", "model_type",
    "architectures", "transformers_version", "torch_dtype", "dtype", "_name_or_path", "return_dict",
    "output_hidden_states", "output_attentions", "reorder_and_upcast_attn", "tie_word_embeddings", "id2label",
    "label2id", "problem_type", "chunk_size_feed_forward", "is_encoder_decoder", "tokenizer_class",
    "max_position_embeddings", "num_attention_heads", "num_hidden_layers", "scale_attn_weights",
    "scale_attn_by_inverse_layer_idx", "add_cross_attention",
}  # fmt: skip
# settings of transformers' GPT-2 this model does not implement, with the value it must have
_REQUIRED_CONFIG_VALUES = {
    "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False,
    "add_cross_attention": False,
}

# (pattern, replacement, transpose): transformers name -> tf_family name
_KEY_RULES = [
    (r"^encoder\.h\.(\d+)\.ln_1\.(weight|bias)$", r"layers.\1.attention_norm.\2", False),
    (r"^encoder\.h\.(\d+)\.ln_2\.(weight|bias)$", r"layers.\1.mlp_norm.\2", False),
    (r"^encoder\.h\.(\d+)\.attn\.c_attn\.weight$", r"layers.\1.attention.qkv.weight", True),
    (r"^encoder\.h\.(\d+)\.attn\.c_attn\.bias$", r"layers.\1.attention.qkv.bias", False),
    (r"^encoder\.h\.(\d+)\.attn\.c_proj\.weight$", r"layers.\1.attention.out_proj.weight", True),
    (r"^encoder\.h\.(\d+)\.attn\.c_proj\.bias$", r"layers.\1.attention.out_proj.bias", False),
    (r"^encoder\.h\.(\d+)\.mlp\.c_fc\.weight$", r"layers.\1.mlp.fc_in.weight", True),
    (r"^encoder\.h\.(\d+)\.mlp\.c_fc\.bias$", r"layers.\1.mlp.fc_in.bias", False),
    (r"^encoder\.h\.(\d+)\.mlp\.c_proj\.weight$", r"layers.\1.mlp.fc_out.weight", True),
    (r"^encoder\.h\.(\d+)\.mlp\.c_proj\.bias$", r"layers.\1.mlp.fc_out.bias", False),
    (r"^encoder\.ln_f\.(weight|bias)$", r"final_norm.\1", False),
    (r"^predict_action\.0\.(weight|bias)$", r"predict_action.\1", False),
    (r"^(embed_timestep|embed_return|embed_state|embed_action|embed_ln)\.(weight|bias)$", r"\1.\2", False),
    (r"^(predict_state|predict_return)\.(weight|bias)$", r"\1.\2", False),
]
_DROPPED_KEYS = re.compile(r"^encoder\.(wte\.weight|h\.\d+\.attn\.(bias|masked_bias))$")
_POSITION_KEY = "encoder.wpe.weight"
_HUB_KWARGS = ("cache_dir", "force_download", "local_files_only", "token", "revision", "subfolder", "proxies")


def _resolve(path: str | os.PathLike, filename: str, hub_kwargs: dict[str, Any]) -> str | None:
    path = str(path)
    if os.path.isdir(path):
        candidate = os.path.join(path, hub_kwargs.get("subfolder") or "", filename)
        return candidate if os.path.isfile(candidate) else None
    return cached_file(
        path,
        filename,
        _raise_exceptions_for_missing_entries=False,
        _raise_exceptions_for_connection_errors=False,
        **hub_kwargs,
    )


def is_reference_checkpoint(path: str | os.PathLike, config: Any = None, **hub_kwargs: Any) -> bool:
    """Whether ``path`` holds a checkpoint of transformers' `DecisionTransformerModel` (or ``config`` is one)."""
    if config is not None and not isinstance(config, (str, os.PathLike)):
        return getattr(config, "model_type", None) == REFERENCE_MODEL_TYPE
    try:
        config_file = _resolve(path, "config.json", hub_kwargs)
    except (OSError, ValueError):
        return False
    if config_file is None:
        return False
    with open(config_file, encoding="utf-8") as handle:
        return json.load(handle).get("model_type") == REFERENCE_MODEL_TYPE


def translate_config(reference: dict[str, Any], **overrides: Any) -> TffDecisionTransformerConfig:
    """The `TffDecisionTransformerConfig` of a transformers ``decision_transformer`` ``config.json`` (as a dict).

    ``overrides`` set what transformers keeps outside the config (``state_mean``, ``state_std``, ``return_scale``,
    ``target_return``, ``context_length``, ``env_id``) or change anything else. Settings of transformers' GPT-2
    that this model does not implement raise `NotImplementedError`; keys it does not know are logged and ignored.
    """
    for key, required in _REQUIRED_CONFIG_VALUES.items():
        if key in reference and bool(reference[key]) != required:
            raise NotImplementedError(
                f"{key}={reference[key]} is not supported by TffDecisionTransformerModel (it implements {key}="
                f"{required}, the setting of every published Decision Transformer checkpoint)."
            )
    unknown = sorted(set(reference) - set(_COPIED_CONFIG_KEYS) - _IGNORED_CONFIG_KEYS)
    if unknown:  # transformers writes generic PreTrainedConfig keys too; none of them changes the computation
        logger.warning(f"Ignored keys of the decision_transformer config.json: {unknown}.")
    kwargs = {key: reference[key] for key in _COPIED_CONFIG_KEYS if key in reference}
    # transformers' embed_ln uses torch's default epsilon, its blocks use layer_norm_epsilon
    if kwargs.get("layer_norm_epsilon", 1e-5) != 1e-5:
        raise NotImplementedError(
            f"layer_norm_epsilon={kwargs['layer_norm_epsilon']}: transformers uses it in the blocks but 1e-5 in "
            "embed_ln; TffDecisionTransformerModel uses one epsilon everywhere, so only 1e-5 converts exactly."
        )
    # transformers' model always has the state and return heads (they are never trained there)
    kwargs.update(predict_state=True, predict_return=True, action_space="continuous")
    return TffDecisionTransformerConfig(**{**kwargs, **overrides})


def convert_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename, transpose and fold transformers' `DecisionTransformerModel` weights into tf_family's layout.

    Unknown names are kept as they are (the loader then reports them as unexpected).
    """
    prefix = "decision_transformer."  # a model saved inside a wrapper keeps its weights under its base prefix
    if any(key.startswith(prefix) for key in state_dict):
        state_dict = {key.removeprefix(prefix): value for key, value in state_dict.items()}
    converted = {}
    for key, tensor in state_dict.items():
        if _DROPPED_KEYS.match(key) or key == _POSITION_KEY:
            continue
        for pattern, replacement, transpose in _KEY_RULES:
            if re.match(pattern, key):
                converted[re.sub(pattern, replacement, key)] = tensor.t().contiguous() if transpose else tensor
                break
        else:
            converted[key] = tensor
    if _POSITION_KEY in state_dict and "embed_ln.bias" in converted:
        # every token gets wpe[0] right after embed_ln: fold it into embed_ln's bias
        converted["embed_ln.bias"] = converted["embed_ln.bias"] + state_dict[_POSITION_KEY][0]
    return converted


def _read_weights(path: str | os.PathLike, hub_kwargs: dict[str, Any]) -> dict[str, torch.Tensor]:
    safetensors_file = _resolve(path, "model.safetensors", hub_kwargs)
    if safetensors_file is not None:
        return load_file(safetensors_file)
    bin_file = _resolve(path, "pytorch_model.bin", hub_kwargs)
    if bin_file is not None:
        # weights_only: plain tensors only, nothing in the file is executed
        return torch.load(bin_file, map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"No model.safetensors or pytorch_model.bin found in {path!s}.")


def load_converted_state_dict(model: torch.nn.Module, state_dict: dict[str, torch.Tensor]) -> None:
    """Copy tf_family-named weights into ``model`` after checking every key and shape; a `ValueError` lists all
    missing, unexpected and mis-shaped keys before anything is copied."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    mis_shaped = sorted(
        f"{key}: checkpoint {tuple(state_dict[key].shape)} vs model {tuple(expected[key].shape)}"
        for key in set(state_dict) & set(expected)
        if state_dict[key].shape != expected[key].shape
    )
    if missing or unexpected or mis_shaped:
        problems = []
        if missing:
            problems.append(f"missing keys {missing}")
        if unexpected:
            problems.append(f"unexpected keys {unexpected}")
        if mis_shaped:
            problems.append(f"mis-shaped tensors {mis_shaped}")
        raise ValueError(
            "The checkpoint does not match the model built from its config: " + "; ".join(problems) + ". Check that "
            "config.json belongs to these weights."
        )
    with torch.no_grad():
        for key, tensor in state_dict.items():
            expected[key].copy_(tensor.to(expected[key].dtype))


def load_reference_checkpoint(cls: type, path: str | os.PathLike, *model_args: Any, **kwargs: Any):
    """Build ``cls`` from a transformers ``decision_transformer`` checkpoint folder or cached Hub id.

    Keyword arguments: the Hub arguments of `from_pretrained` (``cache_dir``, ``revision``, ``local_files_only`` …),
    ``dtype``/``torch_dtype``, ``attn_implementation``, and config overrides (``state_mean``, ``state_std``,
    ``return_scale``, ``target_return``, ``context_length``, ``env_id`` …).
    """
    if model_args:
        raise TypeError(f"load_reference_checkpoint takes no positional model arguments, got {len(model_args)}.")
    hub_kwargs = {key: kwargs.pop(key) for key in _HUB_KWARGS if key in kwargs}
    config = kwargs.pop("config", None)
    dtype = kwargs.pop("dtype", None) or kwargs.pop("torch_dtype", None)
    attn_implementation = kwargs.pop("attn_implementation", None)
    for key in [key for key in kwargs if key.startswith("_") or key in ("trust_remote_code", "adapter_kwargs")]:
        kwargs.pop(key)
    if config is None or isinstance(config, (str, os.PathLike)):
        config_file = _resolve(config or path, "config.json", hub_kwargs)
        if config_file is None:
            raise FileNotFoundError(f"No config.json found in {path!s}.")
        with open(config_file, encoding="utf-8") as handle:
            reference = json.load(handle)
    else:
        reference = config.to_dict()
    tff_config = translate_config(reference, **kwargs)
    if attn_implementation is not None:
        tff_config._attn_implementation = attn_implementation
    tff_config.architectures = [cls.__name__]
    model = cls(tff_config)
    load_converted_state_dict(model, convert_state_dict(_read_weights(path, hub_kwargs)))
    if isinstance(dtype, str) and dtype != "auto":
        dtype = getattr(torch, dtype)
    if isinstance(dtype, torch.dtype):
        model = model.to(dtype)
    return model.eval()


__all__ = [
    "REFERENCE_MODEL_TYPE",
    "convert_state_dict",
    "is_reference_checkpoint",
    "load_converted_state_dict",
    "load_reference_checkpoint",
    "translate_config",
]
