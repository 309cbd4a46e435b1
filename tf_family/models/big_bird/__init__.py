"""BigBird: what the architecture declares about itself (its `ArchSpec`, read by `tf_family.registry`)."""

from types import MappingProxyType

from ...spec import ArchSpec

SPEC = ArchSpec(
    name="big_bird",
    title="BigBird (Zaheer et al. 2020)",
    model_type="tff_big_bird",
    config="tf_family.models.big_bird.configuration_big_bird:TffBigBirdConfig",
    models=MappingProxyType(
        {
            "base": "tf_family.models.big_bird.modeling_big_bird:TffBigBirdModel",
            "masked_lm": "tf_family.models.big_bird.modeling_big_bird:TffBigBirdForMaskedLM",
            "sequence_classification": "tf_family.models.big_bird.modeling_big_bird:TffBigBirdForSequenceClassification",
            "token_classification": "tf_family.models.big_bird.modeling_big_bird:TffBigBirdForTokenClassification",
            "question_answering": "tf_family.models.big_bird.modeling_big_bird:TffBigBirdForQuestionAnswering",
            "multiple_choice": "tf_family.models.big_bird.modeling_big_bird:TffBigBirdForMultipleChoice",
        }
    ),
    variants=MappingProxyType(
        {
            # block 2 with one random block: inputs of >= 16 tokens take the block-sparse path
            "tiny": MappingProxyType(
                {
                    "vocab_size": 128,
                    "hidden_size": 32,
                    "num_hidden_layers": 2,
                    "num_attention_heads": 2,
                    "intermediate_size": 64,
                    "block_size": 2,
                    "num_random_blocks": 1,
                    "max_position_embeddings": 64,
                    "hidden_dropout_prob": 0.0,
                    "attention_probs_dropout_prob": 0.0,
                }
            ),
            "small": MappingProxyType(
                {
                    "vocab_size": 32000,
                    "hidden_size": 256,
                    "num_hidden_layers": 4,
                    "num_attention_heads": 4,
                    "intermediate_size": 1024,
                    "max_position_embeddings": 16384,
                }
            ),
            # the shapes of google/bigbird-roberta-base (the config defaults) and google/bigbird-roberta-large
            "roberta-base": MappingProxyType({}),
            "roberta-large": MappingProxyType(
                {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096}
            ),
        }
    ),
    lora_target_modules=("query", "key", "value", "out_proj"),
    ia3_target_modules=("key", "value", "fc_out"),
    ia3_feedforward_modules=("fc_out",),
    exports=("tf_family.models.big_bird.modeling_big_bird:TffBigBirdPreTrainedModel",),
    options=(
        ("ETC global-local attention (Ainslie et al. 2020)", 'attention_type="etc"'),
        ("Rotary positions (Su et al. 2021)", 'position_embedding_type="rotary"'),
        ("ALiBi (Press et al. 2022)", 'position_embedding_type="alibi", attention_type="original_full"'),
    ),
    reference="transformers 5.24 BigBirdModel and heads (random tiny checkpoints, eval)",
    parity="outputs within 1e-4 in eval, block-sparse and full paths (random blocks as transformers draws them in eval)",
    card="big_bird.md",
    paper="2007.14062",
    foreign=("tf_family.models.big_bird.convert_big_bird:TRANSFORMERS_BIG_BIRD",),
)

__all__ = ["SPEC"]
