"""tf_family: a Hugging Face-compatible model zoo and fine-tuning toolkit for the Transformer family.

Importing the package registers every architecture with the transformers Auto classes (idempotent), lazily: it
imports neither torch nor transformers (``tf-family --help`` starts in well under 2 s); its entries join
transformers' Auto tables when those are imported, and each class is imported the first time transformers reads it
(`tf_family.lazy_auto`). The public names below (``tf_family.TffLongformerModel``...) are imported on first use
(PEP 562). ``tf_family.register_all()`` registers everything now.
"""

import importlib
from typing import TYPE_CHECKING

from . import lazy_auto
from .registry import ARCHITECTURES, create_model, find_arch, get_arch, list_architectures
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

lazy_auto.install()

# public name -> the module (relative to this package) that defines it, imported on first use
_LAZY_NAMES = {
    "CompressiveMemory": ".memory",
    "KNNMemory": ".memory",
    "MemorizingMemory": ".memory",
    "SegmentMemory": ".memory",
    "TffBigBirdConfig": ".models.big_bird.configuration_big_bird",
    "TffBigBirdForMaskedLM": ".models.big_bird.modeling_big_bird",
    "TffBigBirdForMultipleChoice": ".models.big_bird.modeling_big_bird",
    "TffBigBirdForQuestionAnswering": ".models.big_bird.modeling_big_bird",
    "TffBigBirdForSequenceClassification": ".models.big_bird.modeling_big_bird",
    "TffBigBirdForTokenClassification": ".models.big_bird.modeling_big_bird",
    "TffBigBirdModel": ".models.big_bird.modeling_big_bird",
    "TffBigBirdPreTrainedModel": ".models.big_bird.modeling_big_bird",
    "TffCalmConfig": ".models.calm.configuration_calm",
    "TffCalmForCausalLM": ".models.calm.modeling_calm",
    "TffCalmModel": ".models.calm.modeling_calm",
    "TffCalmPreTrainedModel": ".models.calm.modeling_calm",
    "TffCompressiveConfig": ".models.compressive.configuration_compressive",
    "TffCompressiveLMHeadModel": ".models.compressive.modeling_compressive",
    "TffCompressiveModel": ".models.compressive.modeling_compressive",
    "TffCompressivePreTrainedModel": ".models.compressive.modeling_compressive",
    "TffDecisionTransformerConfig": ".models.decision_transformer.configuration_decision_transformer",
    "TffDecisionTransformerModel": ".models.decision_transformer.modeling_decision_transformer",
    "TffDecisionTransformerPreTrainedModel": ".models.decision_transformer.modeling_decision_transformer",
    "TffKNNLMConfig": ".models.knn_lm.configuration_knn_lm",
    "TffKNNLMForCausalLM": ".models.knn_lm.modeling_knn_lm",
    "TffKNNLMPreTrainedModel": ".models.knn_lm.modeling_knn_lm",
    "TffLongformerConfig": ".models.longformer.configuration_longformer",
    "TffLongformerForCausalLM": ".models.longformer.modeling_longformer",
    "TffLongformerForMaskedLM": ".models.longformer.modeling_longformer",
    "TffLongformerForMultipleChoice": ".models.longformer.modeling_longformer",
    "TffLongformerForQuestionAnswering": ".models.longformer.modeling_longformer",
    "TffLongformerForSequenceClassification": ".models.longformer.modeling_longformer",
    "TffLongformerForTokenClassification": ".models.longformer.modeling_longformer",
    "TffLongformerModel": ".models.longformer.modeling_longformer",
    "TffLongformerPreTrainedModel": ".models.longformer.modeling_longformer",
    "TffMemorizingConfig": ".models.memorizing.configuration_memorizing",
    "TffMemorizingForCausalLM": ".models.memorizing.modeling_memorizing",
    "TffMemorizingModel": ".models.memorizing.modeling_memorizing",
    "TffMemorizingPreTrainedModel": ".models.memorizing.modeling_memorizing",
    "TffReformerCache": ".models.reformer.cache_reformer",
    "TffReformerConfig": ".models.reformer.configuration_reformer",
    "TffReformerForCausalLM": ".models.reformer.modeling_reformer",
    "TffReformerForMaskedLM": ".models.reformer.modeling_reformer",
    "TffReformerForQuestionAnswering": ".models.reformer.modeling_reformer",
    "TffReformerForSequenceClassification": ".models.reformer.modeling_reformer",
    "TffReformerModel": ".models.reformer.modeling_reformer",
    "TffReformerPreTrainedModel": ".models.reformer.modeling_reformer",
    "TffTransfoXLConfig": ".models.transfo_xl.configuration_transfo_xl",
    "TffTransfoXLForSequenceClassification": ".models.transfo_xl.modeling_transfo_xl",
    "TffTransfoXLLMHeadModel": ".models.transfo_xl.modeling_transfo_xl",
    "TffTransfoXLModel": ".models.transfo_xl.modeling_transfo_xl",
    "TffTransfoXLPreTrainedModel": ".models.transfo_xl.modeling_transfo_xl",
    "TrajectoryContext": ".models.decision_transformer.modeling_decision_transformer",
    "register_all": ".auto",
    "register_pytree_nodes": ".memory",
}
# subpackages a bare `import tf_family` does not load, reachable as attributes all the same (`tf_family.data.load_sotu()`)
_LAZY_SUBMODULES = (
    "attention",
    "auto",
    "cards",
    "cli",
    "conversion",
    "data",
    "hub",
    "layers",
    "memory",
    "metrics",
    "retrieval",
    "training",
)


def __getattr__(name: str):
    if name in _LAZY_NAMES:
        value = getattr(importlib.import_module(_LAZY_NAMES[name], __name__), name)
        globals()[name] = value
        return value
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'tf_family' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY_NAMES, *_LAZY_SUBMODULES})


__all__ = [
    "ARCHITECTURES",
    "ArchSpec",
    "CompressiveMemory",
    "KNNMemory",
    "MemorizingMemory",
    "SegmentMemory",
    "TffCalmConfig",
    "TffCalmForCausalLM",
    "TffCalmModel",
    "TffCalmPreTrainedModel",
    "TffCompressiveConfig",
    "TffCompressiveLMHeadModel",
    "TffCompressiveModel",
    "TffCompressivePreTrainedModel",
    "TffDecisionTransformerConfig",
    "TffDecisionTransformerModel",
    "TffDecisionTransformerPreTrainedModel",
    "TffBigBirdConfig",
    "TffBigBirdForMaskedLM",
    "TffBigBirdForMultipleChoice",
    "TffBigBirdForQuestionAnswering",
    "TffBigBirdForSequenceClassification",
    "TffBigBirdForTokenClassification",
    "TffBigBirdModel",
    "TffBigBirdPreTrainedModel",
    "TffLongformerConfig",
    "TffReformerCache",
    "TffReformerConfig",
    "TffReformerForCausalLM",
    "TffReformerForMaskedLM",
    "TffReformerForQuestionAnswering",
    "TffReformerForSequenceClassification",
    "TffReformerModel",
    "TffReformerPreTrainedModel",
    "TffLongformerForCausalLM",
    "TffLongformerForMaskedLM",
    "TffLongformerForMultipleChoice",
    "TffLongformerForQuestionAnswering",
    "TffLongformerForSequenceClassification",
    "TffLongformerForTokenClassification",
    "TffLongformerModel",
    "TffLongformerPreTrainedModel",
    "TffKNNLMConfig",
    "TffKNNLMForCausalLM",
    "TffKNNLMPreTrainedModel",
    "TffMemorizingConfig",
    "TffMemorizingForCausalLM",
    "TffMemorizingModel",
    "TffMemorizingPreTrainedModel",
    "TffTransfoXLConfig",
    "TffTransfoXLForSequenceClassification",
    "TffTransfoXLLMHeadModel",
    "TffTransfoXLModel",
    "TffTransfoXLPreTrainedModel",
    "TrajectoryContext",
    "create_model",
    "find_arch",
    "get_arch",
    "list_architectures",
    "register_all",
    "register_pytree_nodes",
]
