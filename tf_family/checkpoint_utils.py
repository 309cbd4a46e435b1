"""Reading another implementation's checkpoint folder and loading renamed weights with key and shape checks.

Used by the converters of the models transformers already ships (``longformer``, ``big_bird``): they translate the
config, rename every tensor with a table of regular expressions, and load through `load_checked_state_dict`, which
refuses a checkpoint that does not fit before touching the model. ``.bin`` files are read only with
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from typing import Any

import torch
from safetensors.torch import load_file
from transformers.utils import cached_file, logging

logger = logging.get_logger(__name__)

HUB_KWARGS = ("cache_dir", "force_download", "local_files_only", "token", "revision", "subfolder", "proxies")


def resolve_file(path: str | os.PathLike, filename: str, hub_kwargs: dict[str, Any]) -> str | None:
    """``filename`` inside a local folder or a cached Hub repository, or ``None``."""
    path = str(path)
    if os.path.isdir(path):
        candidate = os.path.join(path, hub_kwargs.get("subfolder") or "", filename)
        return candidate if os.path.isfile(candidate) else None
    try:
        return cached_file(
            path,
            filename,
            _raise_exceptions_for_missing_entries=False,
            _raise_exceptions_for_connection_errors=False,
            **hub_kwargs,
        )
    except (OSError, ValueError):
        return None


def read_config_dict(path: str | os.PathLike, hub_kwargs: dict[str, Any] | None = None) -> dict | None:
    """The ``config.json`` of a checkpoint as a dict, or ``None`` when there is none."""
    config_file = resolve_file(path, "config.json", hub_kwargs or {})
    if config_file is None:
        return None
    with open(config_file, encoding="utf-8") as handle:
        return json.load(handle)


def read_weights(path: str | os.PathLike, hub_kwargs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint: ``model.safetensors`` (single or sharded) or ``pytorch_model.bin``."""
    single = resolve_file(path, "model.safetensors", hub_kwargs)
    if single is not None:
        return load_file(single)
    index = resolve_file(path, "model.safetensors.index.json", hub_kwargs)
    if index is not None:
        with open(index, encoding="utf-8") as handle:
            shards = sorted(set(json.load(handle)["weight_map"].values()))
        weights = {}
        for shard in shards:
            shard_file = resolve_file(path, shard, hub_kwargs)
            if shard_file is None:
                raise FileNotFoundError(f"Shard {shard} listed in model.safetensors.index.json is missing in {path}.")
            weights.update(load_file(shard_file))
        return weights
    binary = resolve_file(path, "pytorch_model.bin", hub_kwargs)
    if binary is not None:
        return torch.load(binary, map_location="cpu", weights_only=True)  # plain tensors only, nothing executed
    raise FileNotFoundError(f"No model.safetensors or pytorch_model.bin found in {path!s}.")


def rename_keys(
    state_dict: dict[str, torch.Tensor], rules: Iterable[tuple[str, str]], dropped: Iterable[str] = ()
) -> dict[str, torch.Tensor]:
    """Apply the first matching ``(pattern, replacement)`` rule to every key; keys matching a ``dropped`` pattern
    are left out; keys no rule matches are kept as they are (and then reported as unexpected)."""
    rules, dropped = list(rules), [re.compile(pattern) for pattern in dropped]
    renamed = {}
    for key, tensor in state_dict.items():
        if any(pattern.search(key) for pattern in dropped):
            continue
        for pattern, replacement in rules:
            if re.search(pattern, key):
                key = re.sub(pattern, replacement, key)
                break
        renamed[key] = tensor
    return renamed


def load_checked_state_dict(
    model: torch.nn.Module,
    state_dict: dict[str, torch.Tensor],
    base_prefix: str,
    tied: Iterable[str] = (),
    unused: Iterable[str] = ("pooler.",),
) -> None:
    """Load renamed weights into ``model``, checking every key and shape first.

    ``base_prefix`` (``"longformer."``) is added to or removed from the checkpoint's keys so that a headless
    checkpoint loads into a model with a head and the other way round. Keys in ``tied`` may be absent (they are
    tied afterwards). When the checkpoint has another task's head, that head is skipped and the model's head keeps
    its fresh initialisation (with a warning). Body weights under ``unused`` (the pooler, which some heads do not
    have) are dropped when the model lacks them. Anything else missing, unexpected or mis-shaped raises a
    `ValueError` that names the keys, before the model is changed.
    """
    expected = model.state_dict()
    model_has_prefix = any(key.startswith(base_prefix) for key in expected)
    checkpoint_has_prefix = any(key.startswith(base_prefix) for key in state_dict)
    if model_has_prefix and not checkpoint_has_prefix:
        state_dict = {f"{base_prefix}{key}": value for key, value in state_dict.items()}
    elif checkpoint_has_prefix and not model_has_prefix:
        state_dict = {k.removeprefix(base_prefix): v for k, v in state_dict.items() if k.startswith(base_prefix)}
    droppable = tuple(base_prefix + name for name in unused) + tuple(unused)
    state_dict = {k: v for k, v in state_dict.items() if k in expected or not k.startswith(droppable)}
    model_head = {key for key in expected if model_has_prefix and not key.startswith(base_prefix)}
    checkpoint_head = {key for key in state_dict if model_has_prefix and not key.startswith(base_prefix)}
    foreign_head = checkpoint_head - set(expected)
    fresh_head = set()
    if foreign_head:  # another task's head: keep ours fresh
        fresh_head = model_head - set(state_dict)
        state_dict = {key: value for key, value in state_dict.items() if key not in foreign_head}
    tied = set(tied)
    missing = sorted(set(expected) - set(state_dict) - tied - fresh_head)
    # a checkpoint without any head loaded into a model with one: the head starts fresh
    if missing and not checkpoint_head and set(missing) <= model_head:
        fresh_head, missing = set(missing), []
    unexpected = sorted(set(state_dict) - set(expected))
    mis_shaped = sorted(
        f"{key}: checkpoint {tuple(state_dict[key].shape)} vs model {tuple(expected[key].shape)}"
        for key in set(state_dict) & set(expected)
        if state_dict[key].shape != expected[key].shape
    )
    if missing or unexpected or mis_shaped:
        problems = [
            f"{what} {keys}"
            for what, keys in (("missing keys", missing), ("unexpected keys", unexpected), ("mis-shaped", mis_shaped))
            if keys
        ]
        raise ValueError(
            "The checkpoint does not fit the model built from its config: " + "; ".join(problems) + ". Check that "
            "config.json belongs to these weights."
        )
    if foreign_head or fresh_head:
        logger.warning(
            f"Skipped the checkpoint's head ({sorted(foreign_head)}); newly initialised: {sorted(fresh_head)}."
        )
    with torch.no_grad():
        for key, tensor in state_dict.items():
            if key not in tied:
                expected[key].copy_(tensor.to(expected[key].dtype))
    if tied:
        model.tie_weights()


def split_load_kwargs(kwargs: dict[str, Any]) -> tuple[dict[str, Any], Any, Any, dict[str, Any]]:
    """Separate `from_pretrained` keyword arguments into Hub arguments, ``config``, ``dtype`` and config overrides."""
    hub_kwargs = {key: kwargs.pop(key) for key in HUB_KWARGS if key in kwargs}
    config = kwargs.pop("config", None)
    dtype = kwargs.pop("dtype", None) or kwargs.pop("torch_dtype", None)
    for key in [key for key in kwargs if key.startswith("_") or key in ("trust_remote_code", "adapter_kwargs")]:
        kwargs.pop(key)
    if isinstance(dtype, str) and dtype != "auto":
        dtype = getattr(torch, dtype)
    return hub_kwargs, config, dtype if isinstance(dtype, torch.dtype) else None, kwargs


__all__ = [
    "HUB_KWARGS",
    "load_checked_state_dict",
    "read_config_dict",
    "read_weights",
    "rename_keys",
    "resolve_file",
    "split_load_kwargs",
]
