"""Config validation, in one place: what every tf_family configuration class runs on itself.

`check_config_kwargs` refuses unknown keys; `validate_config` (called by each config's ``__post_init__``) checks the
type of every declared field, the fields several configs share by name (`check_common_fields`: layer counts,
layer-norm epsilons, init stds, activations, the padding token id, finite floats), then the config's own cross-field
rules (``validate_architecture``). The value checks they use (`check_int`, `check_float` …) are
`tf_family.modeling.validation`'s, the same that ``forward`` arguments go through; model inputs are checked there too.
"""

from __future__ import annotations

import inspect
import numbers
import types
import typing
from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

from transformers import GenerationConfig

from .handoff import announce_config
from .validation import check_activation, check_float, check_list_of, check_positive_int, check_token_id

# Layer counts: far above any trained model, low enough that a typo does not build a model for hours.
MAX_LAYERS = 4096

# fields shared by several configs, checked wherever a config has them (`check_common_fields`)
_EPSILON_FIELDS = ("layer_norm_eps", "layer_norm_epsilon", "rms_norm_eps")
_STD_FIELDS = ("init_std", "initializer_range", "proj_init_std", "axial_norm_std")
_ACTIVATION_FIELDS = ("hidden_act", "activation_function")
_LAYER_FIELDS = ("n_layer", "num_hidden_layers")
# pad_token_id must be a token: it indexes the embedding (padding_idx) and fills generated rows. transformers itself
# warns about bos / eos / sep ids outside the vocabulary (checkpoints exist that have them); a zoo model never feeds
# them unless the caller does, and then the input check names them.
_TOKEN_ID_FIELDS = ("pad_token_id",)

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
        # a remote-code export's Auto classes (`tf_family.shipping.remote_code`): kept, so a loaded config saves them again
        "auto_map",
    }
)


# A tf_family config's ``auto_map`` when its folder names no remote code: empty, not missing, because tools read
# ``config.auto_map`` directly to find a model class that transformers itself does not define (TRL's
# ``create_model_from_path``, which DPO uses to load the reference model) and transformers' Auto classes test
# ``name in config.auto_map``. Read-only: a folder with remote code sets its own (`tf_family.shipping.remote_code`).
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
    if typing.get_origin(annotation) is typing.Literal:  # (its __name__ is just "Literal")
        return "one of " + ", ".join(repr(value) for value in typing.get_args(annotation))
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


def check_common_fields(config: Any, float_fields: Sequence[str] = (), infinite_ok: Sequence[str] = ()) -> None:
    """The checks every config shares: each field in ``float_fields`` finite (``infinite_ok`` may be ``inf``), every
    layer count in ``[1, MAX_LAYERS]``, every layer-norm epsilon > 0, every init std >= 0, every activation known,
    ``pad_token_id`` inside the vocabulary (when the config has a ``vocab_size``)."""
    for name in _LAYER_FIELDS:
        if name in type(config).__annotations__ or name in getattr(type(config), "__dataclass_fields__", {}):
            check_positive_int(name, getattr(config, name), maximum=MAX_LAYERS)
    for name in float_fields:
        value = getattr(config, name)
        if isinstance(value, (list, tuple)):
            check_list_of(name, value, check_float)
        elif value is not None:
            check_float(name, value, allow_inf=name in infinite_ok)
    for name in _EPSILON_FIELDS:
        if hasattr(config, name):
            check_float(name, getattr(config, name), minimum=0.0, min_open=True, fix=f"set {name} > 0, e.g. 1e-5")
    for name in _STD_FIELDS:
        if hasattr(config, name):
            check_float(name, getattr(config, name), minimum=0.0, fix=f"set {name} >= 0, e.g. 0.02")
    for name in _ACTIVATION_FIELDS:
        if hasattr(config, name):
            check_activation(name, getattr(config, name))
    vocab_size = getattr(config, "vocab_size", None)
    if isinstance(vocab_size, numbers.Integral) and not isinstance(vocab_size, bool):
        for name in _TOKEN_ID_FIELDS:
            check_token_id(name, getattr(config, name, None), vocab_size)


def validate_config(config: Any) -> None:
    """Check the type of every field a tf_family config declares, the checks every config shares
    (`check_common_fields`: finite floats, layer-norm epsilons, init stds, activations, the
    padding token id), then its cross-field rules.

    Raises `TypeError` or `ValueError` whose message starts with the config's class name and names the field, its
    value and the fix. (transformers' `@strict` wraps such errors in its own exception types; tf_family raises the
    plain ones users catch.) A valid config is then announced (`tf_family.modeling.handoff`): the first one of an
    architecture registers its model classes with the Auto classes.
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
    announce_config(type(config))  # the first config of an architecture registers its model classes (`handoff`)
