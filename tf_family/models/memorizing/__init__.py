"""Memorizing Transformer: what the architecture declares about itself (its `ArchSpec`, read by `tf_family.registry`)."""

from types import MappingProxyType

from ...spec import ArchSpec

SPEC = ArchSpec(
    name="memorizing",
    title="Memorizing Transformer (Wu et al. 2022)",
    model_type="tff_memorizing",
    config="tf_family.models.memorizing.configuration_memorizing:TffMemorizingConfig",
    models=MappingProxyType(
        {
            "base": "tf_family.models.memorizing.modeling_memorizing:TffMemorizingModel",
            "causal_lm": "tf_family.models.memorizing.modeling_memorizing:TffMemorizingForCausalLM",
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
                    "dropout": 0.0,
                    "knn_layers": [1],
                    "knn_memory_size": 32,
                    "knn_top_k": 4,
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
                    "mem_len": 128,
                    "clamp_len": 512,
                    "dropout": 0.1,
                    "knn_memory_size": 8192,
                    "knn_top_k": 32,
                }
            ),
            # meliad's configuration: 12 layers of width 1024, 8 heads of 128, memory layer 9 of 12
            "base": MappingProxyType(
                {
                    "vocab_size": 32000,
                    "d_model": 1024,
                    "n_head": 8,
                    "d_head": 128,
                    "d_inner": 4096,
                    "n_layer": 12,
                    "mem_len": 512,
                    "knn_layers": [8],
                    "knn_memory_size": 8192,
                    "knn_top_k": 32,
                }
            ),
        }
    ),
    lora_target_modules=("qkv", "out_proj"),
    ia3_target_modules=("qkv", "fc_out"),
    ia3_feedforward_modules=("fc_out",),
    exports=("tf_family.models.memorizing.modeling_memorizing:TffMemorizingPreTrainedModel",),
    reference="google-research/meliad and lucidrains/memorizing-transformers-pytorch (read; no shared weights)",
    parity="gate closed equals TffTransfoXLLMHeadModel on the same weights; k >= memory equals dense attention",
    card="memorizing.md",
    paper="2203.08913",
)

__all__ = ["SPEC"]
