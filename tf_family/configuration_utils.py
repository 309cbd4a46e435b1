"""Small helpers shared by every tf_family configuration class."""

from __future__ import annotations

import inspect
import types
import typing
from types import MappingProxyType
from typing import Any

from transformers import GenerationConfig

from .validation import check_common_fields

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


# A tf_family config's ``auto_map`` when its folder names no remote code: empty, not missing, because tools read
# ``config.auto_map`` directly to find a model class that transformers itself does not define (TRL's
# ``create_model_from_path``, which DPO uses to load the reference model) and transformers' Auto classes test
# ``name in config.auto_map``. Read-only: a folder with remote code sets its own (`tf_family.remote_code`).
NO_AUTO_MAP: MappingProxyType = MappingProxyType({})


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


def _has_float(annotation: Any) -> bool:
    if annotation is float:
        return True
    return any(_has_float(arg) for arg in typing.get_args(annotation))


def _allows_int(annotation: Any) -> bool:
    if annotation is int:
        return True
    return any(_allows_int(arg) for arg in typing.get_args(annotation))


def _describe(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


def validate_config(config: Any) -> None:
    """Check the type of every field a tf_family config declares, the checks every config shares
    (`tf_family.validation.check_common_fields`: finite floats, layer-norm epsilons, init stds, activations, the
    padding token id), then its cross-field rules.

    Raises `TypeError` or `ValueError` whose message starts with the config's class name and names the field, its
    value and the fix. (transformers' `@strict` wraps such errors in its own exception types; tf_family raises the
    plain ones users catch.)
    """
    owner = type(config).__name__
    try:
        float_fields = []
        for cls in reversed(type(config).__mro__):
            # tf_family's classes, also when loaded from a remote-code export (transformers' dynamic modules)
            if not cls.__module__.startswith(("tf_family", "transformers_modules")):
                continue
            for name, annotation in inspect.get_annotations(cls, eval_str=True).items():
                if typing.get_origin(annotation) is typing.ClassVar or name.startswith("_"):
                    continue
                value = getattr(config, name)
                if not _matches(value, annotation):
                    raise TypeError(
                        f"{name} must be {_describe(annotation)}, got {value!r} ({type(value).__name__}); pass a "
                        "value of that type."
                    )
                if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
                    raise ValueError(f"{name}={value} does not fit in 64 bits; pass a smaller value.")
                if _has_float(annotation) and name not in float_fields:
                    float_fields.append(name)
                    if isinstance(value, int) and not isinstance(value, bool) and not _allows_int(annotation):
                        setattr(config, name, float(value))  # 1 for a float field is 1.0 (a float tensor, not long)
        check_common_fields(config, float_fields, getattr(config, "_infinite_fields", ()))
        config.validate_architecture()
    except (TypeError, ValueError) as error:
        if type(error) not in (TypeError, ValueError) or str(error).startswith(f"{owner}"):
            raise
        raise type(error)(f"{owner}: {error}") from None
