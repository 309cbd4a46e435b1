"""Routing Transformer: what the architecture declares about itself (its `ArchSpec`, read by `tf_family.registry`)."""

from types import MappingProxyType

from ...spec import ArchSpec

_MODELING = "tf_family.models.routing_transformer.modeling_routing_transformer"
_TINY = {
    "vocab_size": 128,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "num_local_heads": 2,
    "local_window": 4,
    "sparsity_skip_first": 1,
    "num_clusters": 3,
    "cluster_size": 4,
}

SPEC = ArchSpec(
    name="routing_transformer",
    title="Routing Transformer: local heads and k-means routing heads (Roy et al. 2021)",
    model_type="tff_routing_transformer",
    config="tf_family.models.routing_transformer.configuration_routing_transformer:TffRoutingTransformerConfig",
    models=MappingProxyType(
        {
            "base": f"{_MODELING}:TffRoutingTransformerModel",
            "causal_lm": f"{_MODELING}:TffRoutingTransformerForCausalLM",
        }
    ),
    variants=MappingProxyType(
        {
            # blocks of 4 and 3 clusters over the tests' 12-24 tokens; the first layer local only
            "tiny": MappingProxyType(_TINY),
            # the implementations' top-k clusters of 4 tokens (not causal in membership: no cached decoding)
            "tiny-balanced": MappingProxyType({**_TINY, "routing_membership": "balanced"}),
            # enwik8-style byte model at 4,096 tokens: k = w = 64 = sqrt(T)
            "small": MappingProxyType(
                {
                    "vocab_size": 256,
                    "hidden_size": 256,
                    "num_hidden_layers": 4,
                    "num_attention_heads": 4,
                    "intermediate_size": 1024,
                    "num_local_heads": 2,
                    "local_window": 256,
                    "sparsity_skip_first": 1,
                    "num_clusters": 64,
                    "cluster_size": 64,
                }
            ),
        }
    ),
    lora_target_modules=("local_qkv", "q_proj", "v_proj"),
    ia3_target_modules=("local_qkv", "v_proj", "fc_out"),
    ia3_feedforward_modules=("fc_out",),
    exports=(f"{_MODELING}:TffRoutingTransformerPreTrainedModel",),
    reference="lucidrains/routing-transformer 1.6.1 (RoutingTransformerLM, causal, shared QK)",
    parity=(
        "copied weights and centroids, balanced clusters, float64: logits within 1e-6, loss gradients within 1e-5, "
        "EMA-moved centroids within 1e-7 (reference's count + 1e-5 mean made exact; no commitment loss); gathered "
        "kernel equals the dense twin; cached generation equals uncached"
    ),
    card="routing_transformer.md",
    paper="2003.05997",
)

__all__ = ["SPEC"]
