"""What one architecture declares about itself: its `ArchSpec`.

Each model folder's ``__init__.py`` builds one ``SPEC``; `tf_family.registry` puts them in one ordered table. This
module imports nothing of tf_family, so a model folder can declare its spec without importing the registry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from transformers import PreTrainedConfig, PreTrainedModel

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


def carried_state(model: Any) -> CarriedState:
    """The kind of state ``model`` (an instance or a class, ours or plain transformers) carries between calls."""
    return getattr(model, "carried_state", None)


@dataclass(frozen=True)
class ArchSpec:
    """Everything the toolkit needs to know about one architecture.

    Attributes:
        name: short name used on the command line (``--arch transfo_xl``).
        title: human name with the paper (for tables and cards).
        config_class: the `PreTrainedConfig` subclass; its ``model_type`` is registered with `AutoConfig`.
        model_classes: task -> model class; ``"base"`` is the headless model.
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
        legacy_configs: config classes of model types another library used for this architecture and no longer
            registers (``transfo-xl``); `tf_family.auto` registers each with the Auto classes, routing its folders
            to this architecture's model classes.
        foreign_formats: what ``tf-family convert`` reads from other implementations: checkpoint formats that the
            models' ``from_pretrained`` also reads (`tf_family.conversion.ForeignFormat`) and tokenizer files
            (`tf_family.conversion.ForeignTokenizer`).
    """

    name: str
    title: str
    config_class: type[PreTrainedConfig]
    model_classes: Mapping[str, type[PreTrainedModel]]
    variants: Mapping[str, Mapping[str, Any]]
    lora_target_modules: tuple[str, ...]
    reference: str
    parity: str
    card: str
    paper: str = ""
    legacy_configs: tuple[type[PreTrainedConfig], ...] = ()
    ia3_target_modules: tuple[str, ...] = ()
    ia3_feedforward_modules: tuple[str, ...] = ()
    foreign_formats: tuple[Any, ...] = ()

    @property
    def model_type(self) -> str:
        return self.config_class.model_type

    @property
    def legacy_model_types(self) -> tuple[str, ...]:
        return tuple(config.model_type for config in self.legacy_configs)

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

    def tiny_config(self, **overrides: Any) -> PreTrainedConfig:
        """The < 1M-parameter config the tests build."""
        return self.make_config("tiny", **overrides)


__all__ = ["ArchSpec", "CarriedState", "Task", "carried_state"]
