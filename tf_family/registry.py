"""The zoo's one table: an `ArchSpec` per architecture.

Everything that iterates over "all architectures" reads `ARCHITECTURES`: Auto registration (`tf_family.auto`),
the common tester (`tests/common/`), `tf-family list`, the README table and the recipes' ``--arch`` choices.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from transformers import PreTrainedConfig, PreTrainedModel

from .models.big_bird.configuration_big_bird import TffBigBirdConfig
from .models.big_bird.modeling_big_bird import (
    TffBigBirdForMaskedLM,
    TffBigBirdForMultipleChoice,
    TffBigBirdForQuestionAnswering,
    TffBigBirdForSequenceClassification,
    TffBigBirdForTokenClassification,
    TffBigBirdModel,
)
from .models.compressive.configuration_compressive import TffCompressiveConfig
from .models.compressive.modeling_compressive import TffCompressiveLMHeadModel, TffCompressiveModel
from .models.decision_transformer.configuration_decision_transformer import TffDecisionTransformerConfig
from .models.decision_transformer.modeling_decision_transformer import TffDecisionTransformerModel
from .models.knn_lm.configuration_knn_lm import TffKNNLMConfig
from .models.knn_lm.modeling_knn_lm import TffKNNLMForCausalLM
from .models.longformer.configuration_longformer import TffLongformerConfig
from .models.longformer.modeling_longformer import (
    TffLongformerForCausalLM,
    TffLongformerForMaskedLM,
    TffLongformerForMultipleChoice,
    TffLongformerForQuestionAnswering,
    TffLongformerForSequenceClassification,
    TffLongformerForTokenClassification,
    TffLongformerModel,
)
from .models.transfo_xl.configuration_transfo_xl import TffTransfoXLConfig
from .models.transfo_xl.modeling_transfo_xl import (
    TffTransfoXLForSequenceClassification,
    TffTransfoXLLMHeadModel,
    TffTransfoXLModel,
)

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


@dataclass(frozen=True)
class ArchSpec:
    """Everything the toolkit needs to know about one architecture.

    Attributes:
        name: short name used on the command line (``--arch transfo_xl``).
        title: human name with the paper (for tables and cards).
        config_class: the `PreTrainedConfig` subclass; its ``model_type`` is registered with `AutoConfig`.
        model_classes: task -> model class; ``"base"`` is the headless model.
        variants: named config overrides; ``"tiny"`` (< 1M parameters) is what the tests build.
        lora_target_modules: default PEFT LoRA targets (PEFT knows no defaults for our model types).
        reference: the implementation parity is checked against.
        parity: what the parity tests establish, in a few words.
        card: model card template, relative to the repository's ``model_cards/``.
        memory_model: trains on ordered streams and carries a segment memory (`mems`) between steps.
        paper: arXiv id of the paper.
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
    memory_model: bool = False
    paper: str = ""
    legacy_model_types: tuple[str, ...] = field(default=())

    @property
    def model_type(self) -> str:
        return self.config_class.model_type

    @property
    def tasks(self) -> tuple[str, ...]:
        return tuple(task for task in self.model_classes if task != "base")

    def make_config(self, variant: str = "tiny", **overrides: Any) -> PreTrainedConfig:
        """Build the config of a named variant, with keyword overrides."""
        if variant not in self.variants:
            raise ValueError(f"{self.name} has no variant {variant!r}; choose one of {sorted(self.variants)}.")
        return self.config_class(**{**self.variants[variant], **overrides})

    def tiny_config(self, **overrides: Any) -> PreTrainedConfig:
        """The < 1M-parameter config the tests build."""
        return self.make_config("tiny", **overrides)


_TRANSFO_XL = ArchSpec(
    name="transfo_xl",
    title="Transformer-XL (Dai et al. 2019)",
    config_class=TffTransfoXLConfig,
    model_classes=MappingProxyType(
        {
            "base": TffTransfoXLModel,
            "causal_lm": TffTransfoXLLMHeadModel,
            "sequence_classification": TffTransfoXLForSequenceClassification,
        }
    ),
    variants=MappingProxyType(
        {
            "tiny": MappingProxyType(
                {
                    "vocab_size": 128,
                    "cutoffs": [32, 64],
                    "div_val": 2,
                    "d_model": 32,
                    "d_embed": 32,
                    "n_head": 2,
                    "d_head": 16,
                    "d_inner": 64,
                    "n_layer": 2,
                    "mem_len": 8,
                    "clamp_len": 16,
                    "same_length": False,
                    "dropout": 0.0,
                }
            ),
            "small": MappingProxyType(
                {
                    "vocab_size": 8192,
                    "cutoffs": [],
                    "div_val": 1,
                    "d_model": 256,
                    "n_head": 4,
                    "d_head": 64,
                    "d_inner": 1024,
                    "n_layer": 4,
                    "mem_len": 128,
                    "clamp_len": 512,
                    "same_length": False,
                    "dropout": 0.1,
                }
            ),
            "base": MappingProxyType(
                {
                    "vocab_size": 32000,
                    "cutoffs": [],
                    "div_val": 1,
                    "d_model": 512,
                    "n_head": 8,
                    "d_head": 64,
                    "d_inner": 2048,
                    "n_layer": 12,
                    "mem_len": 256,
                    "clamp_len": 1000,
                    "same_length": False,
                    "dropout": 0.1,
                }
            ),
            # the shape of transfo-xl/transfo-xl-wt103 (the config defaults)
            "wt103": MappingProxyType({}),
        }
    ),
    lora_target_modules=("qkv", "out_proj"),
    reference="transformers 4.35.2 TransfoXLLMHeadModel (committed fixtures)",
    parity="logits within 1e-5 over 3 segments with memory (3 configs)",
    card="transfo_xl.md",
    memory_model=True,
    paper="1901.02860",
    legacy_model_types=("transfo-xl",),
)

_COMPRESSIVE = ArchSpec(
    name="compressive",
    title="Compressive Transformer (Rae et al. 2019)",
    config_class=TffCompressiveConfig,
    model_classes=MappingProxyType({"base": TffCompressiveModel, "causal_lm": TffCompressiveLMHeadModel}),
    variants=MappingProxyType(
        {
            "tiny": MappingProxyType(
                {
                    "vocab_size": 128,
                    "cutoffs": [32, 64],
                    "div_val": 2,
                    "d_model": 32,
                    "d_embed": 32,
                    "n_head": 2,
                    "d_head": 16,
                    "d_inner": 64,
                    "n_layer": 2,
                    "mem_len": 8,
                    "cmem_len": 4,
                    "compression_rate": 2,
                    "compression": "conv",
                    "clamp_len": 16,
                    "same_length": False,
                    "dropout": 0.0,
                }
            ),
            "small": MappingProxyType(
                {
                    "vocab_size": 8192,
                    "cutoffs": [],
                    "div_val": 1,
                    "d_model": 256,
                    "n_head": 4,
                    "d_head": 64,
                    "d_inner": 1024,
                    "n_layer": 4,
                    "mem_len": 64,
                    "cmem_len": 64,
                    "compression_rate": 2,
                    "clamp_len": 512,
                    "same_length": False,
                    "dropout": 0.1,
                }
            ),
            "base": MappingProxyType(
                {
                    "vocab_size": 32000,
                    "cutoffs": [],
                    "div_val": 1,
                    "d_model": 512,
                    "n_head": 8,
                    "d_head": 64,
                    "d_inner": 2048,
                    "n_layer": 12,
                    "mem_len": 128,
                    "cmem_len": 128,
                    "compression_rate": 3,
                    "clamp_len": 1000,
                    "same_length": False,
                    "dropout": 0.1,
                }
            ),
        }
    ),
    lora_target_modules=("qkv", "out_proj"),
    reference="none released; cmem_len=0 reproduces tf_family Transformer-XL",
    parity="cmem_len=0 equals TffTransfoXLLMHeadModel on mapped weights (3 segments with memory)",
    card="compressive.md",
    memory_model=True,
    paper="1911.05507",
)

_DECISION_TRANSFORMER = ArchSpec(
    name="decision_transformer",
    title="Decision Transformer (Chen et al. 2021)",
    config_class=TffDecisionTransformerConfig,
    model_classes=MappingProxyType({"action": TffDecisionTransformerModel}),
    variants=MappingProxyType(
        {
            "tiny": MappingProxyType(
                {
                    "state_dim": 5,
                    "act_dim": 3,
                    "context_length": 8,
                    "max_ep_len": 64,
                    "hidden_size": 32,
                    "n_layer": 2,
                    "n_head": 2,
                    "resid_pdrop": 0.0,
                    "embd_pdrop": 0.0,
                    "attn_pdrop": 0.0,
                    # the auxiliary heads are on (and trained) so that the tests reach every parameter
                    "predict_state": True,
                    "predict_return": True,
                    "state_loss_weight": 0.5,
                    "return_loss_weight": 0.5,
                }
            ),
            # LunarLander-v3 from tf_family.data.offline_rl: 8-d states, 4 discrete actions, 1000-step episodes
            "small": MappingProxyType(
                {
                    "state_dim": 8,
                    "act_dim": 4,
                    "action_space": "discrete",
                    "action_tanh": False,
                    "context_length": 20,
                    "max_ep_len": 1000,
                    "hidden_size": 128,
                    "n_layer": 3,
                    "n_head": 1,
                    "return_scale": 100.0,
                    "env_id": "LunarLander-v3",
                }
            ),
            # the shape of edbeeching/decision-transformer-gym-hopper-* (transformers' checkpoints)
            "hopper": MappingProxyType(
                {
                    "state_dim": 11,
                    "act_dim": 3,
                    "max_ep_len": 1000,
                    "hidden_size": 128,
                    "n_layer": 3,
                    "n_head": 1,
                    "predict_state": True,
                    "predict_return": True,
                    "return_scale": 1000.0,
                    "target_return": 3600.0,
                    "env_id": "Hopper-v5",
                }
            ),
        }
    ),
    lora_target_modules=("qkv", "out_proj", "fc_in", "fc_out"),
    reference="transformers 5 DecisionTransformerModel (installed)",
    parity="state/action/return predictions within 1e-5 (random tiny model, converted folder)",
    card="decision_transformer.md",
    paper="2106.01345",
)

_LONGFORMER = ArchSpec(
    name="longformer",
    title="Longformer (Beltagy et al. 2020)",
    config_class=TffLongformerConfig,
    model_classes=MappingProxyType(
        {
            "base": TffLongformerModel,
            "masked_lm": TffLongformerForMaskedLM,
            "causal_lm": TffLongformerForCausalLM,
            "sequence_classification": TffLongformerForSequenceClassification,
            "token_classification": TffLongformerForTokenClassification,
            "question_answering": TffLongformerForQuestionAnswering,
            "multiple_choice": TffLongformerForMultipleChoice,
        }
    ),
    variants=MappingProxyType(
        {
            "tiny": MappingProxyType(
                {
                    "vocab_size": 128,
                    "hidden_size": 32,
                    "num_hidden_layers": 2,
                    "num_attention_heads": 2,
                    "intermediate_size": 64,
                    "attention_window": [4, 6],
                    "attention_dilation": [1, 2],
                    "max_position_embeddings": 64,
                    "hidden_dropout_prob": 0.0,
                    "attention_probs_dropout_prob": 0.0,
                }
            ),
            "small": MappingProxyType(
                {
                    "vocab_size": 32000,
                    "hidden_size": 256,
                    "num_hidden_layers": 4,
                    "num_attention_heads": 4,
                    "intermediate_size": 1024,
                    "attention_window": 256,
                    "max_position_embeddings": 16386,
                }
            ),
            # the shapes of allenai/longformer-base-4096 (the config defaults) and allenai/longformer-large-4096
            "base-4096": MappingProxyType({}),
            "large-4096": MappingProxyType(
                {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096}
            ),
        }
    ),
    lora_target_modules=("query", "key", "value", "out_proj"),
    reference="transformers 5.23 LongformerModel and heads (random tiny checkpoints)",
    parity="outputs within 1e-4 in eval (windows, global tokens, odd lengths, padding)",
    card="longformer.md",
    paper="2004.05150",
)

_BIG_BIRD = ArchSpec(
    name="big_bird",
    title="BigBird (Zaheer et al. 2020)",
    config_class=TffBigBirdConfig,
    model_classes=MappingProxyType(
        {
            "base": TffBigBirdModel,
            "masked_lm": TffBigBirdForMaskedLM,
            "sequence_classification": TffBigBirdForSequenceClassification,
            "token_classification": TffBigBirdForTokenClassification,
            "question_answering": TffBigBirdForQuestionAnswering,
            "multiple_choice": TffBigBirdForMultipleChoice,
        }
    ),
    variants=MappingProxyType(
        {
            # block 2 with one random block: inputs of >= 16 tokens take the block-sparse path
            "tiny": MappingProxyType(
                {
                    "vocab_size": 128,
                    "hidden_size": 32,
                    "num_hidden_layers": 2,
                    "num_attention_heads": 2,
                    "intermediate_size": 64,
                    "block_size": 2,
                    "num_random_blocks": 1,
                    "max_position_embeddings": 64,
                    "hidden_dropout_prob": 0.0,
                    "attention_probs_dropout_prob": 0.0,
                }
            ),
            "small": MappingProxyType(
                {
                    "vocab_size": 32000,
                    "hidden_size": 256,
                    "num_hidden_layers": 4,
                    "num_attention_heads": 4,
                    "intermediate_size": 1024,
                    "max_position_embeddings": 16384,
                }
            ),
            # the shapes of google/bigbird-roberta-base (the config defaults) and google/bigbird-roberta-large
            "roberta-base": MappingProxyType({}),
            "roberta-large": MappingProxyType(
                {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096}
            ),
        }
    ),
    lora_target_modules=("query", "key", "value", "out_proj"),
    reference="transformers 5.23 BigBirdModel and heads (random tiny checkpoints, eval)",
    parity="outputs within 1e-4 in eval, block-sparse and full paths (random blocks as transformers draws them in eval)",
    card="big_bird.md",
    paper="2007.14062",
)

# a tiny Llama (RoPE: relative positions, so left padding changes nothing) as the wrapped base model
_TINY_LLAMA = {
    "model_type": "llama",
    "vocab_size": 128,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "tie_word_embeddings": False,
}

_KNN_LM = ArchSpec(
    name="knn_lm",
    title="kNN-LM (Khandelwal et al. 2020)",
    config_class=TffKNNLMConfig,
    model_classes=MappingProxyType({"causal_lm": TffKNNLMForCausalLM}),
    variants=MappingProxyType(
        {
            "tiny": MappingProxyType({"base_config": _TINY_LLAMA, "k": 8, "lmbda": 0.25}),
            # the paper's retrieval settings around whatever base model is given
            "paper": MappingProxyType({"k": 1024, "lmbda": 0.25, "knn_temperature": 1.0, "distance": "l2"}),
        }
    ),
    lora_target_modules=("q_proj", "v_proj"),
    reference="none (wraps any AutoModelForCausalLM); lmbda=0 reproduces the base model",
    parity="lmbda=0 equals the base log-probs exactly; faiss Flat equals the exact torch search",
    card="knn_lm.md",
    paper="1911.00172",
)

ARCHITECTURES: Mapping[str, ArchSpec] = MappingProxyType(
    {spec.name: spec for spec in (_TRANSFO_XL, _COMPRESSIVE, _LONGFORMER, _BIG_BIRD, _KNN_LM, _DECISION_TRANSFORMER)}
)


def list_architectures() -> list[str]:
    """Names of every architecture in the zoo, in table order."""
    return list(ARCHITECTURES)


def get_arch(name: str) -> ArchSpec:
    """The `ArchSpec` called ``name``, or a `ValueError` listing the valid names."""
    try:
        return ARCHITECTURES[name]
    except KeyError:
        raise ValueError(f"Unknown architecture {name!r}; choose one of {list_architectures()}.") from None


def create_model(
    name: str, task: str = "causal_lm", variant: str = "tiny", **config_overrides: Any
) -> PreTrainedModel:
    """Build a randomly initialised model: ``create_model("transfo_xl", "causal_lm", "small", mem_len=256)``."""
    spec = get_arch(name)
    if task not in spec.model_classes:
        raise ValueError(f"{name} has no {task!r} model; its tasks are {list(spec.model_classes)}.")
    return spec.model_classes[task](spec.make_config(variant, **config_overrides))


__all__ = ["ARCHITECTURES", "ArchSpec", "Task", "create_model", "get_arch", "list_architectures"]
