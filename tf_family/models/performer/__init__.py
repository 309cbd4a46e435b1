"""The kernelised-attention transformers: what each declares about itself (the `ArchSpec` specs of the Performer, the
Linear Transformer and Random Feature Attention, read by `tf_family.registry`). One modeling file serves the three:
they differ in the feature map (`TffPerformerConfig.feature_map`)."""

from types import MappingProxyType

from ...spec import ArchSpec

_MODULE = "tf_family.models.performer.modeling_performer"
_CONFIG = "tf_family.models.performer.configuration_performer"

# < 1M parameters, every feature exercised: 2 layers, 2 heads of width 8, chunks shorter than the tests' inputs
_TINY = {
    "vocab_size": 128,
    "hidden_size": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 32,
    "max_position_embeddings": 64,
    "num_random_features": 16,
    "chunk_size": 5,
    "hidden_dropout_prob": 0.0,
}
_SMALL = {
    "vocab_size": 32000,
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "intermediate_size": 1024,
    "max_position_embeddings": 16384,
}
_LORA = ("query", "key", "value", "out_proj")
_IA3 = ("key", "value", "fc_out")

SPEC = ArchSpec(
    name="performer",
    title="Performer, FAVOR+ (Choromanski et al. 2021)",
    model_type="tff_performer",
    config=f"{_CONFIG}:TffPerformerConfig",
    models=MappingProxyType(
        {
            "base": f"{_MODULE}:TffPerformerModel",
            "causal_lm": f"{_MODULE}:TffPerformerForCausalLM",
            "masked_lm": f"{_MODULE}:TffPerformerForMaskedLM",
            "sequence_classification": f"{_MODULE}:TffPerformerForSequenceClassification",
            "token_classification": f"{_MODULE}:TffPerformerForTokenClassification",
        }
    ),
    variants=MappingProxyType(
        {"tiny": MappingProxyType(_TINY), "small": MappingProxyType(_SMALL), "base": MappingProxyType({})}
    ),
    lora_target_modules=_LORA,
    ia3_target_modules=_IA3,
    ia3_feedforward_modules=("fc_out",),
    exports=(
        f"{_MODULE}:TffPerformerPreTrainedModel",
        "tf_family.models.performer.cache_performer:TffPerformerCache",
    ),
    reference="performer-pytorch 1.1.4 PerformerLM (same projection matrices, copied weights)",
    parity="encoder outputs within 1e-5; causal LM logits within 0.3 % (key stabiliser by design), same greedy tokens",
    card="performer.md",
    paper="2009.14794",
)

LINEAR_TRANSFORMER = ArchSpec(
    name="linear_transformer",
    title="Linear Transformer (Katharopoulos et al. 2020)",
    model_type="tff_linear_transformer",
    config=f"{_CONFIG}:TffLinearTransformerConfig",
    models=MappingProxyType(
        {"base": f"{_MODULE}:TffLinearTransformerModel", "causal_lm": f"{_MODULE}:TffLinearTransformerForCausalLM"}
    ),
    variants=MappingProxyType({"tiny": MappingProxyType(_TINY), "small": MappingProxyType(_SMALL)}),
    lora_target_modules=_LORA,
    ia3_target_modules=_IA3,
    ia3_feedforward_modules=("fc_out",),
    reference="its dense twin (explicit T x T weights of elu(x) + 1 features)",
    parity="chunked prefix sums and the recurrent step equal the dense twin (values and gradients)",
    card="linear_transformer.md",
    paper="2006.16236",
)

RFA = ArchSpec(
    name="rfa",
    title="Random Feature Attention, RFA-Gate (Peng et al. 2021)",
    model_type="tff_rfa",
    config=f"{_CONFIG}:TffRFAConfig",
    models=MappingProxyType({"base": f"{_MODULE}:TffRFAModel", "causal_lm": f"{_MODULE}:TffRFAForCausalLM"}),
    variants=MappingProxyType(
        {
            "tiny": MappingProxyType(_TINY),
            "small": MappingProxyType(_SMALL),
            "tiny-ungated": MappingProxyType({**_TINY, "rfa_gate": False}),
        }
    ),
    lora_target_modules=_LORA,
    ia3_target_modules=_IA3,
    ia3_feedforward_modules=("fc_out",),
    reference="its dense twin (explicit T x T gated weights of random Fourier features)",
    parity="gated chunked prefix sums and the recurrent step equal the dense twin (values and gradients)",
    card="rfa.md",
    paper="2103.02143",
)

__all__ = ["LINEAR_TRANSFORMER", "RFA", "SPEC"]
