"""CALM: what the architecture declares about itself (its `ArchSpec`, read by `tf_family.registry`)."""

from types import MappingProxyType

from ...spec import ArchSpec

_DECODER = {"hidden_act": "silu", "rms_norm_eps": 1e-6, "tie_word_embeddings": False}

SPEC = ArchSpec(
    name="calm",
    title="CALM early exit (Schuster et al. 2022)",
    model_type="tff_calm",
    config="tf_family.models.calm.configuration_calm:TffCalmConfig",
    models=MappingProxyType(
        {
            "base": "tf_family.models.calm.modeling_calm:TffCalmModel",
            "causal_lm": "tf_family.models.calm.modeling_calm:TffCalmForCausalLM",
        }
    ),
    variants=MappingProxyType(
        {
            "tiny": MappingProxyType(
                {
                    **_DECODER,
                    "vocab_size": 128,
                    "hidden_size": 32,
                    "intermediate_size": 64,
                    "num_hidden_layers": 4,
                    "num_attention_heads": 4,
                    "num_key_value_heads": 2,
                    "max_position_embeddings": 64,
                }
            ),
            # the benchmark's model: 8 layers of width 256 on the bundled 8k tokenizer, exits after every layer
            "small": MappingProxyType(
                {
                    **_DECODER,
                    "vocab_size": 8192,
                    "hidden_size": 256,
                    "intermediate_size": 688,
                    "num_hidden_layers": 8,
                    "num_attention_heads": 4,
                    "max_position_embeddings": 1024,
                }
            ),
        }
    ),
    lora_target_modules=("q_proj", "v_proj"),
    ia3_target_modules=("k_proj", "v_proj", "down_proj"),
    ia3_feedforward_modules=("down_proj",),
    exports=("tf_family.models.calm.modeling_calm:TffCalmPreTrainedModel",),
    options=(("Depth-Adaptive Transformer (Elbayad et al. 2020)", 'confidence_measure="halting" or "multinomial"'),),
    reference="transformers LlamaForCausalLM / GPT2LMHeadModel (same weights); exit rules from t5x contrib/calm",
    parity=(
        "no exit equals Llama's and GPT-2's logits and tokens; forced exits equal k layers + propagated K/V; "
        "bench (SOTU, δ = 0.1, bench/results/calm_sotu.md): 1.75x at batch 1, 1.71x at batch 8 (restricted_softmax, "
        "2 threads; floor 1.78x / 1.90x; 1 thread 1.60x / 1.52x)"
    ),
    card="calm.md",
    paper="2207.07061",
    foreign=(
        "tf_family.models.calm.convert_calm:TRANSFORMERS_LLAMA",
        "tf_family.models.calm.convert_calm:TRANSFORMERS_GPT2",
    ),
)

__all__ = ["SPEC"]
