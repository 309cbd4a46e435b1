"""Register every architecture of the registry with the transformers Auto classes, and its default LoRA targets
with PEFT, through their public ``register`` calls and PEFT's public constant dicts.

``import tf_family`` registers the same entries as late as it can (`tf_family.lazy_auto`: the configs when
transformers' ``configuration_auto`` is imported, an architecture's model classes when its first config is built,
`register_models`); `register_all` registers them all now, importing every class. Idempotent: a second call, or a
call after the user registered the same classes (or their own LoRA targets for our model types), raises nothing.
"""

from __future__ import annotations

import functools

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForMultipleChoice,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

from .registry import ARCHITECTURES
from .spec import ArchSpec

AUTO_CLASS_BY_TASK = {
    "base": AutoModel,
    "causal_lm": AutoModelForCausalLM,
    "masked_lm": AutoModelForMaskedLM,
    "sequence_classification": AutoModelForSequenceClassification,
    "token_classification": AutoModelForTokenClassification,
    "question_answering": AutoModelForQuestionAnswering,
    "multiple_choice": AutoModelForMultipleChoice,
    # transformers registers its DecisionTransformerModel with AutoModel; ours follows
    "action": AutoModel,
}


def _legacy_class(spec: ArchSpec, legacy_config: type, tff_class: type) -> type:
    """A subclass of ``tff_class`` whose `config_class` is ``legacy_config``, so that the Auto classes route folders
    of the legacy model type to it; its `from_pretrained` returns the plain tf_family model (the architecture's
    foreign-checkpoint loader), and building it from a legacy config translates the config first
    (``legacy_config.to_tff_config()``)."""

    def _from_config(cls, config, **kwargs):
        return tff_class._from_config(config.to_tff_config(), **kwargs)

    # TffTransfoXLLMHeadModel -> TffTransfoXLLegacyLMHeadModel
    prefix = spec.config_class.__name__.removesuffix("Config")
    name = legacy_config.__name__.removesuffix("Config") + tff_class.__name__.removeprefix(prefix)
    return type(
        name,
        (tff_class,),
        {
            "config_class": legacy_config,
            "_tff_class": tff_class,
            "_from_config": classmethod(_from_config),
            "__module__": __name__,
        },
    )


@functools.cache
def legacy_model_class(legacy_config: type, task: str) -> type:
    """The model class that the Auto classes route ``legacy_config``'s folders of ``task`` to (built once, so
    that every registration registers the same class)."""
    spec = next(spec for spec in ARCHITECTURES.values() if legacy_config in spec.legacy_configs)
    return _legacy_class(spec, legacy_config, spec.model_classes[task])


def _register_model(auto_class: type, config_class: type, model_class: type, replace: bool) -> None:
    # ``in``: the Auto class's table read through its public mapping interface (the user's registration too)
    if replace or config_class not in auto_class._model_mapping:
        auto_class.register(config_class, model_class, exist_ok=True)


def register_models(spec: ArchSpec, *, replace: bool = True) -> None:
    """``AutoModel*.register`` for each task of ``spec`` (an Auto class per task: `AUTO_CLASS_BY_TASK`), for its
    config and for each legacy config (e.g. ``transfo-xl``, with `legacy_model_class`). With ``replace=False`` a config
    class an Auto class already maps (the user registered their own model class for it) is left as it is."""
    for task, model_class in spec.model_classes.items():
        if task in AUTO_CLASS_BY_TASK:
            _register_model(AUTO_CLASS_BY_TASK[task], spec.config_class, model_class, replace)
    for legacy_config in spec.legacy_configs:
        for task in spec.model_classes:
            if task in AUTO_CLASS_BY_TASK:
                model_class = legacy_model_class(legacy_config, task)
                _register_model(AUTO_CLASS_BY_TASK[task], legacy_config, model_class, replace)


def register_lora_targets() -> None:
    """Each spec's ``lora_target_modules`` as PEFT's default LoRA targets for its model types, so that
    ``LoraConfig(task_type=...)`` without ``target_modules`` adapts the attention projections as it does for
    transformers' own models. PEFT looks the default up by ``config.model_type`` in
    ``TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING`` (the dict `LoraModel.target_module_mapping` is); an entry
    already there (the user's) is kept."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as lora_targets

    for spec in ARCHITECTURES.values():
        for model_type in spec.model_types:
            lora_targets.setdefault(model_type, list(spec.lora_target_modules))


def register_ia3_targets() -> None:
    """Each spec's ``ia3_target_modules`` and ``ia3_feedforward_modules`` as PEFT's IA3 defaults for its model types
    (``TRANSFORMERS_MODELS_TO_IA3_TARGET_MODULES_MAPPING`` and ``..._FEEDFORWARD_MODULES_MAPPING``), so that
    ``IA3Config(task_type=...)`` works without ``target_modules``; an entry already there (the user's) is kept."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_IA3_FEEDFORWARD_MODULES_MAPPING as ia3_feedforward
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_IA3_TARGET_MODULES_MAPPING as ia3_targets

    for spec in ARCHITECTURES.values():
        for model_type in spec.model_types:
            if spec.ia3_target_modules and model_type not in ia3_targets:
                ia3_targets[model_type] = list(spec.ia3_target_modules)
                ia3_feedforward[model_type] = list(spec.ia3_feedforward_modules)


def register_all() -> None:
    """Register every registry entry (and its legacy model types, e.g. ``transfo-xl``) with AutoConfig and
    AutoModel* (`register_models`), and its default LoRA and IA3 targets with PEFT (`register_lora_targets`,
    `register_ia3_targets`)."""
    for spec in ARCHITECTURES.values():
        for config_class in (spec.config_class, *spec.legacy_configs):
            AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
        register_models(spec)
    register_lora_targets()
    register_ia3_targets()


__all__ = [
    "AUTO_CLASS_BY_TASK",
    "legacy_model_class",
    "register_all",
    "register_models",
    "register_ia3_targets",
    "register_lora_targets",
]
