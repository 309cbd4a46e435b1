"""`TffPreTrainedModel`: the one base of every tf_family ``PreTrainedModel``, carrying what every model shares.

Each model's ``Tff<Arch>PreTrainedModel`` subclasses it (as transformers' ``LlamaPreTrainedModel`` subclasses
`PreTrainedModel`); a head that generates lists `tf_family.modeling.validation.ValidatedGenerationMixin` beside it, as
transformers' heads list `GenerationMixin`. It adds to `PreTrainedModel`:

* **input validation**: the ``_check_*`` methods that run at the top of each ``forward`` (``input_ids`` integer, 2-D,
  non-empty and inside the vocabulary; masks shaped like the input; labels inside their classes or ``-100``; float
  inputs finite), built on the value checks of `tf_family.modeling.validation`; nothing is checked inside the layers;
* **the ``from_pretrained`` hook**: local folders checked first, folders of the foreign formats the architecture
  declares translated (`tf_family.conversion.foreign`), tf_family's older key names renamed, then `_finish_loading`;
  ``attn_implementation`` chosen by `tf_family.attention.backend.default_implementation` when none is asked for;
* **remote-code saving**: ``save_pretrained(..., remote_code=True)`` also writes the model's code, so that plain
  transformers loads the folder with ``trust_remote_code=True`` where tf_family is not installed.

The remote-code export (`tf_family.shipping.remote_code.export_remote_code`) reads the registry and copies the
package's code: it sits above the models, so this module (which travels inside every export, beside the models) never
imports it. The top of the package hands it down instead: ``import tf_family`` sets
`tf_family.modeling.handoff.code_exporter`, which `TffPreTrainedModel.code_exporter` is. A class loaded from an export,
where tf_family may be missing, has no exporter: it saves with ``remote_code=False`` and keeps its ``auto_map``.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch
from transformers import PreTrainedModel

from ..attention.backend import NATIVE, default_implementation
from ..conversion.foreign import declared_formats, find_format, load_foreign
from ..utils.files import check_checkpoint_folder
from ..utils.user_errors import check_local_path
from . import handoff
from .validation import _tracing, check_class_labels, check_finite, check_ids_in_range, check_tensor


class TffPreTrainedModel(PreTrainedModel):
    """transformers' `PreTrainedModel` with what every tf_family model shares: the input checks its ``forward`` runs,
    the one ``from_pretrained`` (checked folders, foreign formats, older key names, `_finish_loading`), tf_family's
    choice of ``attn_implementation``, and ``save_pretrained(..., remote_code=True)``. The model's ``config`` gives
    the sizes the checks use."""

    # ``(folder) -> files written``: handed down by ``import tf_family`` (`handoff`); None in an export
    code_exporter: ClassVar[Callable[[str | os.PathLike], Any] | None] = (
        None if handoff.code_exporter is None else staticmethod(handoff.code_exporter)
    )
    # ``{old key pattern: new name}`` read by `from_pretrained` (transformers' ``key_mapping``), never written
    _checkpoint_key_mapping: Mapping[str, str] = {}

    # ------------------------------------------------------------------------------------------- input validation
    def _check_token_inputs(
        self,
        input_ids: torch.Tensor | None,
        inputs_embeds: torch.Tensor | None,
        *,
        vocab_size: int | None = None,
        embedding_width: int | None = None,
    ) -> tuple[int, int]:
        """Exactly one of ``input_ids`` ``(B, T)`` (integer ids in ``[0, vocab_size)``) and ``inputs_embeds``
        ``(B, T, D)`` (finite floats), with ``B, T >= 1``. Returns ``(B, T)``."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids and inputs_embeds.")
        if input_ids is not None:
            check_tensor("input_ids", input_ids, integer=True, dim=2)
            name, source = "input_ids", input_ids
        else:
            check_tensor("inputs_embeds", inputs_embeds, integer=False, dim=3)
            name, source = "inputs_embeds", inputs_embeds
        batch, length = source.shape[:2]
        if batch == 0 or length == 0:
            raise ValueError(
                f"{name} is empty (shape {tuple(source.shape)}): pass at least one row of at least one token."
            )
        if input_ids is not None:
            vocab_size = vocab_size if vocab_size is not None else self.config.vocab_size
            check_ids_in_range("input_ids", input_ids, vocab_size)
        else:
            width = embedding_width if embedding_width is not None else self.config.hidden_size
            if inputs_embeds.shape[-1] != width:
                raise ValueError(
                    f"inputs_embeds must have width {width} (the embedding width), got shape "
                    f"{tuple(inputs_embeds.shape)}."
                )
            dtype = getattr(self, "dtype", inputs_embeds.dtype)
            if inputs_embeds.dtype != dtype and not torch.is_autocast_enabled(inputs_embeds.device.type):
                raise TypeError(
                    f"inputs_embeds has dtype {inputs_embeds.dtype} but the model computes in {dtype}; convert with "
                    f"inputs_embeds.to({dtype})."
                )
            check_finite("inputs_embeds", inputs_embeds)
        return batch, length

    @staticmethod
    def _check_mask(
        name: str,
        mask: torch.Tensor | None,
        batch: int,
        length: int,
        *,
        at_least: bool = False,
        dims: tuple[int, ...] = (2,),
    ) -> None:
        """A 0/1 (or bool) mask ``(B, length)`` (``at_least``: ``(B, >= length)``); masks of ``dims`` other than 2
        are left to the model, batch excepted."""
        if mask is None:
            return
        check_tensor(name, mask, dim=dims)
        if mask.shape[0] != batch:
            raise ValueError(f"{name} has {mask.shape[0]} rows but the input has {batch}; give one row per input row.")
        binary = mask.dim() != 2 or mask.dtype == torch.bool or not mask.numel() or _tracing()
        if not binary and bool(((mask != 0) & (mask != 1)).any()):
            raise ValueError(
                f"{name} must hold 0 / 1 (or bool) values, got values in [{mask.min().item()}, "
                f"{mask.max().item()}]; pass 1 for the tokens to use, 0 for padding."
            )
        if mask.dim() == 2:
            columns = mask.shape[1]
            if columns < length if at_least else columns != length:
                expected = f"(B, >= {length})" if at_least else f"{(batch, length)}"
                raise ValueError(f"{name} must have shape {expected} like the input, got {tuple(mask.shape)}.")

    @staticmethod
    def _check_reset_mems(reset_mems: torch.Tensor | None, batch: int) -> None:
        """``reset_mems``: ``(B,)`` bool, the rows that start a new document."""
        if reset_mems is None:
            return
        check_tensor("reset_mems", reset_mems)
        if reset_mems.dtype != torch.bool or tuple(reset_mems.shape) != (batch,):
            raise ValueError(
                f"reset_mems must be a bool tensor of shape ({batch},) (True: the row starts a new document), got "
                f"{reset_mems.dtype} {tuple(reset_mems.shape)}."
            )

    @staticmethod
    def _check_index_inputs(name: str, value: torch.Tensor | None, batch: int, length: int, high: int, what: str):
        """``token_type_ids`` / ``position_ids``: integers ``(B, T)`` (or ``(1, T)``) in ``[0, high)``."""
        if value is None:
            return
        check_tensor(name, value, integer=True, dim=2)
        if value.shape[1] != length or value.shape[0] not in (1, batch):
            raise ValueError(f"{name} must have shape {(batch, length)}, got {tuple(value.shape)}.")
        check_ids_in_range(name, value, high, what=what)

    def _check_lm_labels(self, labels: torch.Tensor | None, batch: int, length: int, vocab_size: int | None = None):
        """Language-modelling labels: token ids ``(B, T)`` in ``[0, vocab_size)`` or ``-100``."""
        if labels is not None:
            vocab_size = vocab_size if vocab_size is not None else self.config.vocab_size
            check_class_labels("labels", labels, vocab_size, (batch, length), "vocab_size")

    # --------------------------------------------------------------------------------------------- from_pretrained
    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        """Load a tf_family checkpoint (older key names renamed by ``_checkpoint_key_mapping``), or a folder saved by
        another implementation in a format the architecture declares (config translated, weights renamed and
        checked; see `tf_family.conversion.foreign.load_foreign`), then finish it (`_finish_loading`, whose
        keyword-only parameters are keyword arguments of this call: kNN-LM's ``datastore``).

        In order: a local path that does not exist is said to be missing at once
        (`tf_family.utils.user_errors.check_local_path`), where transformers would take it for a Hub id and retry the
        network; a local folder's ``config.json`` and safetensors files are checked
        (`tf_family.utils.files.check_checkpoint_folder`: a damaged or truncated file, or a shard named outside the
        folder, is a `ValueError` naming it); a folder (or ``config``) of one of the formats the architecture declares
        (`tf_family.conversion.foreign.declared_formats`) is translated; anything else goes to
        `PreTrainedModel.from_pretrained`, with the class's ``_checkpoint_key_mapping`` (e.g. a head that became a
        ``classifier`` module) as transformers' ``key_mapping``, so that tf_family's older folders load; the model
        saves under the new names (transformers would otherwise write a renamed checkpoint back in its old layout).
        Last, `_finish_loading` runs on the loaded model: the step where a class does what its weights alone do not
        (kNN-LM attaches its datastore)."""
        options = {name: kwargs.pop(name) for name in _finishing_options(cls) if name in kwargs}
        check_local_path(pretrained_model_name_or_path, f"{cls.__name__}.from_pretrained")
        if pretrained_model_name_or_path is not None and os.path.isdir(pretrained_model_name_or_path):
            check_checkpoint_folder(os.path.join(pretrained_model_name_or_path, kwargs.get("subfolder") or ""))
        fmt = find_format(declared_formats(cls), pretrained_model_name_or_path, kwargs)
        if fmt is not None:
            loaded = load_foreign(cls, pretrained_model_name_or_path, fmt, *model_args, **kwargs)
        else:
            loaded = cls._load_tf_family_folder(pretrained_model_name_or_path, *model_args, **kwargs)
        model = loaded[0] if isinstance(loaded, tuple) else loaded
        cls._finish_loading(model, pretrained_model_name_or_path, kwargs, **options)
        return loaded

    @classmethod
    def _load_tf_family_folder(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        """transformers' ``from_pretrained``, reading tf_family's older key names (``_checkpoint_key_mapping``)."""
        renames = dict(cls._checkpoint_key_mapping)
        if renames:
            kwargs["key_mapping"] = {**renames, **(kwargs.get("key_mapping") or {})}
        loaded = super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        if renames:
            _forget_renames(loaded[0] if isinstance(loaded, tuple) else loaded, renames)
        return loaded

    @classmethod
    def _finish_loading(cls, model: PreTrainedModel, pretrained_model_name_or_path, load_kwargs: dict) -> None:
        """The last step of `from_pretrained`, on the loaded ``model``: nothing here. A class that needs one overrides
        it; its keyword-only parameters become keyword arguments of ``from_pretrained`` (taken out before
        transformers sees the rest). ``load_kwargs``: the other keyword arguments of the call (Hub arguments …)."""

    def get_correct_attn_implementation(self, requested_attention: str | None, is_init_check: bool = False) -> str:
        """transformers' check of ``attn_implementation``, with tf_family's two additions: no choice (``None``) takes
        `tf_family.attention.backend.default_implementation` (a rule by the default device and the config's dtype:
        ``"tff_native"`` on CPU where the native kernel can be built, else ``"sdpa"``), and ``"tff_native"`` (tf_family's
        CPU kernels, `backend.NATIVE`) is accepted wherever ``"sdpa"`` is, since the attention runs through
        `backend.attend`."""
        if requested_attention is None and self._supports_sdpa:
            dtype = getattr(self.config, "dtype", None)
            dtype = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
            # from_pretrained builds the model on the meta device and then loads its weights onto the CPU: the rule
            # is read for the CPU there, so a loaded model runs what the same model built directly runs
            device = torch.get_default_device()
            device = torch.device("cpu") if device.type == "meta" else device
            requested_attention = default_implementation(
                device, dtype=dtype if isinstance(dtype, torch.dtype) else None
            )
        if requested_attention == NATIVE:
            if not self._supports_sdpa:
                raise ValueError(
                    f"{type(self).__name__} does not run its attention through tf_family.attention.attend, so "
                    f"attn_implementation={NATIVE!r} is not available; use 'eager'."
                )
            return NATIVE
        return super().get_correct_attn_implementation(requested_attention, is_init_check)

    # ------------------------------------------------------------------------------------------ remote-code saving
    def save_pretrained(self, save_directory: str | os.PathLike, *args, remote_code: bool = False, **kwargs):
        """transformers' ``save_pretrained``; ``remote_code=True`` also writes the model's code and ``auto_map``
        (``code_exporter``: `tf_family.shipping.remote_code.export_remote_code`). After ``register_for_auto_class()``
        (transformers' way to ship custom code, which cannot copy tf_family's package-relative imports: a raw
        `FileNotFoundError` inside transformers) it does the same as ``remote_code=True``."""
        registered = [cls for cls in (type(self), type(self.config)) if _registered_in_package(cls)]
        remote_code = remote_code or bool(registered)
        exporter = TffPreTrainedModel.code_exporter
        if remote_code and exporter is None:  # refused before anything is written
            raise ValueError(
                "save_pretrained(remote_code=True) needs tf_family installed and imported (pip install tf-family; "
                "import tf_family); a model loaded from exported code saves with remote_code=False and keeps its "
                "auto_map."
            )
        saved = {cls: cls.__dict__["_auto_class"] for cls in registered}
        try:  # the export below writes the code; transformers' own copy of it would fail
            for cls in registered:
                cls._auto_class = None
            super().save_pretrained(save_directory, *args, **kwargs)
        finally:
            for cls, auto_class in saved.items():
                cls._auto_class = auto_class
        if remote_code and kwargs.get("is_main_process", True):
            exporter(save_directory)


def _finishing_options(model_class: type) -> tuple[str, ...]:
    """The keyword-only parameters of ``model_class._finish_loading``: its own ``from_pretrained`` arguments."""
    parameters = inspect.signature(model_class._finish_loading).parameters.values()
    return tuple(parameter.name for parameter in parameters if parameter.kind is inspect.Parameter.KEYWORD_ONLY)


def _forget_renames(model: PreTrainedModel, renames: Mapping[str, str]) -> None:
    """Drop ``renames`` from the weight conversions transformers keeps on a loaded model to undo them on save (it
    writes a renamed checkpoint back in its original layout): tf_family's older names are read, never written."""
    conversions = getattr(model, "_weight_conversions", None)
    if conversions:
        ours = [[pattern] for pattern in renames]
        model._weight_conversions = [
            conversion
            for conversion in conversions
            if list(getattr(conversion, "_original_source_patterns", ())) not in ours
        ]


def _registered_in_package(cls: type) -> bool:
    """Whether ``register_for_auto_class`` was called on ``cls``, a class of the tf_family package (not one loaded
    from exported code, whose flat files transformers copies itself)."""
    return cls.__dict__.get("_auto_class") is not None and cls.__module__.split(".")[0] == "tf_family"


__all__ = ["TffPreTrainedModel"]
