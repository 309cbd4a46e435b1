"""SPALM: what the architecture declares about itself (its `ArchSpec`, read by `tf_family.registry`)."""

from types import MappingProxyType

from ...spec import ArchSpec

SPEC = ArchSpec(
    name="spalm",
    title="SPALM (Yogatama et al. 2021)",
    model_type="tff_spalm",
    config="tf_family.models.spalm.configuration_spalm:TffSpalmConfig",
    models=MappingProxyType(
        {
            "base": "tf_family.models.spalm.modeling_spalm:TffSpalmModel",
            "causal_lm": "tf_family.models.spalm.modeling_spalm:TffSpalmForCausalLM",
        }
    ),
    variants=MappingProxyType(
        {
            "tiny": MappingProxyType(
                {
                    "vocab_size": 128,
                    "d_model": 32,
                    "n_head": 2,
                    "d_head": 16,
                    "d_inner": 64,
                    "n_layer": 2,
                    "mem_len": 8,
                    "clamp_len": 16,
                    "same_length": False,
                    "dropout": 0.0,
                    "k": 4,
                }
            ),
            "small": MappingProxyType(
                {
                    "vocab_size": 8192,
                    "d_model": 256,
                    "n_head": 4,
                    "d_head": 64,
                    "d_inner": 1024,
                    "n_layer": 4,
                    "mem_len": 64,
                    "clamp_len": 512,
                    "same_length": False,
                    "dropout": 0.1,
                    "k": 32,
                }
            ),
        }
    ),
    lora_target_modules=("qkv", "out_proj"),
    ia3_target_modules=("qkv", "fc_out"),
    ia3_feedforward_modules=("fc_out",),
    exports=("tf_family.models.spalm.modeling_spalm:TffSpalmPreTrainedModel",),
    reference="none released; without a datastore it is tf_family's Transformer-XL (plain softmax)",
    parity="no datastore (or a gate fixed at 0) equals TffTransfoXLLMHeadModel on the same weights over 3 segments",
    card="spalm.md",
    paper="2102.02557",
)

__all__ = ["SPEC"]
