"""tf_family: a Hugging Face-compatible model zoo and fine-tuning toolkit for the Transformer family.

Importing the package registers every architecture with the transformers Auto classes (idempotent).
"""

import importlib

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
from .registry import ARCHITECTURES, create_model, find_arch, get_arch, list_architectures
from .spec import ArchSpec

__version__ = "0.1.0"

register_all()
register_pytree_nodes()  # torch.export traces the models that return a SegmentMemory / CompressiveMemory

# subpackages a bare `import tf_family` does not load, reachable as attributes all the same (`tf_family.data.load_sotu()`)
_LAZY_SUBMODULES = ("cards", "cli", "conversion", "data", "hub", "metrics", "retrieval", "training")


def __getattr__(name: str):
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'tf_family' has no attribute {name!r}")


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
]
