"""Register every architecture of the registry with the transformers Auto classes.

Runs on ``import tf_family``. Idempotent: a second call, or a call after the user registered the same classes,
changes nothing and raises nothing.
"""

from __future__ import annotations

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
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from .models.transfo_xl.convert_transfo_xl import TffTransfoXLLegacyConfig
from .models.transfo_xl.modeling_transfo_xl import (
    TffTransfoXLForSequenceClassification,
    TffTransfoXLLMHeadModel,
    TffTransfoXLModel,
)
from .registry import ARCHITECTURES

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


def _legacy_class(tff_class: type) -> type:
    """A subclass whose `config_class` is the 4.x config, so the Auto classes route ``transfo-xl`` folders to it;
    its `from_pretrained` returns the plain tf_family model (see `load_legacy_checkpoint`)."""

    def _from_config(cls, config, **kwargs):
        return tff_class._from_config(config.to_tff_config(), **kwargs)

    return type(
        tff_class.__name__.replace("TffTransfoXL", "TffTransfoXLLegacy"),
        (tff_class,),
        {
            "config_class": TffTransfoXLLegacyConfig,
            "_tff_class": tff_class,
            "_from_config": classmethod(_from_config),
            "__module__": __name__,
        },
    )


TffTransfoXLLegacyModel = _legacy_class(TffTransfoXLModel)
TffTransfoXLLegacyLMHeadModel = _legacy_class(TffTransfoXLLMHeadModel)
TffTransfoXLLegacyForSequenceClassification = _legacy_class(TffTransfoXLForSequenceClassification)
_LEGACY_MODELS = {
    "base": TffTransfoXLLegacyModel,
    "causal_lm": TffTransfoXLLegacyLMHeadModel,
    "sequence_classification": TffTransfoXLLegacyForSequenceClassification,
}


def _register_config(config_class: type) -> None:
    registered = CONFIG_MAPPING._extra_content.get(config_class.model_type)
    if registered is config_class:
        return
    AutoConfig.register(config_class.model_type, config_class, exist_ok=True)


def _register_model(auto_class: type, config_class: type, model_class: type) -> None:
    if auto_class._model_mapping._extra_content.get(config_class) is model_class:
        return
    auto_class.register(config_class, model_class, exist_ok=True)


def register_all() -> None:
    """Register every registry entry (and the legacy ``transfo-xl`` type) with AutoConfig and AutoModel*."""
    for spec in ARCHITECTURES.values():
        _register_config(spec.config_class)
        for task, model_class in spec.model_classes.items():
            if task in AUTO_CLASS_BY_TASK:
                _register_model(AUTO_CLASS_BY_TASK[task], spec.config_class, model_class)
    _register_config(TffTransfoXLLegacyConfig)
    for task, model_class in _LEGACY_MODELS.items():
        _register_model(AUTO_CLASS_BY_TASK[task], TffTransfoXLLegacyConfig, model_class)


__all__ = ["AUTO_CLASS_BY_TASK", "register_all"]
