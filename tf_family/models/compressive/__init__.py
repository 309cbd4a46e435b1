"""Compressive Transformer: what the architecture declares about itself (its `ArchSpec`, read by `tf_family.registry`)."""

from types import MappingProxyType

from ...spec import ArchSpec

SPEC = ArchSpec(
    name="compressive",
    title="Compressive Transformer (Rae et al. 2019)",
    model_type="tff_compressive",
    config="tf_family.models.compressive.configuration_compressive:TffCompressiveConfig",
    models=MappingProxyType(
        {
            "base": "tf_family.models.compressive.modeling_compressive:TffCompressiveModel",
            "causal_lm": "tf_family.models.compressive.modeling_compressive:TffCompressiveLMHeadModel",
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
    ia3_target_modules=("qkv", "fc_out"),
    ia3_feedforward_modules=("fc_out",),
    exports=("tf_family.models.compressive.modeling_compressive:TffCompressivePreTrainedModel",),
    reference="none released; cmem_len=0 reproduces tf_family Transformer-XL",
    parity="cmem_len=0 equals TffTransfoXLLMHeadModel on mapped weights (3 segments with memory)",
    card="compressive.md",
    paper="1911.05507",
)

__all__ = ["SPEC"]
