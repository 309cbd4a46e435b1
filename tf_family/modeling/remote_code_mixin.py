"""``save_pretrained(..., remote_code=True)`` for every tf_family model: `RemoteCodeMixin`.

The export itself (`tf_family.shipping.remote_code.export_remote_code`) reads the registry and copies the package's code: it
sits above the models, so this module (which travels inside every export, beside the models) never imports it. The
top of the package hands it down instead: ``import tf_family`` installs `tf_family.lazy_auto`, which sets
`RemoteCodeMixin.code_exporter` the moment this module is imported. A class loaded from an export, where tf_family
may be missing, has no exporter: it saves with ``remote_code=False`` and keeps its ``auto_map``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, ClassVar


def _registered_in_package(cls: type) -> bool:
    """Whether ``register_for_auto_class`` was called on ``cls``, a class of the tf_family package (not one loaded
    from exported code, whose flat files transformers copies itself)."""
    return cls.__dict__.get("_auto_class") is not None and cls.__module__.split(".")[0] == "tf_family"


class RemoteCodeMixin:
    """``save_pretrained(..., remote_code=True)``: save, then add the model's code to the folder (``code_exporter``:
    `tf_family.shipping.remote_code.export_remote_code`), so that plain transformers loads it with ``trust_remote_code=True``
    where tf_family is not installed. Listed among the bases of every tf_family ``PreTrainedModel``."""

    # ``(folder) -> files written``: set by `tf_family.lazy_auto` when tf_family is imported; None in an export
    code_exporter: ClassVar[Callable[[str | os.PathLike], Any] | None] = None

    def save_pretrained(self, save_directory: str | os.PathLike, *args, remote_code: bool = False, **kwargs):
        """transformers' ``save_pretrained``; ``remote_code=True`` also writes the model's code and ``auto_map``.
        After ``register_for_auto_class()`` (transformers' way to ship custom code, which cannot copy tf_family's
        package-relative imports: a raw `FileNotFoundError` inside transformers) it does the same as
        ``remote_code=True``."""
        registered = [cls for cls in (type(self), type(self.config)) if _registered_in_package(cls)]
        remote_code = remote_code or bool(registered)
        exporter = RemoteCodeMixin.code_exporter
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


__all__ = ["RemoteCodeMixin"]
