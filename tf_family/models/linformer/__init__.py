"""Linformer: what the architecture declares about itself (its `ArchSpec`, read by `tf_family.registry`)."""

from types import MappingProxyType

from ...spec import ArchSpec

_MODULE = "tf_family.models.linformer.modeling_linformer"

SPEC = ArchSpec(
    name="linformer",
    title="Linformer (Wang et al. 2020)",
    model_type="tff_linformer",
    config="tf_family.models.linformer.configuration_linformer:TffLinformerConfig",
    models=MappingProxyType(
        {
            "base": f"{_MODULE}:TffLinformerModel",
            "masked_lm": f"{_MODULE}:TffLinformerForMaskedLM",
            "sequence_classification": f"{_MODULE}:TffLinformerForSequenceClassification",
            "token_classification": f"{_MODULE}:TffLinformerForTokenClassification",
        }
    ),
    variants=MappingProxyType(
        {
            "tiny": MappingProxyType(
                {
                    "vocab_size": 128,
                    "hidden_size": 16,
                    "num_hidden_layers": 2,
                    "num_attention_heads": 2,
                    "intermediate_size": 32,
                    "max_position_embeddings": 32,
                    "projected_length": 6,
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
                    "max_position_embeddings": 4096,
                    "projected_length": 256,
                }
            ),
            "base": MappingProxyType({}),
        }
    ),
    lora_target_modules=("query", "key", "value", "out_proj"),
    ia3_target_modules=("key", "value", "fc_out"),
    ia3_feedforward_modules=("fc_out",),
    exports=(f"{_MODULE}:TffLinformerPreTrainedModel",),
    reference="linformer 0.2.3 Linformer (copied weights)",
    parity="encoder outputs within 1e-5 on unpadded inputs, shorter than n too",
    card="linformer.md",
    paper="2006.04768",
)

__all__ = ["SPEC"]
