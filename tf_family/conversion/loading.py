"""Reading a checkpoint folder written by any code, and checking renamed weights against a model before loading.

Files are found in a local folder or a Hub repository (through transformers' cache, so ``HF_HUB_OFFLINE`` and the
usual Hub arguments apply). Weights are read from ``model.safetensors``, a sharded ``model.safetensors.index.json``,
``pytorch_model.bin`` or a sharded ``pytorch_model.bin.index.json``, in that order; ``.bin`` files only with
``torch.load(weights_only=True)``, so nothing in them is executed. Every shard a manifest names must lie inside the
checkpoint's folder: ``../x`` or an absolute path is refused before anything is read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from safetensors.torch import load_file
from transformers.utils import cached_file, logging

from ..utils.files import read_safetensors_header, resolve_inside

logger = logging.get_logger(__name__)

# `from_pretrained` arguments that say where the files are
HUB_KWARGS = ("cache_dir", "force_download", "local_files_only", "token", "revision", "subfolder", "proxies")
# `from_pretrained` arguments about building and placing the model: handed on to transformers (what is neither one
# of these, a Hub or weight-file argument, nor ``config`` is a config override)
LOAD_KWARGS = frozenset(
    {
        "dtype", "torch_dtype", "device_map", "max_memory", "offload_folder", "offload_buffers", "low_cpu_mem_usage",
        "quantization_config", "output_loading_info", "ignore_mismatched_sizes", "weights_only", "attn_implementation",
        "experts_implementation", "distributed_config", "device_mesh", "tp_plan", "tp_size", "key_mapping",
        "use_kernels", "kernel_config", "allow_all_kernels", "generation_config", "disable_mmap", "fusion_config",
        "tqdm_class", "trust_remote_code", "adapter_kwargs", "adapter_name", "offload_state_dict", "mirror",
    }
)  # fmt: skip
# `from_pretrained` arguments about which weight file to read
FILE_KWARGS = ("variant", "use_safetensors")


def _read_safetensors(path: str) -> dict[str, torch.Tensor]:
    read_safetensors_header(path)  # a truncated or garbled file: a ValueError naming it, not a crash in mmap
    try:
        return load_file(path)
    except Exception as error:  # noqa: BLE001 - safetensors raises its own exception type
        raise ValueError(f"{path} could not be read as safetensors ({type(error).__name__}: {error}).") from error


def _read_torch_bin(path: str) -> dict[str, torch.Tensor]:
    try:
        # weights_only: plain tensors only, nothing in the file is executed
        weights = torch.load(path, "cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - truncated files raise OSError, RuntimeError, EOFError, ...
        raise ValueError(
            f"{path} could not be read as a PyTorch weights file ({type(error).__name__}: {error}); it is truncated, "
            "damaged, or holds more than tensors. Re-download or re-save it."
        ) from error
    if not isinstance(weights, dict) or not all(isinstance(v, torch.Tensor) for v in weights.values()):
        raise ValueError(f"{path} holds a {type(weights).__name__}, not a dict of tensor name -> tensor.")
    return weights


# (single file, manifest of shards, reader); the first one present is read
_WEIGHT_FILES = (
    ("model.safetensors", "model.safetensors.index.json", _read_safetensors),
    ("pytorch_model.bin", "pytorch_model.bin.index.json", _read_torch_bin),
)


def _with_variant(filename: str, variant: str | None) -> str:
    """transformers' variant naming: ``model.safetensors`` -> ``model.fp16.safetensors``,
    ``model.safetensors.index.json`` -> ``model.safetensors.index.fp16.json``."""
    if not variant:
        return filename
    stem, extension = filename.rsplit(".", 1)
    return f"{stem}.{variant}.{extension}"


def resolve_file(path: str | os.PathLike, filename: str, hub_kwargs: Mapping[str, Any]) -> str | None:
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


def read_config_dict(path: str | os.PathLike, hub_kwargs: Mapping[str, Any] | None = None) -> dict | None:
    """The ``config.json`` of a checkpoint as a dict, or ``None`` when there is none."""
    config_file = resolve_file(path, "config.json", hub_kwargs or {})
    if config_file is None:
        return None
    try:
        with open(config_file, encoding="utf-8") as handle:
            values = json.load(handle)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{config_file} is not valid JSON ({error}); re-save the checkpoint's config.") from error
    if not isinstance(values, dict):
        raise ValueError(f"{config_file} holds a {type(values).__name__}, not a JSON object of config fields.")
    return values


def read_manifest(manifest_file: str | os.PathLike) -> list[str]:
    """The shard files a ``*.index.json`` names, each checked to lie inside the manifest's folder.

    A `ValueError` names the manifest and the entry when an entry is absolute, climbs out of the folder (``../x``)
    or is a symlink out of it (`tf_family.utils.files.resolve_inside`): a manifest must not make a loader read files the
    checkpoint does not own. A manifest that is not JSON, or has no ``weight_map``, is a `ValueError` naming it.
    """
    try:
        with open(manifest_file, encoding="utf-8") as handle:
            manifest = json.load(handle)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(
            f"{manifest_file!s} is not a JSON shard manifest ({error}); re-save the checkpoint."
        ) from error
    weight_map = manifest.get("weight_map") if isinstance(manifest, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(name, str) for name in weight_map.values()):
        raise ValueError(
            f"{manifest_file!s} has no 'weight_map' of tensor name -> shard file name; re-save the checkpoint."
        )
    shards = sorted(set(weight_map.values()))
    folder = os.path.dirname(os.path.abspath(manifest_file))
    for shard in shards:
        resolve_inside(folder, shard, manifest_file, what="shard")
    return shards


def read_weights(
    path: str | os.PathLike,
    hub_kwargs: Mapping[str, Any],
    variant: str | None = None,
    use_safetensors: bool | None = None,
) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint: safetensors (single or sharded) first, then ``.bin`` (single or sharded).

    ``variant`` (``"fp16"``) and ``use_safetensors`` (``True``: only safetensors; ``False``: only ``.bin``) mean
    what they mean to `from_pretrained`.
    """
    formats = _WEIGHT_FILES
    if use_safetensors is not None:
        formats = formats[:1] if use_safetensors else formats[1:]
    for single, manifest, reader in formats:
        single_file = resolve_file(path, _with_variant(single, variant), hub_kwargs)
        if single_file is not None:
            return reader(single_file)
        manifest_file = resolve_file(path, _with_variant(manifest, variant), hub_kwargs)
        if manifest_file is None:
            continue
        weights = {}
        for shard in read_manifest(manifest_file):  # shard names are relative to the manifest's folder
            shard_file = resolve_file(path, shard, hub_kwargs)
            if shard_file is None:
                raise FileNotFoundError(f"Shard {shard} listed in {manifest_file!s} is missing in {path!s}.")
            weights.update(reader(shard_file))
        return weights
    names = [_with_variant(name, variant) for single, manifest, _ in formats for name in (single, manifest)]
    raise FileNotFoundError(f"None of {names} found in {path!s}.")


def split_load_kwargs(
    kwargs: Mapping[str, Any],
) -> tuple[dict[str, Any], dict[str, Any], Any, dict[str, Any], dict[str, Any]]:
    """`from_pretrained` keyword arguments by what they are for: Hub arguments (`HUB_KWARGS`), weight-file
    arguments (`FILE_KWARGS`), ``config``, model building and placing (`LOAD_KWARGS` and transformers' private
    ``_from_auto``-like flags), and what is left: config overrides."""
    kwargs = dict(kwargs)
    hub_kwargs = {key: kwargs.pop(key) for key in HUB_KWARGS if key in kwargs}
    file_kwargs = {key: kwargs.pop(key) for key in FILE_KWARGS if key in kwargs}
    config = kwargs.pop("config", None)
    load_kwargs = {key: kwargs.pop(key) for key in list(kwargs) if key in LOAD_KWARGS or key.startswith("_")}
    return hub_kwargs, file_kwargs, config, load_kwargs, kwargs


def check_state_dict(
    model: torch.nn.Module,
    state_dict: Mapping[str, torch.Tensor],
    base_prefix: str,
    tied: Iterable[str] = (),
    unused: Iterable[str] = (),
) -> dict[str, torch.Tensor]:
    """The part of renamed weights that ``model`` loads, after checking every key and shape.

    ``model`` may live on the meta device: only its state-dict names and shapes are read. ``base_prefix``
    (``"longformer."``) is added to or removed from the checkpoint's keys so that a headless checkpoint loads into a
    model with a head and the other way round. Keys in ``tied`` may be absent (they are tied after loading) and are
    left out. When the checkpoint has another task's head, that head is skipped and the model's head keeps its
    fresh initialisation (with a warning); a checkpoint with no head at all gives a model with a head a fresh one.
    Body weights under ``unused`` (``"pooler."``, which some heads do not have) are dropped when the model lacks
    them, and start fresh (with a warning) when the checkpoint lacks them. Anything else missing, unexpected or mis-shaped raises a `ValueError` that names the keys.
    """
    expected = {key: tensor.shape for key, tensor in model.state_dict().items()}
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
    # body weights under ``unused`` that the checkpoint lacks (a masked-LM folder has no pooler): they start fresh
    fresh_unused = {key for key in missing if key.startswith(droppable)}
    fresh_head, missing = fresh_head | fresh_unused, [key for key in missing if key not in fresh_unused]
    unexpected = sorted(set(state_dict) - set(expected))
    mis_shaped = sorted(
        f"{key}: checkpoint {tuple(state_dict[key].shape)} vs model {tuple(expected[key])}"
        for key in set(state_dict) & set(expected)
        if state_dict[key].shape != expected[key]
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
    return {key: value for key, value in state_dict.items() if key not in tied}


__all__ = [
    "FILE_KWARGS",
    "HUB_KWARGS",
    "LOAD_KWARGS",
    "check_state_dict",
    "read_config_dict",
    "read_manifest",
    "read_weights",
    "resolve_file",
    "split_load_kwargs",
]
