"""Checkpoints saved by other code: reading weight files (`loading`) and one record per foreign format with the one
loader and converter that serve them all (`foreign`), which the ``from_pretrained`` of every model
(`tf_family.modeling.pretrained.TffPreTrainedModel`) calls."""

from .foreign import (
    BOOKKEEPING_CONFIG_KEYS,
    ForeignFormat,
    ForeignTokenizer,
    build_converted,
    convert_folder,
    copy_config_values,
    declared_formats,
    find_format,
    load_foreign,
)
from .loading import (
    FILE_KWARGS,
    HUB_KWARGS,
    LOAD_KWARGS,
    check_state_dict,
    read_config_dict,
    read_manifest,
    read_weights,
    resolve_file,
    split_load_kwargs,
)

__all__ = [
    "BOOKKEEPING_CONFIG_KEYS",
    "FILE_KWARGS",
    "HUB_KWARGS",
    "LOAD_KWARGS",
    "ForeignFormat",
    "ForeignTokenizer",
    "build_converted",
    "check_state_dict",
    "convert_folder",
    "copy_config_values",
    "declared_formats",
    "find_format",
    "load_foreign",
    "read_config_dict",
    "read_manifest",
    "read_weights",
    "resolve_file",
    "split_load_kwargs",
]
