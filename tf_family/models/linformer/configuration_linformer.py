"""Configuration of the Linformer (Wang et al. 2020, arXiv:2006.04768)."""

from __future__ import annotations

from typing import Literal

from transformers import PreTrainedConfig

from ...modeling.configuration import NO_AUTO_MAP, check_config_kwargs, validate_config
from ...modeling.validation import check_positive_int, check_probability


class TffLinformerConfig(PreTrainedConfig):
    r"""Configuration of a Linformer encoder: pre-layer-norm blocks whose self-attention projects keys and values
    along the sequence axis, ``n -> k``, with learned matrices ``E`` and ``F`` (section 4), so that cost is linear in
    the length. Bidirectional only (the projection mixes all positions).

    Args:
        vocab_size (`int`, defaults to 30522): number of tokens.
        hidden_size (`int`, defaults to 512): width of the residual stream (``D``).
        num_hidden_layers (`int`, defaults to 6): number of layers (``L``).
        num_attention_heads (`int`, defaults to 8): attention heads (``H``); must divide `hidden_size`.
        intermediate_size (`int`, defaults to 2048): width of the feed-forward block.
        hidden_act (`str`, defaults to `"gelu"`): feed-forward activation (a key of `transformers.activations.ACT2FN`).
        hidden_dropout_prob (`float`, defaults to 0.1): dropout on embeddings and sub-layer outputs.
        attention_probs_dropout_prob (`float`, defaults to 0.1): dropout on attention probabilities.
        max_position_embeddings (`int`, defaults to 4096): ``n``, the longest input: learned positions and the rows of
            ``E`` and ``F``. Shorter inputs use the first rows (of their real tokens); longer ones are refused.
        projected_length (`int`, defaults to 256): ``k``, the projected sequence length (``k`` in the paper).
        projection_sharing (`str`, defaults to `"headwise"`): the paper's sharing of ``E`` and ``F`` (section 4):
            ``"none"`` (one ``E_i``, ``F_i`` per head and layer), ``"headwise"`` (one ``E``, ``F`` per layer, shared by
            its heads), ``"key_value"`` (also ``E = F``), ``"layerwise"`` (one ``E = F`` for every layer and head).
        type_vocab_size (`int`, defaults to 1): token types.
        initializer_range (`float`, defaults to 0.02): std of the normal init of linear layers and embeddings (``E``
            and ``F`` are uniform in ``[-1/sqrt(k), 1/sqrt(k)]``).
        layer_norm_eps (`float`, defaults to 1e-5): layer norm epsilon.
        pad_token_id (`int`, defaults to 0): the padding token.
        bos_token_id, eos_token_id (`int`, *optional*): the tokenizer's sequence start and end (the masked-LM
            recipe records its ``[CLS]`` and ``[SEP]`` here, as for the other encoders).
        classifier_dropout (`float`, *optional*): dropout of the classification heads; defaults to
            `hidden_dropout_prob`.
        tie_word_embeddings (`bool`, defaults to `True`): tie the masked-LM decoder to the input embeddings.
    """

    auto_map = NO_AUTO_MAP  # (a remote-code export's folder sets its own)
    model_type = "tff_linformer"

    vocab_size: int = 30522
    hidden_size: int = 512
    num_hidden_layers: int = 6
    num_attention_heads: int = 8
    intermediate_size: int = 2048
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 4096
    projected_length: int = 256
    projection_sharing: Literal["none", "headwise", "key_value", "layerwise"] = "headwise"
    type_vocab_size: int = 1
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-5
    pad_token_id: int | None = 0
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    classifier_dropout: float | None = None
    tie_word_embeddings: bool = True

    def __post_init__(self, **kwargs):
        check_config_kwargs(type(self).__name__, kwargs)
        super().__post_init__(**kwargs)
        validate_config(self)

    def validate_architecture(self):
        """Cross-field rules; each error names the field, the value and the rule."""
        for name in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
            "projected_length",
            "type_vocab_size",
        ):
            check_positive_int(name, getattr(self, name))
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} must be a multiple of num_attention_heads={self.num_attention_heads}."
            )
        if self.pad_token_id is None or self.pad_token_id < 0:
            raise ValueError(f"pad_token_id must be an int >= 0, got {self.pad_token_id}.")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            check_probability(name, getattr(self, name))
        check_probability("classifier_dropout", self.classifier_dropout, optional=True)


__all__ = ["TffLinformerConfig"]
