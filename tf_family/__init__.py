"""tf_family: a Hugging Face-compatible model zoo and fine-tuning toolkit for the Transformer family.

Importing the package registers every architecture with the transformers Auto classes (idempotent), through their
public ``register`` calls and as late as it can: it imports neither torch nor transformers (``tf-family --help``
stays quick: bench/bench_startup.py); the configs are registered when transformers' ``configuration_auto`` is
imported, an architecture's model classes when its first config is built (`tf_family.lazy_auto`). The public names below (``tf_family.TffLongformerModel``...) are imported on first use
(PEP 562), each architecture's from its `ArchSpec` (config, model classes, ``exports``): a new architecture adds
nothing here (its names may join the ``TYPE_CHECKING`` block below for IDEs). ``tf_family.register_all()``
registers everything now.
"""

# ruff: noqa: F401 (the TYPE_CHECKING names are for static tools; ``__all__`` is built from the registry at run time)

import importlib
import os
from typing import TYPE_CHECKING

from . import lazy_auto
from .registry import ARCHITECTURES, create_model, find_arch, get_arch, list_architectures, public_names
from .spec import ArchSpec

if TYPE_CHECKING:  # the same names for static tools (type checkers, IDEs, the docs' mkdocstrings)
    from .auto import register_all
    from .memory import CompressiveMemory, KNNMemory, MemorizingMemory, SegmentMemory, register_pytree_nodes
    from .models.big_bird.configuration_big_bird import TffBigBirdConfig
    from .models.big_bird.modeling_big_bird import (
        TffBigBirdForMaskedLM,
        TffBigBirdForMultipleChoice,
        TffBigBirdForQuestionAnswering,
        TffBigBirdForSequenceClassification,
        TffBigBirdForTokenClassification,
        TffBigBirdModel,
        TffBigBirdPreTrainedModel,
    )
    from .models.calm.configuration_calm import TffCalmConfig
    from .models.calm.modeling_calm import TffCalmForCausalLM, TffCalmModel, TffCalmPreTrainedModel
    from .models.compressive.configuration_compressive import TffCompressiveConfig
    from .models.compressive.modeling_compressive import (
        TffCompressiveLMHeadModel,
        TffCompressiveModel,
        TffCompressivePreTrainedModel,
    )
    from .models.decision_transformer.configuration_decision_transformer import TffDecisionTransformerConfig
    from .models.decision_transformer.modeling_decision_transformer import (
        TffDecisionTransformerModel,
        TffDecisionTransformerPreTrainedModel,
        TrajectoryContext,
    )
    from .models.knn_lm.configuration_knn_lm import TffKNNLMConfig
    from .models.knn_lm.modeling_knn_lm import TffKNNLMForCausalLM, TffKNNLMPreTrainedModel
    from .models.linformer.configuration_linformer import TffLinformerConfig
    from .models.longformer.configuration_longformer import TffLongformerConfig
    from .models.longformer.modeling_longformer import (
        TffLongformerForCausalLM,
        TffLongformerForMaskedLM,
        TffLongformerForMultipleChoice,
        TffLongformerForQuestionAnswering,
        TffLongformerForSequenceClassification,
        TffLongformerForTokenClassification,
        TffLongformerModel,
        TffLongformerPreTrainedModel,
    )
    from .models.memorizing.configuration_memorizing import TffMemorizingConfig
    from .models.memorizing.modeling_memorizing import (
        TffMemorizingForCausalLM,
        TffMemorizingModel,
        TffMemorizingPreTrainedModel,
    )
    from .models.performer.configuration_performer import TffLinearTransformerConfig, TffPerformerConfig, TffRFAConfig
    from .models.reformer.cache_reformer import TffReformerCache
    from .models.reformer.configuration_reformer import TffReformerConfig
    from .models.reformer.modeling_reformer import (
        TffReformerForCausalLM,
        TffReformerForMaskedLM,
        TffReformerForQuestionAnswering,
        TffReformerForSequenceClassification,
        TffReformerModel,
        TffReformerPreTrainedModel,
    )
    from .models.transfo_xl.configuration_transfo_xl import TffTransfoXLConfig
    from .models.transfo_xl.modeling_transfo_xl import (
        TffTransfoXLForSequenceClassification,
        TffTransfoXLLMHeadModel,
        TffTransfoXLModel,
        TffTransfoXLPreTrainedModel,
    )

__version__ = "0.1.0"

# modules that moved into packages keep their old import paths (``tf_family.validation``...): see `tf_family._compat`
__path__.append(os.path.join(os.path.dirname(__file__), "_compat"))

lazy_auto.install()

# public name -> the module that defines it, imported on first use: each architecture's names come from its spec
# (config, model classes and `ArchSpec.exports`), so a new architecture adds none here
_LAZY_NAMES = {
    "CompressiveMemory": ".memory",
    "KNNMemory": ".memory",
    "MemorizingMemory": ".memory",
    "SegmentMemory": ".memory",
    "register_all": ".auto",
    "register_pytree_nodes": ".memory",
    **public_names(),
}
# subpackages a bare `import tf_family` does not load, reachable as attributes all the same (`tf_family.data.load_sotu()`)
_LAZY_SUBMODULES = (
    "attention",
    "auto",
    "cli",
    "conversion",
    "data",
    "layers",
    "memory",
    "metrics",
    "modeling",
    "retrieval",
    "shipping",
    "training",
    "utils",
    "cards",  # old paths (tf_family._compat): tf_family.shipping.cards, tf_family.shipping.hub
    "hub",
)


def __getattr__(name: str):
    if name in _LAZY_NAMES:
        value = getattr(importlib.import_module(_LAZY_NAMES[name], __package__), name)
        globals()[name] = value
        return value
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'tf_family' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY_NAMES, *_LAZY_SUBMODULES})


__all__ = [  # built from the registry, as `_LAZY_NAMES` is
    "ARCHITECTURES",
    "ArchSpec",
    "create_model",
    "find_arch",
    "get_arch",
    "list_architectures",
    *sorted(_LAZY_NAMES),
]
