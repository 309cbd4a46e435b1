"""tf_family: a Hugging Face-compatible model zoo and fine-tuning toolkit for the Transformer family.

Importing the package registers every architecture with the transformers Auto classes (idempotent).
"""

from .auto import register_all
from .memory import CompressiveMemory, KNNMemory, MemorizingMemory, SegmentMemory
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

__all__ = [
    "ARCHITECTURES",
    "ArchSpec",
    "CompressiveMemory",
    "KNNMemory",
    "MemorizingMemory",
    "SegmentMemory",
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
