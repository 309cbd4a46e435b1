"""Configuration of the kernelised-attention transformers: the Performer (Choromanski et al. 2021,
arXiv:2009.14794), the Linear Transformer (Katharopoulos et al. 2020, arXiv:2006.16236) and Random Feature
Attention (Peng et al. 2021, arXiv:2103.02143). One config class with a `feature_map` field; the Linear
Transformer's and RFA's model types are the same config with their own defaults."""

from __future__ import annotations

import math
from typing import Literal

from transformers import PreTrainedConfig

from ...modeling.configuration import NO_AUTO_MAP, check_config_kwargs, validate_config
from ...modeling.validation import check_nonnegative_int, check_positive_int, check_probability, check_seed


class TffPerformerConfig(PreTrainedConfig):
    r"""Configuration of a kernelised-attention transformer: pre-layer-norm blocks (GPT-2's), learned absolute
    positions counted over real tokens, and attention ``phi(q) (phi(k)^T v) / phi(q) (phi(k)^T 1)`` whose cost is
    linear in the length. Bidirectional (an encoder) or causal (a decoder that generates with a constant-size
    recurrent state).

    Args:
        vocab_size (`int`, defaults to 30522): number of tokens.
        hidden_size (`int`, defaults to 512): width of the residual stream (``D``).
        num_hidden_layers (`int`, defaults to 6): number of layers (``L``).
        num_attention_heads (`int`, defaults to 8): attention heads (``H``); must divide `hidden_size`.
        intermediate_size (`int`, defaults to 2048): width of the feed-forward block.
        hidden_act (`str`, defaults to `"gelu"`): feed-forward activation (a key of `transformers.activations.ACT2FN`).
        hidden_dropout_prob (`float`, defaults to 0.1): dropout on embeddings and sub-layer outputs.
        max_position_embeddings (`int`, defaults to 4096): learned positions, the longest input.
        type_vocab_size (`int`, defaults to 1): token types.
        initializer_range (`float`, defaults to 0.02): std of the normal init of linear layers and embeddings.
        layer_norm_eps (`float`, defaults to 1e-5): layer norm epsilon.
        feature_map (`str`, defaults to `"favor"`): ``phi``: ``"favor"`` (FAVOR+ positive random features of
            ``d^-1/4 q``, an unbiased estimate of softmax attention; the Performer), ``"elu"`` (``elu(x) + 1``, no
            random features; the Linear Transformer), ``"rfa"`` (random Fourier features of l2-normalised q and k with
            a learned inverse width per head; Random Feature Attention).
        num_random_features (`int`, *optional*): random features ``m`` (FAVOR+: ``m`` features; RFA: ``m``
            projections, ``2 m`` sin/cos features); defaults to ``int(Dh * ln(Dh))`` as in performer-pytorch. Not
            used by ``"elu"``.
        orthogonal_features (`bool`, defaults to `True`): orthogonal random features (blocks of orthogonal rows with
            chi-distributed norms, the paper's ORF) rather than i.i.d. Gaussian rows.
        feature_redraw_interval (`int`, defaults to 1000): in training, every attention layer draws a new projection
            every that many forward calls (the paper's redrawing); 0 never redraws. Never in eval: the projection
            is a buffer saved with the weights, so a reloaded model gives the same outputs.
        projection_seed (`int`, defaults to 0): seed of the projections (layer ``l`` and redraw ``r`` draw from a
            `torch.Generator` seeded from it, ``l`` and ``r``; no global RNG).
        rfa_gate (`bool`, defaults to `False`): RFA-Gate: a learned sigmoid gate ``g_t`` per head and position
            decays the recurrent state, ``S_t = g_t S_{t-1} + (1 - g_t) phi(k_t) v_t^T`` (numerator and normaliser
            alike). Needs ``feature_map="rfa"`` and ``causal=True``.
        causal (`bool`, defaults to `False`): causal attention (a decoder); the causal-LM class sets it.
        chunk_size (`int`, defaults to 64): causal attention's prefix sums run over chunks of this many positions
            (a dense block inside each; memory ``O(T m Dh / chunk_size)``). Does not change the result.
        pad_token_id, bos_token_id, eos_token_id (`int`, *optional*): special tokens.
        classifier_dropout (`float`, *optional*): dropout of the classification heads; defaults to
            `hidden_dropout_prob`.
        tie_word_embeddings (`bool`, defaults to `True`): tie the language-model decoders to the input embeddings.
    """

    auto_map = NO_AUTO_MAP  # (a remote-code export's folder sets its own)
    model_type = "tff_performer"

    vocab_size: int = 30522
    hidden_size: int = 512
    num_hidden_layers: int = 6
    num_attention_heads: int = 8
    intermediate_size: int = 2048
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    max_position_embeddings: int = 4096
    type_vocab_size: int = 1
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-5
    feature_map: Literal["favor", "elu", "rfa"] = "favor"
    num_random_features: int | None = None
    orthogonal_features: bool = True
    feature_redraw_interval: int = 1000
    projection_seed: int = 0
    rfa_gate: bool = False
    causal: bool = False
    chunk_size: int = 64
    pad_token_id: int | None = 0
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    classifier_dropout: float | None = None
    tie_word_embeddings: bool = True

    def __post_init__(self, **kwargs):
        check_config_kwargs(type(self).__name__, kwargs)
        super().__post_init__(**kwargs)
        validate_config(self)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def random_features(self) -> int:
        """``m``: `num_random_features`, or ``int(Dh * ln(Dh))`` (at least 1)."""
        if self.num_random_features is not None:
            return self.num_random_features
        return max(1, int(self.head_dim * math.log(self.head_dim)))

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
            "chunk_size",
        ):
            check_positive_int(name, getattr(self, name))
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} must be a multiple of num_attention_heads={self.num_attention_heads}."
            )
        if self.num_random_features is not None:
            check_positive_int("num_random_features", self.num_random_features, maximum=1 << 16)
        check_nonnegative_int("feature_redraw_interval", self.feature_redraw_interval)
        check_seed("projection_seed", self.projection_seed)
        if self.rfa_gate and self.feature_map != "rfa":
            raise ValueError(
                f"rfa_gate=True needs feature_map='rfa' (RFA-Gate gates random Fourier features), got "
                f"feature_map={self.feature_map!r}; set feature_map='rfa' or rfa_gate=False."
            )
        if self.rfa_gate and not self.causal:
            raise ValueError(
                "rfa_gate=True needs causal=True: the gate decays a recurrent (left-to-right) state; set causal=True "
                "or rfa_gate=False."
            )
        if self.pad_token_id is None or self.pad_token_id < 0:
            raise ValueError(f"pad_token_id must be an int >= 0, got {self.pad_token_id}.")
        check_probability("hidden_dropout_prob", self.hidden_dropout_prob)
        check_probability("classifier_dropout", self.classifier_dropout, optional=True)


class TffLinearTransformerConfig(TffPerformerConfig):
    r"""The Linear Transformer (Katharopoulos et al. 2020, "Transformers are RNNs"): `TffPerformerConfig` with
    ``feature_map="elu"`` (``phi(x) = elu(x) + 1``) and ``causal=True`` by default. Every field as there."""

    model_type = "tff_linear_transformer"

    feature_map: Literal["favor", "elu", "rfa"] = "elu"
    causal: bool = True


class TffRFAConfig(TffPerformerConfig):
    r"""Random Feature Attention (Peng et al. 2021): `TffPerformerConfig` with ``feature_map="rfa"``,
    ``rfa_gate=True`` (RFA-Gate) and ``causal=True`` by default. Every field as there."""

    model_type = "tff_rfa"

    feature_map: Literal["favor", "elu", "rfa"] = "rfa"
    rfa_gate: bool = True
    causal: bool = True


__all__ = ["TffLinearTransformerConfig", "TffPerformerConfig", "TffRFAConfig"]
