"""What one architecture declares about itself: its `ArchSpec`.

Each model folder's ``__init__.py`` builds one ``SPEC``; `tf_family.registry` puts them in one ordered table. This
module imports nothing of tf_family, so a model folder can declare its spec without importing the registry.

A spec names its classes as ``"module:Name"`` strings (or holds the classes): ``tf-family --help``, ``tf-family list``
and ``import tf_family`` read the table without importing torch, transformers or any modeling file; a class is
imported the first time it is read (`ArchSpec.config_class`, ``spec.model_classes[task]``).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

Task = Literal[
    "base",
    "causal_lm",
    "masked_lm",
    "sequence_classification",
    "token_classification",
    "question_answering",
    "multiple_choice",
    "action",
]

# What a model carries from one call to the next (its class attribute ``carried_state``), which recipes read to
# decide how to feed it: ``None`` (nothing: shuffled blocks), ``"segment_memory"`` (a `SegmentMemory` passed as
# ``mems``), ``"compressive_memory"`` (a `CompressiveMemory`), ``"knn_memory"`` (a `MemorizingMemory`: the
# Memorizing Transformer's kNN memory and its segment memory).
CarriedState = Literal["segment_memory", "compressive_memory", "knn_memory"] | None


def import_object(reference: Any) -> Any:
    """The object a ``"package.module:Name"`` reference names (imported now); anything else is returned as it is."""
    if not isinstance(reference, str):
        return reference
    module, colon, name = reference.partition(":")
    if not colon or not module or not name:
        raise ValueError(f"{reference!r} is not a 'package.module:Name' reference; write it as 'module:Name'.")
    return getattr(importlib.import_module(module), name)


class LazyClasses(Mapping):
    """A read-only ``key -> class`` mapping whose classes are given as ``"module:Name"`` references (or as classes)
    and imported the first time they are read; the keys are known without importing anything."""

    def __init__(self, references: Mapping[str, Any]):
        self._references = dict(references)
        self._loaded: dict[str, Any] = {}

    def __getitem__(self, key: str) -> Any:
        if key not in self._loaded:
            self._loaded[key] = import_object(self._references[key])
        return self._loaded[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._references)

    def __len__(self) -> int:
        return len(self._references)

    def reference(self, key: str) -> str:
        """Where ``key``'s class lives, as ``"module:Name"``, without importing it."""
        value = self._references[key]
        return value if isinstance(value, str) else f"{value.__module__}:{value.__qualname__}"

    def __repr__(self) -> str:
        return f"LazyClasses({self._references!r})"


def carried_state(model: Any) -> CarriedState:
    """The kind of state ``model`` (an instance or a class, ours or plain transformers) carries between calls."""
    return getattr(model, "carried_state", None)


@dataclass(frozen=True)
class ArchSpec:
    """Everything the toolkit needs to know about one architecture.

    Attributes:
        name: short name used on the command line (``--arch transfo_xl``).
        title: human name with the paper (for tables and cards).
        model_type: the config class's ``model_type`` (registered with `AutoConfig`), declared here so that the
            table is read without importing the config (`config_class` checks that they agree).
        config: the `PreTrainedConfig` subclass, or a ``"module:Name"`` reference to it (`config_class`).
        models: task -> model class or ``"module:Name"`` reference (`model_classes`); ``"base"`` is the headless
            model.
        variants: named config overrides; ``"tiny"`` (< 1M parameters) is what the tests build.
        lora_target_modules: default PEFT LoRA targets (the attention projections; the Decision Transformer adds its
            MLP): the recipes' ``--lora_r`` default, and PEFT's own default for the model types
            (`tf_family.auto.register_lora_targets`).
        ia3_target_modules: default PEFT IA3 targets (the key and value projections, fused ``qkv`` where the
            architecture fuses them, and the feed-forward output), registered like ``lora_target_modules``.
        ia3_feedforward_modules: those of ``ia3_target_modules`` that are feed-forward layers (IA3 scales their input
            rather than their output).
        reference: the implementation parity is checked against.
        parity: what the parity tests establish, in a few words.
        card: model card template, relative to the repository's ``model_cards/``.
        paper: arXiv id of the paper.
        legacy_model_types: model types another library used for this architecture and no longer registers
            (``transfo-xl``), one per entry of ``legacy``.
        legacy: their config classes (or references); `tf_family.auto` registers each with the Auto classes,
            routing its folders to this architecture's model classes (`legacy_configs`).
        foreign: what ``tf-family convert`` reads from other implementations (`foreign_formats`), as a tuple or a
            ``"module:NAME"`` reference to one: checkpoint formats that the models' ``from_pretrained`` also reads
            (`tf_family.conversion.ForeignFormat`) and tokenizer files (`tf_family.conversion.ForeignTokenizer`).
        options: systems that are options of this architecture, each ``(name with the paper, config setting)``,
            e.g. ``("GTrXL (Parisotto et al. 2020)", 'gating="gru", pre_lnorm=True')``: the setting is what to pass
            to the config (keyword arguments, as Python writes them); ``tf-family list`` names them.
        exports: further public names of the architecture as ``"module:Name"`` references (its
            ``PreTrainedModel`` base, a cache class...): with the config and model classes they are the names
            ``tf_family`` offers at its top level (``tf_family.TffLongformerModel``; `public_names`).
        task_variants: task -> the variant its tests build instead of ``"tiny"``, where a head takes only some
            settings (the Sparse Transformer's encoder heads take only the blockwise pattern, its ``"tiny"`` is
            strided); `tiny_config` with ``task=`` reads it.
    """

    name: str
    title: str
    model_type: str
    config: Any
    models: Mapping[str, Any]
    variants: Mapping[str, Mapping[str, Any]]
    lora_target_modules: tuple[str, ...]
    reference: str
    parity: str
    card: str
    paper: str = ""
    legacy_model_types: tuple[str, ...] = ()
    legacy: tuple[Any, ...] = ()
    foreign: Any = field(default=())
    ia3_target_modules: tuple[str, ...] = ()
    ia3_feedforward_modules: tuple[str, ...] = ()
    exports: tuple[str, ...] = ()
    options: tuple[tuple[str, str], ...] = ()
    task_variants: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for task, variant in self.task_variants.items():
            if task not in self.models or variant not in self.variants:
                raise ValueError(
                    f"ArchSpec {self.name!r}: task_variants maps {task!r} to {variant!r}, but the task must be one of "
                    f"{sorted(self.models)} and the variant one of {sorted(self.variants)}."
                )
        if len(self.legacy) != len(self.legacy_model_types):
            raise ValueError(
                f"ArchSpec {self.name!r}: legacy_model_types={self.legacy_model_types!r} and legacy={self.legacy!r} "
                "must have one model type per legacy config."
            )

    @cached_property
    def config_class(self) -> type[PreTrainedConfig]:
        """The config class (imported on first read)."""
        config_class = import_object(self.config)
        if config_class.model_type != self.model_type:
            raise ValueError(
                f"ArchSpec {self.name!r} declares model_type={self.model_type!r} but {config_class.__name__} has "
                f"model_type={config_class.model_type!r}; make them agree."
            )
        return config_class

    @cached_property
    def model_classes(self) -> LazyClasses:
        """task -> model class; each class is imported the first time it is read."""
        return LazyClasses(self.models)

    @cached_property
    def legacy_configs(self) -> tuple[type[PreTrainedConfig], ...]:
        configs = tuple(import_object(reference) for reference in self.legacy)
        found = tuple(config.model_type for config in configs)
        if found != self.legacy_model_types:
            raise ValueError(
                f"ArchSpec {self.name!r} declares legacy_model_types={self.legacy_model_types!r} but its legacy "
                f"configs have {found!r}; make them agree."
            )
        return configs

    @cached_property
    def foreign_formats(self) -> tuple[Any, ...]:
        foreign = import_object(self.foreign)  # a reference to a tuple, or a tuple of records or references
        return tuple(import_object(record) for record in foreign)

    def public_names(self) -> dict[str, str]:
        """``Name -> module`` of every public name of the architecture (config, model classes, `exports`), read
        from the references without importing anything: ``tf_family``'s top-level names are built from these."""
        references = [self.config, *self.models.values(), *self.exports]
        names: dict[str, str] = {}
        for reference in references:
            if not isinstance(reference, str):
                reference = f"{reference.__module__}:{reference.__qualname__}"
            module, colon, name = reference.partition(":")
            if not colon or not module or not name:
                raise ValueError(
                    f"ArchSpec {self.name!r}: {reference!r} is not a 'package.module:Name' reference; write it so."
                )
            names[name] = module
        return names

    @property
    def model_types(self) -> tuple[str, ...]:
        """Every ``model_type`` whose folders load as this architecture (its own first)."""
        return (self.model_type, *self.legacy_model_types)

    @property
    def tasks(self) -> tuple[str, ...]:
        return tuple(task for task in self.model_classes if task != "base")

    @property
    def carried_state(self) -> CarriedState:
        """What the architecture's models carry between calls (read from the model classes, which declare it)."""
        kinds = {carried_state(model_class) for model_class in self.model_classes.values()}
        kinds.discard(None)
        return next(iter(kinds), None)

    @property
    def memory_model(self) -> bool:
        """Trains on ordered streams and carries a memory between steps."""
        return self.carried_state is not None

    def make_config(self, variant: str = "tiny", **overrides: Any) -> PreTrainedConfig:
        """Build the config of a named variant, with keyword overrides."""
        if variant not in self.variants:
            raise ValueError(f"{self.name} has no variant {variant!r}; choose one of {sorted(self.variants)}.")
        return self.config_class(**{**self.variants[variant], **overrides})

    def tiny_config(self, *, task: str | None = None, **overrides: Any) -> PreTrainedConfig:
        """The < 1M-parameter config the tests build (for ``task``: its `task_variants` entry, else ``"tiny"``)."""
        return self.make_config(self.task_variants.get(task, "tiny"), **overrides)


__all__ = ["ArchSpec", "CarriedState", "LazyClasses", "Task", "carried_state", "import_object"]
