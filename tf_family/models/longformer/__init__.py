"""Longformer: what the architecture declares about itself (its `ArchSpec`, read by `tf_family.registry`)."""

from types import MappingProxyType

from ...spec import ArchSpec

SPEC = ArchSpec(
    name="longformer",
    title="Longformer (Beltagy et al. 2020)",
    model_type="tff_longformer",
    config="tf_family.models.longformer.configuration_longformer:TffLongformerConfig",
    models=MappingProxyType(
        {
            "base": "tf_family.models.longformer.modeling_longformer:TffLongformerModel",
            "masked_lm": "tf_family.models.longformer.modeling_longformer:TffLongformerForMaskedLM",
            "causal_lm": "tf_family.models.longformer.modeling_longformer:TffLongformerForCausalLM",
            "sequence_classification": "tf_family.models.longformer.modeling_longformer:TffLongformerForSequenceClassification",
            "token_classification": "tf_family.models.longformer.modeling_longformer:TffLongformerForTokenClassification",
            "question_answering": "tf_family.models.longformer.modeling_longformer:TffLongformerForQuestionAnswering",
            "multiple_choice": "tf_family.models.longformer.modeling_longformer:TffLongformerForMultipleChoice",
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
    ia3_target_modules=("key", "value", "global_key", "global_value", "fc_out"),
    ia3_feedforward_modules=("fc_out",),
    exports=("tf_family.models.longformer.modeling_longformer:TffLongformerPreTrainedModel",),
    options=(
        ("Rotary positions (Su et al. 2021)", 'position_embedding_type="rotary"'),
        ("ALiBi (Press et al. 2022)", 'position_embedding_type="alibi"'),
    ),
    reference="transformers 5.24 LongformerModel and heads (random tiny checkpoints)",
    parity="outputs within 1e-4 in eval (windows, global tokens, odd lengths, padding)",
    card="longformer.md",
    paper="2004.05150",
    foreign=("tf_family.models.longformer.convert_longformer:TRANSFORMERS_LONGFORMER",),
)

__all__ = ["SPEC"]
