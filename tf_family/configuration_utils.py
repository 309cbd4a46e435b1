"""Small helpers shared by every tf_family configuration class."""

from __future__ import annotations

import inspect
import types
import typing
from typing import Any

from transformers import GenerationConfig

# Keys that `transformers.PreTrainedConfig.__post_init__` consumes itself, or that transformers writes into every
# saved config.json; a tf_family config accepts these and nothing else beyond its own fields.
_BASE_CONFIG_KWARGS = frozenset(
    {
        "model_type",
        "torch_dtype",
        "num_labels",
        "name_or_path",
        "_name_or_path",
        "_commit_hash",
        "output_attentions",
        "attn_implementation",
        "experts_implementation",
        "per_layer_config",
        "tokenizer_class",
        "task_specific_params",
        "finetuning_task",
        "prefix",
        "sep_token_id",
        "decoder_start_token_id",
        "_attn_implementation_autoset",
        "rope_scaling",
        "rope_theta",
        # a remote-code export's Auto classes (`tf_family.remote_code`): kept, so a loaded config saves them again
        "auto_map",
    }
)


def check_config_kwargs(config_name: str, kwargs: dict[str, Any]) -> None:
    """Raise a ``ValueError`` naming every keyword that ``config_name`` does not know.

    transformers configs keep unknown keys silently, so a typo (``mem_length=...``) changes nothing and goes unseen.
    tf_family configs refuse them instead.
    """
    generation_keys = set(GenerationConfig._get_default_generation_params())
    unknown = sorted(key for key in kwargs if key not in _BASE_CONFIG_KWARGS and key not in generation_keys)
    if unknown:
        raise ValueError(
            f"{config_name} got unknown argument(s) {unknown}. Check the spelling against the fields documented in "
            f"{config_name}'s docstring; tf_family configs do not keep unknown keys."
        )


def _matches(value: Any, annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if annotation is Any:
        return True
    if annotation is type(None):
        return value is None
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in typing.get_args(annotation))
    if origin is typing.Literal:
        return value in typing.get_args(annotation)
    if origin in (list, tuple):
        (item_type, *_) = typing.get_args(annotation) or (Any,)
        return isinstance(value, (list, tuple)) and all(_matches(item, item_type) for item in value)
    if origin is dict:
        return isinstance(value, dict)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(annotation, type):
        return isinstance(value, annotation)
    return True


def validate_config(config: Any) -> None:
    """Check the type of every field a tf_family config declares, then its cross-field rules.

    Raises `TypeError` naming the field, its value and the expected type, or whatever `ValueError` the config's
    `validate_architecture()` raises. (transformers' `@strict` wraps such errors in its own exception types;
    tf_family raises the plain ones users catch.)
    """
    for cls in reversed(type(config).__mro__):
        # tf_family's classes, also when loaded from a remote-code export (transformers' dynamic modules)
        if not cls.__module__.startswith(("tf_family", "transformers_modules")):
            continue
        for name, annotation in inspect.get_annotations(cls, eval_str=True).items():
            if typing.get_origin(annotation) is typing.ClassVar or name.startswith("_"):
                continue
            value = getattr(config, name)
            if not _matches(value, annotation):
                raise TypeError(f"{type(config).__name__}.{name} must be {annotation}, got {value!r}.")
    config.validate_architecture()
