"""Transformer-XL: what the architecture declares about itself (its `ArchSpec`, read by `tf_family.registry`)."""

from types import MappingProxyType

from ...spec import ArchSpec

SPEC = ArchSpec(
    name="transfo_xl",
    title="Transformer-XL (Dai et al. 2019)",
    model_type="tff_transfo_xl",
    config="tf_family.models.transfo_xl.configuration_transfo_xl:TffTransfoXLConfig",
    models=MappingProxyType(
        {
            "base": "tf_family.models.transfo_xl.modeling_transfo_xl:TffTransfoXLModel",
            "causal_lm": "tf_family.models.transfo_xl.modeling_transfo_xl:TffTransfoXLLMHeadModel",
            "sequence_classification": "tf_family.models.transfo_xl.modeling_transfo_xl:TffTransfoXLForSequenceClassification",
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
    ia3_target_modules=("qkv", "fc_out"),
    ia3_feedforward_modules=("fc_out",),
    exports=("tf_family.models.transfo_xl.modeling_transfo_xl:TffTransfoXLPreTrainedModel",),
    options=(
        ("GTrXL (Parisotto et al. 2020)", 'gating="gru", pre_lnorm=True'),
        ("Adaptive Attention Span (Sukhbaatar et al. 2019)", "adaptive_span=True"),
    ),
    reference="transformers 4.35.2 TransfoXLLMHeadModel (committed fixtures)",
    parity="logits within 1e-5 over 3 segments with memory (3 configs)",
    card="transfo_xl.md",
    paper="1901.02860",
    legacy_model_types=("transfo-xl",),
    legacy=("tf_family.models.transfo_xl.convert_transfo_xl:TffTransfoXLLegacyConfig",),
    foreign=(
        "tf_family.models.transfo_xl.convert_transfo_xl:LEGACY_TRANSFO_XL",
        "tf_family.models.transfo_xl.convert_vocab:TRANSFO_XL_VOCAB",
    ),
)

__all__ = ["SPEC"]
