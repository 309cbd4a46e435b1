"""Sparse Transformer: what the architecture declares about itself (its `ArchSpec`, read by `tf_family.registry`)."""

from types import MappingProxyType

from ...spec import ArchSpec

_MODELING = "tf_family.models.sparse_transformer.modeling_sparse_transformer"
_DIGITS = {
    "vocab_size": 17,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 128,
    "max_position_embeddings": 64,
}

SPEC = ArchSpec(
    name="sparse_transformer",
    title="Sparse Transformer, strided and fixed (Child et al. 2019); Image Transformer local 1-D / 2-D (Parmar et al. 2018)",
    model_type="tff_sparse_transformer",
    config="tf_family.models.sparse_transformer.configuration_sparse_transformer:TffSparseTransformerConfig",
    models=MappingProxyType(
        {
            "base": f"{_MODELING}:TffSparseTransformerModel",
            "causal_lm": f"{_MODELING}:TffSparseTransformerForCausalLM",
            "masked_lm": f"{_MODELING}:TffSparseTransformerForMaskedLM",
            "sequence_classification": f"{_MODELING}:TffSparseTransformerForSequenceClassification",
        }
    ),
    variants=MappingProxyType(
        {
            # strides of 3 and 4 over the tests' 12-24 tokens: every factor is sparse and lengths are not multiples
            "tiny": MappingProxyType(
                {
                    "vocab_size": 128,
                    "hidden_size": 32,
                    "num_hidden_layers": 2,
                    "num_attention_heads": 4,
                    "intermediate_size": 64,
                    "max_position_embeddings": 64,
                    "stride": 3,
                    "summary_size": 1,
                }
            ),
            "tiny-fixed": MappingProxyType(
                {
                    "vocab_size": 128,
                    "hidden_size": 32,
                    "num_hidden_layers": 2,
                    "num_attention_heads": 4,
                    "intermediate_size": 64,
                    "max_position_embeddings": 64,
                    "sparsity_pattern": "fixed",
                    "pattern_layout": "layers",
                    "stride": 4,
                    "summary_size": 1,
                    "position_embedding_type": "alibi",
                }
            ),
            # the Image Transformer's local attention (Parmar et al. 2018): 1-D raster blocks and 2-D rectangles
            "tiny-local-1d": MappingProxyType(
                {
                    "vocab_size": 128,
                    "hidden_size": 32,
                    "num_hidden_layers": 2,
                    "num_attention_heads": 2,
                    "intermediate_size": 64,
                    "max_position_embeddings": 64,
                    "sparsity_pattern": "local_1d",
                    "stride": 4,
                    "memory_length": 4,
                }
            ),
            "tiny-local-2d": MappingProxyType(
                {
                    "vocab_size": 128,
                    "hidden_size": 32,
                    "num_hidden_layers": 2,
                    "num_attention_heads": 2,
                    "intermediate_size": 64,
                    "max_position_embeddings": 64,
                    "sparsity_pattern": "local_2d",
                    "image_width": 4,
                    "block_height": 2,
                    "block_width": 2,
                    "memory_height": 1,
                    "memory_width": 1,
                }
            ),
            # 8x8 grey images (scikit-learn's digits: 17 intensities), equal memory of 32 positions for both
            "image-local-1d": MappingProxyType(
                {**_DIGITS, "sparsity_pattern": "local_1d", "stride": 8, "memory_length": 24}
            ),
            "image-local-2d": MappingProxyType(
                {
                    **_DIGITS,
                    "sparsity_pattern": "local_2d",
                    "image_width": 8,
                    "block_height": 2,
                    "block_width": 4,
                    "memory_height": 2,
                    "memory_width": 2,
                }
            ),
            # blockwise self-attention (Qiu et al. 2020): blocks of 3 (the tests' lengths are not multiples), head h
            # reads the block h back (block_shifts 0 .. 3) in the decoder, h blocks on (cyclically) in the encoder
            # heads, whose tests build this variant (task_variants)
            "tiny-blockwise": MappingProxyType(
                {
                    "vocab_size": 128,
                    "hidden_size": 32,
                    "num_hidden_layers": 2,
                    "num_attention_heads": 4,
                    "intermediate_size": 64,
                    "max_position_embeddings": 64,
                    "sparsity_pattern": "blockwise",
                    "stride": 3,
                }
            ),
            # enwik8-style byte model at 4,096 tokens: l = 64 = sqrt(T)
            "small": MappingProxyType(
                {
                    "vocab_size": 256,
                    "hidden_size": 256,
                    "num_hidden_layers": 4,
                    "num_attention_heads": 4,
                    "intermediate_size": 1024,
                    "max_position_embeddings": 4096,
                    "stride": 64,
                    "summary_size": 8,
                }
            ),
        }
    ),
    lora_target_modules=("q_proj", "v_proj"),
    ia3_target_modules=("k_proj", "v_proj", "fc_out"),
    ia3_feedforward_modules=("fc_out",),
    exports=(f"{_MODELING}:TffSparseTransformerPreTrainedModel",),
    options=(
        ("Blockwise self-attention (Qiu et al. 2020)", 'sparsity_pattern="blockwise"'),
        (
            "BlockBERT encoder: masked LM and classification heads (Qiu et al. 2020)",
            'sparsity_pattern="blockwise", causal=False',
        ),
        ("Rotary positions (Su et al. 2021)", 'position_embedding_type="rotary"'),
        ("ALiBi (Press et al. 2022)", 'position_embedding_type="alibi"'),
        ("DA-Transformer distance-aware positions (Wu et al. 2021)", 'position_embedding_type="distance_aware"'),
    ),
    reference="dense twin of every pattern (openai/sparse_attention get_attn_mask); no released weights",
    parity=(
        "efficient path equals the dense masked twin (values and gradients, 1e-10 in float64; decoder and blockwise "
        "encoder, padded); two-hop coverage proved; cached generation equals uncached"
    ),
    card="sparse_transformer.md",
    paper="1904.10509",
    # the encoder heads (BlockBERT) take the blockwise pattern only; "tiny" is the strided decoder
    task_variants=MappingProxyType({"masked_lm": "tiny-blockwise", "sequence_classification": "tiny-blockwise"}),
)

__all__ = ["SPEC"]
