"""Checkpoints saved by other code: one record per source format, one loader, one ``from_pretrained`` hook.

A `ForeignFormat` says how a folder written by another implementation (transformers' own Longformer, BigBird and
Decision Transformer; transformers 4.x TransfoXL) becomes a tf_family model: the ``model_type`` its ``config.json``
carries, how that config translates, and how its tensors are renamed, dropped, transposed or folded. Each model
folder declares its records in ``convert_<arch>.py`` (data and small tensor functions; it never imports the modeling
file) and lists them once, in its `ArchSpec` (``foreign``). Every tf_family model class inherits the one
``from_pretrained`` override, `tf_family.modeling.pretrained.TffPreTrainedModel.from_pretrained`: it checks a local
folder's files, loads a folder of one of the formats its architecture declares (`declared_formats`) through
`load_foreign`, hands every other folder to transformers, then runs the class's ``_finish_loading`` step (kNN-LM
attaches its datastore there).
`load_foreign` translates the config, renames the weights, checks every key and shape against the model, then loads
through `PreTrainedModel.from_pretrained` itself (``state_dict=``), so its keyword arguments (``dtype``,
``device_map``, ``attn_implementation``, ``output_loading_info`` …) mean what they always mean.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedConfig, PreTrainedModel
from transformers.utils import logging

from ..utils.files import atomic_update_dir
from .loading import HUB_KWARGS, check_state_dict, read_config_dict, read_weights, split_load_kwargs

logger = logging.get_logger(__name__)

# keys every transformers config.json may carry that say nothing about the architecture (``num_labels`` follows
# from ``id2label``)
BOOKKEEPING_CONFIG_KEYS = frozenset(
    {
        "model_type", "architectures", "transformers_version", "dtype", "torch_dtype", "_name_or_path",
        "output_attentions", "output_hidden_states", "return_dict", "use_return_dict", "chunk_size_feed_forward",
        "is_encoder_decoder", "num_labels", "tokenizer_class", "finetuning_task",
    }
)  # fmt: skip


@dataclass(frozen=True)
class ForeignFormat:
    """How checkpoints of one other implementation load into tf_family.

    Attributes:
        name: the ``tf-family convert`` name (``"longformer"``).
        source_model_type: the ``model_type`` in the folder's ``config.json`` (``"longformer"``, ``"transfo-xl"``).
        description: one line for ``tf-family convert --help``.
        translate_config: ``(config dict, **overrides) -> config`` of the tf_family model; raises
            `NotImplementedError` for settings tf_family does not implement.
        rename_rules: ``(pattern, replacement)`` regular expressions; the first that matches a key renames it.
        dropped: patterns of keys left out (buffers tf_family recomputes, weights it does not have).
        renamed_prefixes: ``(old, new)`` key prefixes swapped before anything else (``"roberta."`` ->
            ``"longformer."``; a wrapper's ``"decision_transformer."`` -> ``""``).
        aliases: ``(kept, alias)`` pairs of keys holding one tied tensor; the alias is dropped when both are present.
        transposed: patterns of (source) keys whose matrices are stored ``(in, out)`` (GPT-2's ``Conv1D``).
        transform: ``(source tensors, renamed tensors) -> renamed tensors``, run last, for what renaming cannot
            express (folding one tensor into another).
        unused: body weights some tf_family heads do not have (``"pooler."``), dropped when the model lacks them.
        default_task: the task class `convert_folder` builds when the source's ``architectures`` names no class
            tf_family has.
    """

    name: str
    source_model_type: str
    description: str
    translate_config: Callable[..., PreTrainedConfig]
    rename_rules: tuple[tuple[str, str], ...] = ()
    dropped: tuple[str, ...] = ()
    renamed_prefixes: tuple[tuple[str, str], ...] = ()
    aliases: tuple[tuple[str, str], ...] = ()
    transposed: tuple[str, ...] = ()
    transform: Callable[[dict[str, torch.Tensor], dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None
    unused: tuple[str, ...] = ()
    default_task: str = "base"

    def matches(self, config: PreTrainedConfig | Mapping[str, Any] | None) -> bool:
        """Whether ``config`` (a config object or a ``config.json`` dict) is of this format."""
        model_type = config.get("model_type") if isinstance(config, Mapping) else getattr(config, "model_type", None)
        return model_type == self.source_model_type

    def convert_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The source tensors under tf_family names. Keys no rule matches are kept as they are (the loader then
        reports them as unexpected)."""
        source = {}
        for key, tensor in state_dict.items():
            old, new = next(((old, new) for old, new in self.renamed_prefixes if key.startswith(old)), ("", ""))
            source[new + key.removeprefix(old)] = tensor
        for kept, alias in self.aliases:
            if kept in source:
                source = {key: tensor for key, tensor in source.items() if key != alias}
        dropped = [re.compile(pattern) for pattern in self.dropped]
        transposed = [re.compile(pattern) for pattern in self.transposed]
        renamed = {}
        for key, tensor in source.items():
            if any(pattern.search(key) for pattern in dropped):
                continue
            if any(pattern.search(key) for pattern in transposed):
                tensor = tensor.t().contiguous()
            for pattern, replacement in self.rename_rules:
                if re.search(pattern, key):
                    key = re.sub(pattern, replacement, key)
                    break
            renamed[key] = tensor
        return self.transform(source, renamed) if self.transform is not None else renamed


@dataclass(frozen=True)
class ForeignTokenizer:
    """A tokenizer file of another implementation that ``tf-family convert`` turns into a ``tokenizer.json``.

    Attributes:
        name: the ``tf-family convert`` name (``"transfo-xl-vocab"``).
        description: one line for ``tf-family convert --help``.
        convert: ``(source file, output folder) -> path written``.
    """

    name: str
    description: str
    convert: Callable[[str | os.PathLike, str | os.PathLike], Any]


def copy_config_values(
    values: Mapping[str, Any], copied: tuple[str, ...], ignored: frozenset[str], source_model_type: str
) -> dict[str, Any]:
    """The ``copied`` entries of a foreign config dict, as keyword arguments of a tf_family config.

    Keys neither copied, nor ``ignored``, nor bookkeeping (`BOOKKEEPING_CONFIG_KEYS`) are logged and left out;
    ``id2label`` gets its integer keys back (JSON made them strings).
    """
    unknown = sorted(set(values) - set(copied) - ignored - BOOKKEEPING_CONFIG_KEYS)
    if unknown:
        logger.warning(f"Ignoring {source_model_type} config keys tf_family does not use: {unknown}.")
    kwargs = {key: values[key] for key in copied if key in values}
    if isinstance(kwargs.get("id2label"), dict):
        kwargs["id2label"] = {int(key): label for key, label in kwargs["id2label"].items()}
    return kwargs


def find_format(
    formats: tuple[ForeignFormat, ...], path: str | os.PathLike | None, kwargs: Mapping[str, Any]
) -> ForeignFormat | None:
    """The record among ``formats`` that the folder ``path`` (or the ``config`` in ``kwargs``) is saved in, or
    ``None`` for a tf_family folder (or one of no format we read)."""
    if not formats:
        return None
    config = kwargs.get("config")
    if isinstance(config, PreTrainedConfig):
        values = config
    elif (config or path) is None:
        return None
    else:
        values = read_config_dict(config or path, {key: kwargs[key] for key in HUB_KWARGS if key in kwargs})
    return next((fmt for fmt in formats if values is not None and fmt.matches(values)), None)


def load_foreign(
    model_class: type[PreTrainedModel], path: str | os.PathLike, fmt: ForeignFormat, *model_args: Any, **kwargs: Any
) -> PreTrainedModel:
    """Build ``model_class`` (or the tf_family class a legacy Auto class stands for: its ``_tff_class``) from a
    folder (or cached Hub id) saved in ``fmt``.

    Keyword arguments: ``config`` (the foreign config object, or where its ``config.json`` is), the Hub arguments
    (``cache_dir``, ``revision``, ``subfolder``, ``token``, ``local_files_only`` …), ``variant`` and
    ``use_safetensors``, every argument transformers' `from_pretrained` takes to build and place a model
    (``dtype``, ``device_map``, ``attn_implementation``, ``output_loading_info`` …), and overrides of the translated
    config (``num_labels=3``, ``attention_mode="dense"``, ``state_mean=[...]``).
    """
    target = getattr(model_class, "_tff_class", model_class)
    hub_kwargs, file_kwargs, config, load_kwargs, overrides = split_load_kwargs(kwargs)
    if isinstance(config, PreTrainedConfig):
        values = config.to_dict()
        if config._attn_implementation is not None:  # an Auto class put the caller's choice on the config
            load_kwargs.setdefault("attn_implementation", config._attn_implementation)
    else:
        values = read_config_dict(config or path, hub_kwargs)
        if values is None:
            raise FileNotFoundError(f"No config.json found in {config or path!s}.")
    tff_config = fmt.translate_config(values, **overrides)
    weights = read_weights(path, hub_kwargs, **file_kwargs)
    loaded = build_converted(target, tff_config, weights, fmt, *model_args, **load_kwargs)
    model = loaded[0] if isinstance(loaded, tuple) else loaded
    model.config.name_or_path = str(path)
    return loaded


def build_converted(
    target: type[PreTrainedModel],
    tff_config: PreTrainedConfig,
    weights: Mapping[str, torch.Tensor],
    fmt: ForeignFormat,
    *model_args: Any,
    **load_kwargs: Any,
) -> PreTrainedModel:
    """``target`` built with ``tff_config`` from ``weights`` under the source's names (a folder's tensors or an
    in-memory model's ``state_dict()``): renamed by ``fmt``, checked name by name and shape by shape, loaded."""
    tff_config.architectures = [target.__name__]
    with torch.device("meta"):  # names and shapes only: nothing allocated, nothing initialised
        skeleton = target(tff_config, *model_args)
    tied = skeleton.get_expanded_tied_weights_keys(all_submodels=True)
    converted = fmt.convert_state_dict(weights)
    state_dict = check_state_dict(skeleton, converted, f"{target.base_model_prefix}.", tied, fmt.unused)
    # transformers' own from_pretrained for ``target``, past tf_family's hook (`TffPreTrainedModel.from_pretrained`,
    # which sits above this module): the weights are converted, and the hook's caller finishes
    return PreTrainedModel.from_pretrained.__func__(
        target, None, *model_args, config=tff_config, state_dict=state_dict, **load_kwargs
    )


def convert_folder(
    source: str | os.PathLike,
    output_dir: str | os.PathLike,
    model_classes: Mapping[str, type[PreTrainedModel]],
    fmt: ForeignFormat,
    **overrides: Any,
) -> PreTrainedModel:
    """What ``tf-family convert`` runs: load a checkpoint saved in ``fmt`` into the tf_family class of the same
    task and save it in the tf_family format (safetensors). The files are written beside ``output_dir`` and renamed
    into it once all are on disk, so an interrupted conversion leaves no half-written file there.

    The class is the one among ``model_classes`` (an `ArchSpec`'s task -> class) named ``Tff`` + the source's
    ``architectures[0]`` (``LongformerForMaskedLM`` -> ``TffLongformerForMaskedLM``), else the format's
    ``default_task``. ``overrides`` are config overrides, as for `from_pretrained`.
    """
    values = read_config_dict(source)
    if values is None or not fmt.matches(values):
        found = None if values is None else values.get("model_type")
        raise ValueError(
            f"{source!s} is not a {fmt.source_model_type} checkpoint: its config.json has model_type {found!r}. "
            f"Pick the convert kind that matches the folder."
        )
    by_name = {model_class.__name__: model_class for model_class in model_classes.values()}
    architecture = (values.get("architectures") or [""])[0]
    model_class = by_name.get(f"Tff{architecture}", model_classes[fmt.default_task])
    model = load_foreign(model_class, source, fmt, **overrides)
    with atomic_update_dir(output_dir) as staging:  # every file written beside, flushed, then renamed into place
        model.save_pretrained(staging)
    return model


def declared_formats(model_class: type) -> tuple[ForeignFormat, ...]:
    """The checkpoint formats ``model_class``'s architecture declares in its `ArchSpec` (``foreign``), the one place
    they are listed: the ``SPEC`` of the model folder that defines the class, or its nearest base class defined in
    one (a legacy Auto class, a user's subclass). That folder's package is imported before any module in it, so this
    reads it without importing anything. A class loaded from a remote-code export has none (its folder is no
    tf_family package): it reads its own folders only."""
    for klass in model_class.__mro__:
        package = sys.modules.get(klass.__module__.rpartition(".")[0])
        formats = getattr(getattr(package, "SPEC", None), "foreign_formats", None)
        if formats is not None:
            return tuple(record for record in formats if isinstance(record, ForeignFormat))
    return ()


__all__ = [
    "BOOKKEEPING_CONFIG_KEYS",
    "ForeignFormat",
    "ForeignTokenizer",
    "build_converted",
    "convert_folder",
    "copy_config_values",
    "declared_formats",
    "find_format",
    "load_foreign",
]
