"""Configuration of Longformer (Beltagy, Peters & Cohan 2020, arXiv:2004.05150)."""

from __future__ import annotations

from typing import Literal

from transformers import PreTrainedConfig

from ...modeling.configuration import NO_AUTO_MAP, check_config_kwargs, validate_config
from ...modeling.validation import MAX_SIZE, check_float, check_list_of, check_positive_int, check_probability

POSITION_EMBEDDING_TYPES = ("absolute", "rotary", "alibi")


class TffLongformerConfig(PreTrainedConfig):
    r"""Configuration of a Longformer: a RoBERTa-style encoder whose self-attention is a sliding window plus global
    tokens, so that cost grows linearly with the length.

    Defaults reproduce `allenai/longformer-base-4096`.

    Args:
        vocab_size (`int`, defaults to 50265): number of tokens.
        hidden_size (`int`, defaults to 768): width of the residual stream (``D``).
        num_hidden_layers (`int`, defaults to 12): number of layers (``L``).
        num_attention_heads (`int`, defaults to 12): attention heads (``H``); must divide `hidden_size`.
        intermediate_size (`int`, defaults to 3072): width of the feed-forward block.
        hidden_act (`str`, defaults to `"gelu"`): feed-forward activation (a key of `transformers.activations.ACT2FN`).
        hidden_dropout_prob (`float`, defaults to 0.1): dropout on embeddings and sub-layer outputs.
        attention_probs_dropout_prob (`float`, defaults to 0.1): dropout on attention probabilities.
        max_position_embeddings (`int`, defaults to 4098): learned positions; positions start at
            ``pad_token_id + 1`` as in RoBERTa, so the longest input is ``max_position_embeddings - pad_token_id - 1``.
        type_vocab_size (`int`, defaults to 1): token types.
        initializer_range (`float`, defaults to 0.02): std of the normal init of linear layers and embeddings.
        layer_norm_eps (`float`, defaults to 1e-5): layer norm epsilon.
        attention_window (`int` or `list[int]`, defaults to 512): window ``w`` of every layer (or one per layer), in
            tokens: a query sees ``w / 2`` keys on each side (causal: the ``w / 2`` keys before it) and itself
            (``w`` in the paper, section 3.1). Must be even and positive.
        attention_dilation (`int` or `list[int]`, defaults to 1): gap ``d`` between window positions, per layer or
            for all (the paper's dilated sliding window; the window then spans ``d * w`` tokens).
        causal (`bool`, defaults to `False`): causal windows and causal global attention (a decoder);
            `TffLongformerForCausalLM` sets it.
        pad_token_id (`int`, defaults to 1): the padding token.
        bos_token_id (`int`, defaults to 0): the beginning-of-sequence token.
        eos_token_id (`int`, defaults to 2): the end-of-sequence token.
        sep_token_id (`int`, defaults to 2): the separator; it ends the question for the question-answering and
            multiple-choice global-attention rule.
        classifier_dropout (`float`, *optional*): dropout of the classification heads; defaults to
            `hidden_dropout_prob`.
        tie_word_embeddings (`bool`, defaults to `True`): tie the language-model decoder to the input embeddings.
        attention_mode (`str`, defaults to `"auto"`): ``"sparse"`` always runs the chunked window kernel,
            ``"dense"`` the dense-mask reference (quadratic; what `output_attentions=True` uses), ``"auto"`` picks
            per call: dense when every window covers the whole (short) input, sparse otherwise. Outputs agree.
        position_embedding_type (`str`, defaults to `"absolute"`): ``"absolute"`` (RoBERTa's learned table, up to
            `max_position_embeddings`: the only option of converted transformers / allenai checkpoints, whose
            weights hold that table), ``"rotary"`` (Su et al. 2021, Llama's pairing, dimension ``k`` with
            ``k + Dh / 2``: the window queries and keys rotated by their positions counted over real tokens; the
            global tokens' own projections are not rotated) or ``"alibi"`` (Press et al. 2022: head ``h`` adds
            ``-m_h * |i - j|`` to a window pair, ``|i - j|`` the distance in the sequence, dilation included; no bias
            on pairs with a global key nor on the global tokens' own rows: `tf_family.attention.sliding_window`).
            Rotary and ALiBi models have no position table, so `max_position_embeddings` does not limit their input.
        rope_base (`float`, defaults to 10000.0): the rotary base θ (``"rotary"`` only).
    """

    auto_map = NO_AUTO_MAP  # (a remote-code export's folder sets its own)
    model_type = "tff_longformer"

    vocab_size: int = 50265
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 4098
    type_vocab_size: int = 1
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-5
    attention_window: int | list[int] = 512
    attention_dilation: int | list[int] = 1
    causal: bool = False
    attention_mode: Literal["auto", "sparse", "dense"] = "auto"
    pad_token_id: int | None = 1
    bos_token_id: int | None = 0
    eos_token_id: int | list[int] | None = 2
    sep_token_id: int | None = 2
    classifier_dropout: float | None = None
    tie_word_embeddings: bool = True
    position_embedding_type: Literal["absolute", "rotary", "alibi"] = "absolute"
    rope_base: float = 10000.0

    def __post_init__(self, **kwargs):
        check_config_kwargs(type(self).__name__, kwargs)
        super().__post_init__(**kwargs)
        validate_config(self)

    def layer_windows(self) -> list[int]:
        """The window ``w`` of every layer."""
        window = self.attention_window
        return list(window) if isinstance(window, (list, tuple)) else [window] * self.num_hidden_layers

    def layer_dilations(self) -> list[int]:
        """The dilation ``d`` of every layer."""
        dilation = self.attention_dilation
        return list(dilation) if isinstance(dilation, (list, tuple)) else [dilation] * self.num_hidden_layers

    def validate_architecture(self):
        """Cross-field rules; each error names the field, the value and the rule."""
        for name in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
            "type_vocab_size",
        ):
            check_positive_int(name, getattr(self, name))
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} must be a multiple of num_attention_heads={self.num_attention_heads}."
            )
        for name, values in (
            ("attention_window", self.layer_windows()),
            ("attention_dilation", self.layer_dilations()),
        ):
            if len(values) != self.num_hidden_layers:
                raise ValueError(
                    f"{name} has {len(values)} entries but num_hidden_layers={self.num_hidden_layers}; give one value "
                    "per layer or a single int."
                )
        bad = [w for w in self.layer_windows() if w <= 0 or w % 2 or w > MAX_SIZE]
        if bad:
            raise ValueError(f"attention_window values must be even and > 0 (w / 2 keys per side), got {bad}.")
        check_list_of("attention_dilation", self.layer_dilations(), check_positive_int)
        if self.pad_token_id is None or self.pad_token_id < 0:
            raise ValueError(f"pad_token_id must be an int >= 0 (positions start after it), got {self.pad_token_id}.")
        if self.pad_token_id + 2 > self.max_position_embeddings:
            raise ValueError(
                f"max_position_embeddings={self.max_position_embeddings} leaves no position after "
                f"pad_token_id={self.pad_token_id}; positions start at pad_token_id + 1."
            )
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            check_probability(name, getattr(self, name))
        check_probability("classifier_dropout", self.classifier_dropout, optional=True)
        if self.position_embedding_type not in POSITION_EMBEDDING_TYPES:
            raise ValueError(
                f"position_embedding_type must be one of {POSITION_EMBEDDING_TYPES}, got "
                f"{self.position_embedding_type!r} ('absolute' is the only one of converted checkpoints)."
            )
        if self.position_embedding_type == "rotary" and (self.hidden_size // self.num_attention_heads) % 2:
            raise ValueError(
                f"position_embedding_type='rotary' rotates pairs: the head width "
                f"{self.hidden_size // self.num_attention_heads} (hidden_size / num_attention_heads) is odd."
            )
        check_float("rope_base", self.rope_base, minimum=0.0, min_open=True, fix="set rope_base > 0, e.g. 10000")


__all__ = ["TffLongformerConfig"]
