"""Reformer: what the architecture declares about itself (its `ArchSpec`, read by `tf_family.registry`)."""

from types import MappingProxyType

from ...spec import ArchSpec

SPEC = ArchSpec(
    name="reformer",
    title="Reformer (Kitaev et al. 2020)",
    model_type="tff_reformer",
    config="tf_family.models.reformer.configuration_reformer:TffReformerConfig",
    models=MappingProxyType(
        {
            "base": "tf_family.models.reformer.modeling_reformer:TffReformerModel",
            "causal_lm": "tf_family.models.reformer.modeling_reformer:TffReformerForCausalLM",
            "masked_lm": "tf_family.models.reformer.modeling_reformer:TffReformerForMaskedLM",
            "sequence_classification": "tf_family.models.reformer.modeling_reformer:TffReformerForSequenceClassification",
            "question_answering": "tf_family.models.reformer.modeling_reformer:TffReformerForQuestionAnswering",
        }
    ),
    variants=MappingProxyType(
        {
            # local chunks of 4 (exercised at every test length); LSH chunks of 16 (the dense shared-QK path up to
            # 16 tokens, the hashed chunks beyond: the common tester's gradient check runs 24 tokens)
            "tiny": MappingProxyType(
                {
                    "vocab_size": 128,
                    "hidden_size": 32,
                    "attn_layers": ["local", "lsh"],
                    "num_attention_heads": 2,
                    "attention_head_size": 16,
                    "feed_forward_size": 64,
                    "local_attn_chunk_length": 4,
                    "lsh_attn_chunk_length": 16,
                    "num_hashes": 2,
                    "num_buckets": 4,
                    "axial_pos_shape": [8, 8],
                    "axial_pos_embds_dim": [16, 16],
                    "axial_norm_std": 0.02,
                    "hidden_dropout_prob": 0.0,
                    "local_attention_probs_dropout_prob": 0.0,
                }
            ),
            "small": MappingProxyType(
                {
                    "vocab_size": 32000,
                    "hidden_size": 256,
                    "attn_layers": ["local", "lsh"] * 2,
                    "num_attention_heads": 4,
                    "feed_forward_size": 1024,
                    "num_hashes": 2,
                    "axial_pos_shape": [128, 128],
                }
            ),
            # the shapes of google/reformer-crime-and-punishment and google/reformer-enwik8
            "crime-and-punishment": MappingProxyType(
                {
                    "attn_layers": ["local", "lsh"] * 3,
                    "num_attention_heads": 2,
                    "axial_pos_shape": [512, 1024],
                    "num_buckets": [64, 128],
                    "max_position_embeddings": 524288,
                    "causal": True,
                }
            ),
            "enwik8": MappingProxyType(
                {
                    "vocab_size": 258,
                    "hidden_size": 1024,
                    "attn_layers": [
                        "local",
                        "local",
                        "lsh",
                        "local",
                        "local",
                        "local",
                        "lsh",
                        "local",
                        "local",
                        "local",
                        "lsh",
                        "local",
                    ],
                    "num_attention_heads": 8,
                    "attention_head_size": 128,
                    "feed_forward_size": 4096,
                    "num_hashes": 4,
                    "num_buckets": 512,
                    "lsh_attn_chunk_length": 256,
                    "local_attn_chunk_length": 128,
                    "axial_pos_shape": [128, 512],
                    "axial_pos_embds_dim": [256, 768],
                    "max_position_embeddings": 65536,
                    "causal": True,
                }
            ),
        }
    ),
    lora_target_modules=("query_key", "query", "key", "value", "output"),
    ia3_target_modules=("query_key", "key", "value", "fc_out"),
    ia3_feedforward_modules=("fc_out",),
    reference="transformers 5.24 ReformerModel and heads (random tiny checkpoints)",
    parity="eval logits, training loss and gradients within 1e-5 (chunk_wrap_around)",
    card="reformer.md",
    paper="2001.04451",
    foreign=("tf_family.models.reformer.convert_reformer:TRANSFORMERS_REFORMER",),
)

__all__ = ["SPEC"]
