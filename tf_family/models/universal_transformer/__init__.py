"""Universal Transformer with ACT: what the architecture declares about itself (its `ArchSpec`, read by
`tf_family.registry`)."""

from types import MappingProxyType

from ...spec import ArchSpec

_MODELING = "tf_family.models.universal_transformer.modeling_universal_transformer"

SPEC = ArchSpec(
    name="universal_transformer",
    title="Universal Transformer with ACT (Dehghani et al. 2019)",
    model_type="tff_universal_transformer",
    config="tf_family.models.universal_transformer.configuration_universal_transformer:TffUniversalTransformerConfig",
    models=MappingProxyType(
        {
            "base": f"{_MODELING}:TffUniversalTransformerModel",
            "masked_lm": f"{_MODELING}:TffUniversalTransformerForMaskedLM",
            "causal_lm": f"{_MODELING}:TffUniversalTransformerForCausalLM",
            "sequence_classification": f"{_MODELING}:TffUniversalTransformerForSequenceClassification",
        }
    ),
    variants=MappingProxyType(
        {
            "tiny": MappingProxyType(
                {
                    "vocab_size": 128,
                    "hidden_size": 32,
                    "num_attention_heads": 2,
                    "intermediate_size": 64,
                    "act_max_steps": 4,
                    "hidden_dropout_prob": 0.0,
                    "attention_probs_dropout_prob": 0.0,
                }
            ),
            "small": MappingProxyType(
                {
                    "vocab_size": 32000,
                    "hidden_size": 256,
                    "num_attention_heads": 4,
                    "intermediate_size": 1024,
                    "act_max_steps": 8,
                }
            ),
            "base": MappingProxyType({}),
        }
    ),
    lora_target_modules=("query", "key", "value", "out_proj"),
    ia3_target_modules=("key", "value", "fc_out"),
    ia3_feedforward_modules=("fc_out",),
    exports=(f"{_MODELING}:TffUniversalTransformerPreTrainedModel",),
    reference="tensor2tensor universal_transformer_act (its halting rule, transcribed in the tests)",
    parity="ACT rule by rule against tensor2tensor's; cached == uncached decoding",
    card="universal_transformer.md",
    paper="1807.03819",
)

__all__ = ["SPEC"]
