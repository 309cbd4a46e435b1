"""Load the Transformer-XL checkpoints transformers dropped (model_type ``transfo-xl``, saved by 4.x).

transformers 5 no longer knows ``transfo-xl``, so ``transfo-xl/transfo-xl-wt103`` and every fine-tuned copy stopped
loading. tf_family registers the type again: `TffTransfoXLLegacyConfig` reads the 4.x ``config.json`` and
`load_legacy_checkpoint` translates config and weights (key by key, shape by shape) into the tf_family model.
``.bin`` weights are read only with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import torch
from safetensors.torch import load_file
from transformers import PreTrainedConfig
from transformers.utils import cached_file, logging

from .configuration_transfo_xl import TffTransfoXLConfig

logger = logging.get_logger(__name__)

LEGACY_MODEL_TYPE = "transfo-xl"

# 4.x config keys -> tf_family field (same name unless listed); keys in _IGNORED_KEYS carry no information we need.
_RENAMED_CONFIG_KEYS = {"n_token": "vocab_size"}
_COPIED_CONFIG_KEYS = (
    "vocab_size", "cutoffs", "d_model", "d_embed", "n_head", "d_head", "d_inner", "div_val", "pre_lnorm", "n_layer",
    "mem_len", "clamp_len", "same_length", "untie_r", "dropout", "dropatt", "init_std", "proj_init_std",
    "layer_norm_epsilon", "eos_token_id", "bos_token_id", "pad_token_id", "tie_word_embeddings", "id2label",
    "label2id", "problem_type",
)  # fmt: skip
_IGNORED_KEYS = {
    "adaptive", "init", "init_range", "architectures", "torch_dtype", "dtype", "transformers_version", "model_type",
    "tie_projs", "proj_share_all_but_first", "attn_type", "sample_softmax", "_name_or_path", "output_attentions",
    "output_hidden_states", "return_dict", "use_return_dict", "tokenizer_class", "num_labels",
}  # fmt: skip

# 4.x parameter name (without the "transformer." prefix of the LM head model) -> tf_family name
_KEY_RULES = [
    (r"^word_emb\.emb_layers\.(\d+)\.weight$", r"word_embeddings.layers.\1.weight"),
    (r"^word_emb\.emb_projs\.(\d+)$", r"word_embeddings.projections.\1"),
    (r"^layers\.(\d+)\.dec_attn\.qkv_net\.weight$", r"layers.\1.attention.qkv.weight"),
    (r"^layers\.(\d+)\.dec_attn\.r_net\.weight$", r"layers.\1.attention.position_proj.weight"),
    (r"^layers\.(\d+)\.dec_attn\.o_net\.weight$", r"layers.\1.attention.out_proj.weight"),
    (r"^layers\.(\d+)\.dec_attn\.layer_norm\.(weight|bias)$", r"layers.\1.attention.layer_norm.\2"),
    (r"^layers\.(\d+)\.dec_attn\.r_w_bias$", r"layers.\1.attention.content_bias"),
    (r"^layers\.(\d+)\.dec_attn\.r_r_bias$", r"layers.\1.attention.position_bias"),
    (r"^layers\.(\d+)\.pos_ff\.CoreNet\.0\.(weight|bias)$", r"layers.\1.feed_forward.fc_in.\2"),
    (r"^layers\.(\d+)\.pos_ff\.CoreNet\.3\.(weight|bias)$", r"layers.\1.feed_forward.fc_out.\2"),
    (r"^layers\.(\d+)\.pos_ff\.layer_norm\.(weight|bias)$", r"layers.\1.feed_forward.layer_norm.\2"),
    (r"^r_w_bias$", "content_bias"),
    (r"^r_r_bias$", "position_bias"),
]
_HEAD_RULES = [
    (r"^crit\.cluster_(weight|bias)$", r"lm_head.cluster_\1"),
    (r"^crit\.out_layers\.(\d+)\.(weight|bias)$", r"lm_head.out_layers.\1.\2"),
    (r"^crit\.out_projs\.(\d+)$", r"lm_head.projections.\1"),
]
_DROPPED_KEYS = re.compile(r"^(transformer\.)?pos_emb\.inv_freq$")  # a buffer 4.x saved; recomputed here
_HUB_KWARGS = ("cache_dir", "force_download", "local_files_only", "token", "revision", "subfolder", "proxies")


class TffTransfoXLLegacyConfig(PreTrainedConfig):
    """The ``config.json`` of a transformers 4.x TransfoXL checkpoint, kept as written (its keys are foreign to
    tf_family, so none is refused here); `to_tff_config` checks and translates it."""

    model_type = LEGACY_MODEL_TYPE

    def to_tff_config(self, **overrides: Any) -> TffTransfoXLConfig:
        """The equivalent `TffTransfoXLConfig`; raises `NotImplementedError` for 4.x settings we do not implement."""
        legacy = self.to_dict()
        if legacy.get("attn_type", 0) != 0:
            raise NotImplementedError(
                f"attn_type={legacy['attn_type']} is not supported: only attn_type=0 (the paper's relative attention, "
                "the only type transformers 4.x implemented) is."
            )
        if legacy.get("sample_softmax", -1) > 0:
            raise NotImplementedError(
                f"sample_softmax={legacy['sample_softmax']} is not supported (4.x did not implement it either); use "
                "sample_softmax=-1."
            )
        values = {_RENAMED_CONFIG_KEYS.get(key, key): value for key, value in legacy.items()}
        kwargs = {key: values[key] for key in _COPIED_CONFIG_KEYS if key in values}
        tie_projs = legacy.get("tie_projs")
        if tie_projs is not None and len(tie_projs) > 1:
            if tie_projs[0] or len(set(tie_projs[1:])) != 1:
                raise NotImplementedError(
                    f"tie_projs={tie_projs} cannot be expressed: tf_family ties either all tail projections or none "
                    "(proj_share_all_but_first) and never the head cluster's."
                )
            kwargs["proj_share_all_but_first"] = bool(tie_projs[1])
        elif "proj_share_all_but_first" in legacy:
            kwargs["proj_share_all_but_first"] = bool(legacy["proj_share_all_but_first"])
        kwargs.setdefault("tie_word_embeddings", True)
        if self._attn_implementation is not None:
            kwargs["attn_implementation"] = self._attn_implementation
        return TffTransfoXLConfig(**{**kwargs, **overrides})


def _resolve(path: str | os.PathLike, filename: str, hub_kwargs: dict[str, Any]) -> str | None:
    path = str(path)
    if os.path.isdir(path):
        subfolder = hub_kwargs.get("subfolder") or ""
        candidate = os.path.join(path, subfolder, filename)
        return candidate if os.path.isfile(candidate) else None
    return cached_file(
        path,
        filename,
        _raise_exceptions_for_missing_entries=False,
        _raise_exceptions_for_connection_errors=False,
        **hub_kwargs,
    )


def is_legacy_checkpoint(path: str | os.PathLike, config: Any = None, **hub_kwargs: Any) -> bool:
    """Whether ``path`` holds a transformers 4.x ``transfo-xl`` checkpoint (or ``config`` says so)."""
    if config is not None and not isinstance(config, (str, os.PathLike)):
        return isinstance(config, TffTransfoXLLegacyConfig)
    try:
        config_file = _resolve(path, "config.json", hub_kwargs)
    except (OSError, ValueError):
        return False
    if config_file is None:
        return False
    with open(config_file, encoding="utf-8") as handle:
        return json.load(handle).get("model_type") == LEGACY_MODEL_TYPE


def convert_legacy_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename 4.x TransfoXL parameters to tf_family names. Unknown names are kept as they are (and then reported
    as unexpected by the loader)."""
    converted = {}
    for key, tensor in state_dict.items():
        if _DROPPED_KEYS.match(key):
            continue
        new_key = key
        body = key.removeprefix("transformer.")
        prefix = "transformer." if key.startswith("transformer.") else ""
        for pattern, replacement in _KEY_RULES:
            if re.match(pattern, body):
                new_key = prefix + re.sub(pattern, replacement, body)
                break
        else:
            for pattern, replacement in _HEAD_RULES:
                if re.match(pattern, key):
                    new_key = re.sub(pattern, replacement, key)
                    break
        converted[new_key] = tensor
    return converted


def _read_weights(path: str | os.PathLike, hub_kwargs: dict[str, Any]) -> dict[str, torch.Tensor]:
    safetensors_file = _resolve(path, "model.safetensors", hub_kwargs)
    if safetensors_file is not None:
        return load_file(safetensors_file)
    bin_file = _resolve(path, "pytorch_model.bin", hub_kwargs)
    if bin_file is not None:
        # weights_only: plain tensors only, nothing in the file is executed
        return torch.load(bin_file, map_location="cpu", weights_only=True)
    raise FileNotFoundError(
        f"No model.safetensors or pytorch_model.bin found in {path!s}; a transfo-xl checkpoint needs one of them."
    )


def _align_prefix(state_dict: dict[str, torch.Tensor], model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A headless 4.x `TransfoXLModel` saves without the ``transformer.`` prefix; a headless target has none."""
    model_has_prefix = any(key.startswith("transformer.") for key in model.state_dict())
    checkpoint_has_prefix = any(key.startswith("transformer.") for key in state_dict)
    if model_has_prefix and not checkpoint_has_prefix:
        return {(key if key.startswith("lm_head.") else f"transformer.{key}"): v for key, v in state_dict.items()}
    if checkpoint_has_prefix and not model_has_prefix:
        return {key.removeprefix("transformer."): v for key, v in state_dict.items() if not key.startswith("lm_head.")}
    return state_dict


def load_converted_state_dict(model: torch.nn.Module, state_dict: dict[str, torch.Tensor]) -> None:
    """Load tf_family-named weights into ``model``, checking every key and shape first.

    Tied parameters may be absent from the checkpoint (they are tied afterwards). Anything else missing, any
    unexpected key and any shape mismatch raises a `ValueError` that lists the offending keys, before the model is
    touched. Head weights of another task (loading a language model into a classifier) are the one exception:
    the checkpoint's head is skipped and the new head keeps its fresh initialisation, with a warning.
    """
    state_dict = _align_prefix(state_dict, model)
    expected = model.state_dict()
    has_lm_head = hasattr(model, "lm_head")
    tied_targets, foreign_head, new_head = set(), set(), set()
    if has_lm_head:
        tied_targets = set(model.get_expanded_tied_weights_keys(all_submodels=True))
    else:  # another task's head: skip the checkpoint's LM head, keep the fresh one
        foreign_head = {key for key in state_dict if key.startswith("lm_head.")}
        if any(key.startswith("transformer.") for key in expected):
            new_head = {key for key in expected if not key.startswith("transformer.")}
    missing = sorted(set(expected) - set(state_dict) - tied_targets - new_head)
    unexpected = sorted(set(state_dict) - set(expected) - foreign_head)
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
    if foreign_head or (new_head - set(state_dict)):
        logger.warning(
            f"Skipped the checkpoint's language-model head ({len(foreign_head)} tensors); newly initialised: "
            f"{sorted(new_head - set(state_dict))}."
        )
    with torch.no_grad():
        for key, tensor in state_dict.items():
            if key in expected and key not in tied_targets:
                expected[key].copy_(tensor.to(expected[key].dtype))
    if has_lm_head:
        model.tie_weights()


def load_legacy_checkpoint(cls: type, path: str | os.PathLike, *model_args: Any, **kwargs: Any):
    """Build ``cls`` (or the tf_family class it stands for) from a 4.x ``transfo-xl`` checkpoint folder or Hub id.

    Keyword arguments: ``config`` (a `TffTransfoXLLegacyConfig`), ``dtype``/``torch_dtype``, the Hub arguments of
    `from_pretrained` (``cache_dir``, ``revision``, ``token``, ``local_files_only``, ``subfolder`` …), and config
    overrides such as ``mem_len=640`` or ``attn_implementation="eager"``.
    """
    if model_args:
        raise TypeError(f"load_legacy_checkpoint takes no positional model arguments, got {len(model_args)}.")
    target = getattr(cls, "_tff_class", cls)
    hub_kwargs = {key: kwargs.pop(key) for key in _HUB_KWARGS if key in kwargs}
    config = kwargs.pop("config", None)
    dtype = kwargs.pop("dtype", None) or kwargs.pop("torch_dtype", None)
    for key in [key for key in kwargs if key.startswith("_") or key in ("trust_remote_code", "adapter_kwargs")]:
        kwargs.pop(key)
    if not isinstance(config, TffTransfoXLLegacyConfig):
        config_file = _resolve(path, "config.json", hub_kwargs)
        if config_file is None:
            raise FileNotFoundError(f"No config.json found in {path!s}.")
        config = TffTransfoXLLegacyConfig.from_json_file(config_file)
    attn_implementation = kwargs.pop("attn_implementation", None)
    tff_config = config.to_tff_config(**kwargs)
    if attn_implementation is not None:
        tff_config._attn_implementation = attn_implementation
    tff_config.architectures = [target.__name__]
    state_dict = convert_legacy_state_dict(_read_weights(path, hub_kwargs))
    model = target(tff_config)
    load_converted_state_dict(model, state_dict)
    if isinstance(dtype, str) and dtype != "auto":
        dtype = getattr(torch, dtype)
    if isinstance(dtype, torch.dtype):
        model = model.to(dtype)
    return model.eval()


__all__ = [
    "LEGACY_MODEL_TYPE",
    "TffTransfoXLLegacyConfig",
    "convert_legacy_state_dict",
    "is_legacy_checkpoint",
    "load_converted_state_dict",
    "load_legacy_checkpoint",
]
