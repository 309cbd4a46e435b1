"""Configuration of CALM, confident adaptive language modelling (Schuster et al. 2022, arXiv:2207.07061)."""

from __future__ import annotations

from typing import Literal

from transformers import PreTrainedConfig

from ...early_exit import AGGREGATIONS, CONFIDENCE_MEASURES, ORACLES, exit_points
from ...modeling.configuration import NO_AUTO_MAP, check_config_kwargs, validate_config
from ...modeling.validation import check_choice, check_float, check_int, check_positive_int, check_probability


class TffCalmConfig(PreTrainedConfig):
    r"""Configuration of `TffCalmForCausalLM`: a Llama-style decoder whose intermediate layers can exit early.

    Every exit reads the hidden state after a layer through the shared final norm and LM head; a token exits at the
    first exit whose confidence reaches the (position-decayed) threshold, and the layers it skips get their keys and
    values from its exit state (state propagation), so every cache layer stays aligned.

    Decoder (Llama's names, so a Llama checkpoint maps one to one):
        vocab_size (`int`, defaults to 8192), hidden_size (`int`, 256; D), intermediate_size (`int`, 688),
        num_hidden_layers (`int`, 8; L), num_attention_heads (`int`, 4), num_key_value_heads (`int`, *optional*:
        the heads' count), head_dim (`int`, *optional*: hidden_size / heads), hidden_act (`str`, ``"silu"``),
        max_position_embeddings (`int`, 2048), rms_norm_eps (`float`, 1e-6), rope_base (`float`, 10000.0: the
        rotary base θ), attention_bias / mlp_bias (`bool`, False), attention_dropout (`float`, 0.0),
        initializer_range (`float`, 0.02), tie_word_embeddings (`bool`, False), pad/bos/eos_token_id.
        decoder_style (`str`, defaults to ``"llama"``): ``"llama"`` (RMSNorm, rotary positions, gated MLP) or
        ``"gpt2"`` (LayerNorm with bias, learned absolute positions, plain MLP; set ``attention_bias``, ``mlp_bias``
        and ``layer_norm_eps``: what a converted GPT-2 checkpoint gets). layer_norm_eps (`float`, 1e-5): the
        LayerNorm epsilon of the ``"gpt2"`` style.
        ``num_hidden_layers`` is also the *active* depth: transformers' ``assistant_early_exit`` lowers it while
        drafting, and the model then runs only that many layers.

    Early exit (CALM section 3):
        first_exit (`int`, defaults to 1): the first layer count with an exit.
        exit_interval (`int`, defaults to 1): layers between exits (the last layer is always an exit).
        min_exit (`int`, defaults to 1): no token exits before this many layers.
        confidence_measure (`str`, defaults to ``"softmax_diff"``): ``"softmax_diff"`` (top-1 minus top-2
            probability), ``"softmax_max"``, ``"state"`` (cosine of the hidden states at consecutive exits),
            ``"meta"`` (the meta classifier), ``"restricted_softmax"`` (top-1 minus top-2 over
            ``restricted_vocab`` only: cheap when the full output layer costs about a layer). The Depth-Adaptive
            Transformer's exits (Elbayad et al. 2020, `tf_family.early_exit.depth_adaptive`): ``"halting"`` (the
            geometric-like model: a halting classifier per exit, leave when its probability reaches the threshold)
            and ``"multinomial"`` (one classifier over the exits from the first exit's state, leave when the
            cumulative probability reaches it); both add ``halting_classifier``, trained against the oracle exits
            on detached states (``halting_loss``, weighted by ``meta_loss_weight`` beside the meta classifier's).
        exit_threshold (`float`, *optional*): λ. ``None`` (or ``inf``): never exit early (the full model);
            `recipes/calm_calibrate.py` writes the calibrated value.
        position_temperature (`float`, defaults to 4.0): τ in λ'(t) = 0.9 λ + 0.1 λ exp(-τ t / N); 0 keeps λ.
        decay_length (`int`, *optional*): N in that formula (defaults to ``max_position_embeddings``); t is the
            token's position.
        restricted_vocab (`list[int]`, *optional*): the token ids the ``"restricted_softmax"`` measure scores
            (e.g. the most frequent training tokens).
        aggregation (`str` or `int`, defaults to ``"linear"``): the anytime loss's exit weights: ``"geometric"``,
            ``"uniform"``, ``"linear"`` or an integer step (the official ``aggregation_weights``).
        meta_loss_weight (`float`, defaults to 1.0): weight of the meta classifier's class-balanced loss, trained
            on detached hidden states (so it never changes the language model).
        distillation_weight (`float`, defaults to 0.0): opt-in self-distillation (not in the paper): the loss adds
            this weight times the mean over the intermediate exits of ``KL(p_final || p_exit)`` (a token mean; the
            last layer's distribution detached), so the exits learn to predict what the full model will, which is
            what the consistency guarantee counts. 0 trains the paper's anytime loss only.
        halting_oracle (`str`, defaults to ``"likelihood"``): the Depth-Adaptive oracle the halting classifier learns:
            ``"likelihood"`` (the exit maximising log p(y) - ``halting_depth_penalty`` x layers) or
            ``"correctness"`` (the first exit whose argmax is the target).
        halting_depth_penalty (`float`, defaults to 0.0): λ of the likelihood oracle, in nats per layer.
        calibration (`dict`, *optional*): what `recipes/calm_calibrate.py` certified (δ, ε, the risk, n, p-value).
    """

    auto_map = NO_AUTO_MAP  # (a remote-code export's folder sets its own)
    model_type = "tff_calm"
    # exit_threshold=inf is a documented setting (never exit early); every other float field must be finite
    _infinite_fields = ("exit_threshold",)
    keys_to_ignore_at_inference = ["cache"]

    vocab_size: int = 8192
    hidden_size: int = 256
    intermediate_size: int = 688
    num_hidden_layers: int = 8
    num_attention_heads: int = 4
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    hidden_act: str = "silu"
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    decoder_style: Literal["llama", "gpt2"] = "llama"
    layer_norm_eps: float = 1e-5
    rope_base: float = 10000.0
    attention_bias: bool = False
    mlp_bias: bool = False
    attention_dropout: float = 0.0
    initializer_range: float = 0.02
    tie_word_embeddings: bool = False
    use_cache: bool = True
    first_exit: int = 1
    exit_interval: int = 1
    min_exit: int = 1
    confidence_measure: Literal[
        "softmax_diff", "softmax_max", "state", "meta", "restricted_softmax", "halting", "multinomial"
    ] = "softmax_diff"
    exit_threshold: float | None = None
    position_temperature: float = 4.0
    decay_length: int | None = None
    restricted_vocab: list[int] | None = None
    aggregation: str | int = "linear"
    meta_loss_weight: float = 1.0
    distillation_weight: float = 0.0
    halting_oracle: Literal["likelihood", "correctness"] = "likelihood"
    halting_depth_penalty: float = 0.0
    calibration: dict | None = None
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None

    def __post_init__(self, **kwargs):
        check_config_kwargs(type(self).__name__, kwargs)
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        sizes = (self.hidden_size, self.num_attention_heads)
        if self.head_dim is None and all(type(v) is int and v > 0 for v in sizes):
            self.head_dim = self.hidden_size // self.num_attention_heads
        super().__post_init__(**kwargs)
        validate_config(self)

    def exit_points(self, num_layers: int | None = None) -> list[int]:
        """The layer counts with an exit, for the active depth (``num_hidden_layers`` unless given)."""
        return exit_points(num_layers or self.num_hidden_layers, self.first_exit, self.exit_interval)

    def validate_architecture(self):
        """Cross-field rules; each error names the field, the value and the rule."""
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "max_position_embeddings",
        ):
            check_positive_int(name, getattr(self, name))
        derived = (
            f" (unset, it is hidden_size // num_attention_heads = {self.hidden_size} // {self.num_attention_heads})"
        )
        check_positive_int("head_dim", self.head_dim, fix=f"set head_dim >= 1{derived}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of num_key_value_heads "
                f"({self.num_key_value_heads})."
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even (rotary positions rotate pairs), got {self.head_dim}{derived}.")
        check_float("rope_base", self.rope_base, minimum=0.0, min_open=True, fix="set rope_base > 0, e.g. 10000")
        check_probability("attention_dropout", self.attention_dropout)
        for name in ("first_exit", "exit_interval", "min_exit"):
            check_positive_int(name, getattr(self, name))
        if self.first_exit > self.num_hidden_layers:
            raise ValueError(
                f"first_exit={self.first_exit} is past the last layer (num_hidden_layers={self.num_hidden_layers}); "
                "set first_exit <= num_hidden_layers."
            )
        if self.exit_threshold is not None:
            check_float(
                "exit_threshold",
                self.exit_threshold,
                minimum=0.0,
                allow_inf=True,
                fix="set exit_threshold >= 0, or None",
            )
        check_float("position_temperature", self.position_temperature, minimum=0.0, fix="set τ >= 0")
        if self.decay_length is not None:
            check_positive_int("decay_length", self.decay_length, fix="set decay_length (N) >= 1, or None")
        if self.confidence_measure == "restricted_softmax" and not self.restricted_vocab:
            raise ValueError(
                "confidence_measure='restricted_softmax' needs restricted_vocab (the token ids it scores, >= 2); "
                "set it, e.g. to the most frequent training tokens."
            )
        if self.restricted_vocab is not None:
            if len(self.restricted_vocab) < 2 or len(set(self.restricted_vocab)) != len(self.restricted_vocab):
                raise ValueError("restricted_vocab must hold at least 2 distinct token ids.")
            if not all(0 <= token < self.vocab_size for token in self.restricted_vocab):
                raise ValueError(f"restricted_vocab ids must lie in [0, vocab_size={self.vocab_size}).")
        if isinstance(self.aggregation, str) and self.aggregation not in AGGREGATIONS:
            raise ValueError(
                f"aggregation must be one of {AGGREGATIONS} or an integer step, got {self.aggregation!r}."
            )
        if isinstance(self.aggregation, int):
            check_int(
                "aggregation", self.aggregation, minimum=-1, fix="as an integer aggregation is -1, 0 or a step >= 1"
            )
        check_float("meta_loss_weight", self.meta_loss_weight, minimum=0.0, fix="set meta_loss_weight >= 0")
        check_float(
            "distillation_weight", self.distillation_weight, minimum=0.0, fix="set distillation_weight >= 0 (0: off)"
        )
        check_choice("confidence_measure", self.confidence_measure, CONFIDENCE_MEASURES)
        check_choice("halting_oracle", self.halting_oracle, ORACLES)
        check_float(
            "halting_depth_penalty", self.halting_depth_penalty, minimum=0.0, fix="set halting_depth_penalty >= 0"
        )


__all__ = ["TffCalmConfig"]
