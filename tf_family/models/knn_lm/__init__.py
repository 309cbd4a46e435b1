"""kNN-LM: what the architecture declares about itself (its `ArchSpec`, read by `tf_family.registry`)."""

from types import MappingProxyType

from ...spec import ArchSpec

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

SPEC = ArchSpec(
    name="knn_lm",
    title="kNN-LM (Khandelwal et al. 2020)",
    model_type="tff_knn_lm",
    config="tf_family.models.knn_lm.configuration_knn_lm:TffKNNLMConfig",
    models=MappingProxyType({"causal_lm": "tf_family.models.knn_lm.modeling_knn_lm:TffKNNLMForCausalLM"}),
    variants=MappingProxyType(
        {
            "tiny": MappingProxyType({"base_config": _TINY_LLAMA, "k": 8, "lmbda": 0.25}),
            # the paper's retrieval settings around whatever base model is given
            "paper": MappingProxyType({"k": 1024, "lmbda": 0.25, "knn_temperature": 1.0, "distance": "l2"}),
        }
    ),
    lora_target_modules=("q_proj", "v_proj"),
    ia3_target_modules=("k_proj", "v_proj", "down_proj"),
    ia3_feedforward_modules=("down_proj",),
    exports=("tf_family.models.knn_lm.modeling_knn_lm:TffKNNLMPreTrainedModel",),
    reference="none (wraps any AutoModelForCausalLM); lmbda=0 reproduces the base model",
    parity="lmbda=0 equals the base log-probs exactly; faiss Flat equals the exact torch search",
    card="knn_lm.md",
    paper="1911.00172",
)

__all__ = ["SPEC"]
