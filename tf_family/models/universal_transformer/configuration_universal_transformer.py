"""Configuration of the Universal Transformer with Adaptive Computation Time (Dehghani et al. 2019,
arXiv:1807.03819; Graves 2016, arXiv:1603.08983)."""

from __future__ import annotations

from typing import Literal

from transformers import PreTrainedConfig

from ...modeling.configuration import NO_AUTO_MAP, check_config_kwargs, validate_config
from ...modeling.validation import check_float, check_positive_int, check_probability


class TffUniversalTransformerConfig(PreTrainedConfig):
    r"""Configuration of a Universal Transformer: one shared block applied recurrently to every position, with
    position and step timing signals added at every step and per-position halting (ACT).

    Defaults follow tensor2tensor's ``universal_transformer_base`` with ACT (``recurrence_type="act"``) where it has
    one: ``act_epsilon`` 0.01, ``act_halting_bias_init`` 1.0, ``act_loss_weight`` 0.01, pre-layer-norm blocks; the
    step timing signals are sinusoids by default (tensor2tensor's ``step_timing_signal_type="sinusoid"``; its default
    learns them: ``step_timing_signal="learned"``); at the maximum step they follow Graves 2016
    (``act_force_halt_at_max_steps``; tensor2tensor's rule is the `False`).

    Args:
        vocab_size (`int`, defaults to 32000): number of tokens.
        hidden_size (`int`, defaults to 512): width of the state (``d`` in the paper).
        num_attention_heads (`int`, defaults to 8): attention heads; must divide `hidden_size`.
        intermediate_size (`int`, defaults to 2048): width of the transition function (a feed-forward block).
        hidden_act (`str`, defaults to `"relu"`): the transition function's activation.
        layers_per_step (`int`, defaults to 1): blocks (attention + transition) applied per recurrent step, with
            their own weights, shared across steps (tensor2tensor's ``num_inrecurrence_layers``).
        act_max_steps (`int`, defaults to 8): the most recurrent steps a position takes (``N`` in Graves 2016;
            tensor2tensor's ``act_max_steps``). What a position still running at this step gets: see
            `act_force_halt_at_max_steps`.
        act_force_halt_at_max_steps (`bool`, defaults to `True`): Graves 2016's rule (eq. 3): a position still running
            at step `act_max_steps` halts there, that step weighted by its remainder ``R = 1 - sum of the earlier p``,
            so every position's step weights sum to one and the ponder cost ``N + R`` has a gradient at every
            position. `False`: tensor2tensor's loop, which just stops: such a position keeps the weight ``p`` at its
            last step, ``R = 0``, weights summing to less than one, and no ponder-cost gradient to its halting unit
            (a model that learned never to halt is never pushed back). The two give the same outputs for every
            position that halts before `act_max_steps`.
        act_epsilon (`float`, defaults to 0.01): a position halts when its summed halting probability passes
            ``1 - act_epsilon`` (``epsilon``).
        act_halting_bias_init (`float`, defaults to 1.0): initial bias of the halting unit (a fresh model halts
            after about two steps).
        act_loss_weight (`float`, defaults to 0.01): weight of the ponder cost (mean of ``N + R`` over real
            positions; ``tau`` in Graves 2016) added to the task loss.
        act_type (`str`, defaults to `"basic"`): ``"basic"``: the output is updated as ``s (1 - w) + y w`` at every
            step (tensor2tensor's default); ``"accumulated"``: the output is the weighted sum ``sum_n w_n y_n``
            (Graves 2016).
        layer_norm_position (`str`, defaults to `"pre"`): ``"pre"``: each sub-layer normalises its input and the
            residual state is never normalised until the final layer norm (tensor2tensor's code), so the timing signals
            added at every step accumulate in it (``n`` copies of the position signal at step ``n``); ``"post"``: the
            paper's section 2.1 equations, each residual sum normalised (``LN(x + sublayer(x))``), so the state entering
            every step has unit scale and the step's signals a constant share of it.
        step_timing_signal (`str`, defaults to `"sinusoid"`): the step timing signal added before every step:
            ``"sinusoid"``: the sinusoid of the step number (section 2.1; no parameters); ``"learned"``: one learned
            vector per step, ``act_max_steps`` of them, started at std ``hidden_size ** -0.5`` and scaled by
            ``sqrt(hidden_size)`` (tensor2tensor's ``get_layer_timing_signal_learned_1d``, its default).
        causal (`bool`, defaults to `False`): causal self-attention (a decoder); `TffUniversalTransformerForCausalLM`
            sets it.
        hidden_dropout_prob (`float`, defaults to 0.1): dropout on embeddings and sub-layer outputs.
        attention_probs_dropout_prob (`float`, defaults to 0.1): dropout on attention probabilities.
        initializer_range (`float`, defaults to 0.02): std of the normal init of linear layers (the word embeddings
            start at std ``hidden_size ** -0.5``, tensor2tensor's, so that scaled by ``sqrt(hidden_size)`` they have
            unit variance).
        layer_norm_eps (`float`, defaults to 1e-6): layer norm epsilon (tensor2tensor's).
        pad_token_id (`int`, defaults to 0): the padding token.
        bos_token_id (`int`, *optional*): the beginning-of-sequence token.
        eos_token_id (`int`, *optional*): the end-of-sequence token.
        classifier_dropout (`float`, *optional*): dropout of the classification head; defaults to
            `hidden_dropout_prob`.
        tie_word_embeddings (`bool`, defaults to `True`): tie the language-model decoder to the input embeddings.
        use_cache (`bool`, defaults to `True`): the causal LM returns a key/value cache in eval mode (building it
            runs every position through all `act_max_steps` steps; see the model's docstring).
    """

    auto_map = NO_AUTO_MAP  # (a remote-code export's folder sets its own)
    model_type = "tff_universal_transformer"
    # the distinct blocks (their weights are shared across steps), under the name tools read
    attribute_map = {"num_hidden_layers": "layers_per_step"}

    vocab_size: int = 32000
    hidden_size: int = 512
    num_attention_heads: int = 8
    intermediate_size: int = 2048
    hidden_act: str = "relu"
    layers_per_step: int = 1
    act_max_steps: int = 8
    act_force_halt_at_max_steps: bool = True
    act_epsilon: float = 0.01
    act_halting_bias_init: float = 1.0
    act_loss_weight: float = 0.01
    act_type: Literal["basic", "accumulated"] = "basic"
    layer_norm_position: Literal["pre", "post"] = "pre"
    step_timing_signal: Literal["sinusoid", "learned"] = "sinusoid"
    causal: bool = False
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-6
    pad_token_id: int | None = 0
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    classifier_dropout: float | None = None
    tie_word_embeddings: bool = True
    use_cache: bool = True

    def __post_init__(self, **kwargs):
        check_config_kwargs(type(self).__name__, kwargs)
        super().__post_init__(**kwargs)
        validate_config(self)

    @property
    def act_threshold(self) -> float:
        """``1 - act_epsilon``: the summed halting probability past which a position halts."""
        return 1.0 - self.act_epsilon

    def validate_architecture(self):
        """Cross-field rules; each error names the field, the value and the rule."""
        for name in ("vocab_size", "hidden_size", "num_attention_heads", "intermediate_size"):
            check_positive_int(name, getattr(self, name))
        check_positive_int("layers_per_step", self.layers_per_step, maximum=64)
        check_positive_int("act_max_steps", self.act_max_steps, maximum=256)
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} must be a multiple of num_attention_heads={self.num_attention_heads}."
            )
        check_float(
            "act_epsilon", self.act_epsilon, minimum=0.0, maximum=1.0, min_open=True, max_open=True,
            fix="set act_epsilon in (0, 1), e.g. 0.01",
        )  # fmt: skip
        check_float("act_loss_weight", self.act_loss_weight, minimum=0.0, fix="set act_loss_weight >= 0, e.g. 0.01")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            check_probability(name, getattr(self, name))
        check_probability("classifier_dropout", self.classifier_dropout, optional=True)


__all__ = ["TffUniversalTransformerConfig"]
