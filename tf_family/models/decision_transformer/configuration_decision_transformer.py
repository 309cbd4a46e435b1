"""Configuration of the Decision Transformer (Chen et al. 2021, arXiv:2106.01345)."""

from __future__ import annotations

import numbers
from typing import Literal

from transformers import PreTrainedConfig

from ...modeling.configuration import NO_AUTO_MAP, check_config_kwargs, validate_config
from ...modeling.validation import MAX_SIZE, check_float, check_list_of, check_positive_int, check_probability


class TffDecisionTransformerConfig(PreTrainedConfig):
    r"""Configuration of a Decision Transformer: a GPT-2-style causal transformer over ``(R, s, a)`` triples that
    predicts the action ``a_t`` from the return-to-go ``R_t``, the state ``s_t`` and the ``K - 1`` steps before.

    Everything the model needs to act is stored here (transformers' `DecisionTransformerConfig` leaves the state
    statistics and the return scale to the model card): the model normalises raw states with `state_mean` /
    `state_std` and divides raw returns-to-go by `return_scale` itself, so users feed environment observations and
    undiscounted returns as they come.

    Defaults reproduce the paper's MuJoCo setting (the shape of `edbeeching/decision-transformer-gym-hopper-*`,
    except the environment's dimensions).

    Args:
        state_dim (`int`, defaults to 17): size of the state vector ``s_t``.
        act_dim (`int`, defaults to 4): size of the action vector ``a_t`` (continuous) or number of actions
            (discrete).
        action_space (`Literal["continuous", "discrete"]`, defaults to `"continuous"`): continuous actions are
            vectors, predicted through `action_tanh` and trained with a mean squared error; discrete actions are ids,
            embedded one-hot, predicted as logits and trained with a cross-entropy.
        context_length (`int`, defaults to 20): the number of most recent steps the model sees (``K`` in the
            paper); a sequence of ``K`` steps is ``3K`` tokens. `get_action` keeps this many.
        max_ep_len (`int`, defaults to 4096): size of the timestep embedding table; timesteps must be below it.
        hidden_size (`int`, defaults to 128): width of the residual stream (``h``).
        n_layer (`int`, defaults to 3): transformer blocks.
        n_head (`int`, defaults to 1): attention heads; must divide `hidden_size`.
        n_inner (`int`, *optional*): width of the feed-forward block; defaults to ``4 * hidden_size``.
        activation_function (`str`, defaults to `"relu"`): feed-forward activation (a key of
            `transformers.activations.ACT2FN`).
        resid_pdrop (`float`, defaults to 0.1): dropout on the attention and feed-forward outputs.
        embd_pdrop (`float`, defaults to 0.1): dropout on the token embeddings.
        attn_pdrop (`float`, defaults to 0.1): dropout on the attention probabilities.
        layer_norm_epsilon (`float`, defaults to 1e-5): epsilon of every layer norm.
        initializer_range (`float`, defaults to 0.02): std of the normal init (residual output projections get
            ``initializer_range / sqrt(2 * n_layer)``, as in GPT-2).
        action_tanh (`bool`, defaults to `True`): squash continuous actions into ``(-1, 1)`` with tanh. Must be
            False for discrete actions.
        predict_state (`bool`, defaults to `False`): add a head predicting the (normalised) next state ``s_{t+1}``
            from the action token ``a_t``; the paper found it unnecessary.
        predict_return (`bool`, defaults to `False`): add a head predicting the next (scaled) return-to-go
            ``R_{t+1}`` from the action token ``a_t``.
        state_loss_weight (`float`, defaults to 0.0): weight of the next-state mean squared error in `loss`
            (needs `predict_state`).
        return_loss_weight (`float`, defaults to 0.0): weight of the next-return mean squared error in `loss`
            (needs `predict_return`).
        state_mean (`list[float]`, *optional*): per-dimension mean of the states in the training data; the model
            feeds ``(s - state_mean) / state_std``. Defaults to zeros (no centring).
        state_std (`list[float]`, *optional*): per-dimension std of the training states (all > 0); defaults to ones.
        return_scale (`float`, defaults to 1.0): returns-to-go are divided by this before embedding (the paper's
            ``scale``: 1000 for MuJoCo locomotion).
        target_return (`float`, *optional*): the return to condition on when acting, if the caller gives none (the
            paper's ``env_targets[0]``, e.g. 3600 for Hopper); usually the best return in the data.
        env_id (`str`, *optional*): the gymnasium id of the environment the model acts in (used by the evaluation
            helper when no environment is given).
        gating (`str`, defaults to `"none"`): ``"gru"`` makes every block a GTrXL block (Parisotto et al. 2020,
            arXiv:1910.06764): a GRU-type gate in place of each residual connection, with a ReLU on each sublayer's
            output (`tf_family.layers.gated_residual.GRUGate`); the layer norms already sit at each sublayer's input
            (GTrXL's "identity map reordering"). ``"none"``: GPT-2's residuals, as in the paper and transformers.
        gate_bias (`float`, defaults to 2.0): initial gate bias ``b_g``, subtracted in the update gate so that a
            fresh gated block starts near the identity (used with `gating="gru"`).
    """

    auto_map = NO_AUTO_MAP  # (a remote-code export's folder sets its own)
    model_type = "tff_decision_transformer"
    attribute_map = {"num_attention_heads": "n_head", "num_hidden_layers": "n_layer"}

    state_dim: int = 17
    act_dim: int = 4
    action_space: Literal["continuous", "discrete"] = "continuous"
    context_length: int = 20
    max_ep_len: int = 4096
    hidden_size: int = 128
    n_layer: int = 3
    n_head: int = 1
    n_inner: int | None = None
    activation_function: str = "relu"
    resid_pdrop: float = 0.1
    embd_pdrop: float = 0.1
    attn_pdrop: float = 0.1
    layer_norm_epsilon: float = 1e-5
    initializer_range: float = 0.02
    action_tanh: bool = True
    predict_state: bool = False
    predict_return: bool = False
    state_loss_weight: float = 0.0
    return_loss_weight: float = 0.0
    state_mean: list[float] | None = None
    state_std: list[float] | None = None
    return_scale: float = 1.0
    target_return: float | None = None
    env_id: str | None = None
    gating: Literal["none", "gru"] = "none"
    gate_bias: float = 2.0
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    def __post_init__(self, **kwargs):
        check_config_kwargs(type(self).__name__, kwargs)
        # defaults derived from valid values only: a wrong hidden_size / state_dim is then reported by name
        if self.n_inner is None and type(self.hidden_size) is int and 0 < self.hidden_size <= MAX_SIZE:
            self.n_inner = 4 * self.hidden_size
        state_dim = self.state_dim if type(self.state_dim) is int and 0 < self.state_dim <= MAX_SIZE else 0
        if self.state_mean is None:
            self.state_mean = [0.0] * min(state_dim, 2**20)
        if self.state_std is None:
            self.state_std = [1.0] * min(state_dim, 2**20)
        for name in ("state_mean", "state_std"):  # ints (and numpy floats) become floats; other kinds stay to be named
            values = getattr(self, name)
            if isinstance(values, (list, tuple)) and all(
                isinstance(x, numbers.Real) and not isinstance(x, bool) for x in values
            ):
                setattr(self, name, [float(x) for x in values])
        super().__post_init__(**kwargs)
        validate_config(self)

    @property
    def discrete(self) -> bool:
        return self.action_space == "discrete"

    def validate_architecture(self):
        """Cross-field rules; each error names the field, the value and the rule."""
        for name in ("state_dim", "act_dim"):  # the statistics and one-hot actions are lists / rows of this size
            check_positive_int(name, getattr(self, name), maximum=2**20)
        for name in ("context_length", "max_ep_len", "hidden_size", "n_layer", "n_head"):
            check_positive_int(name, getattr(self, name))
        check_positive_int("n_inner", self.n_inner, fix="set n_inner >= 1 (or None for 4 * hidden_size)")
        if self.hidden_size % self.n_head:
            raise ValueError(f"hidden_size={self.hidden_size} must be divisible by n_head={self.n_head}.")
        if self.discrete and self.act_dim < 2:
            raise ValueError(f"a discrete action space needs act_dim >= 2 actions, got {self.act_dim}.")
        if self.discrete and self.action_tanh:
            raise ValueError("action_tanh=True squashes continuous actions; set action_tanh=False for discrete ones.")
        for name in ("resid_pdrop", "embd_pdrop", "attn_pdrop"):
            check_probability(name, getattr(self, name))
        for name, head in (("state_loss_weight", "predict_state"), ("return_loss_weight", "predict_return")):
            check_float(name, getattr(self, name), minimum=0.0, fix=f"set {name} >= 0 (0 turns that loss off)")
            if getattr(self, name) > 0 and not getattr(self, head):
                raise ValueError(f"{name}={getattr(self, name)} needs the head it trains: set {head}=True.")
        for name in ("state_mean", "state_std"):
            if len(getattr(self, name)) != self.state_dim:
                raise ValueError(
                    f"{name} must have state_dim={self.state_dim} entries, got {len(getattr(self, name))}."
                )
            check_list_of(name, getattr(self, name), check_float)
        if min(self.state_std) <= 0:
            raise ValueError(f"state_std must be > 0 everywhere (it divides the states), got {self.state_std}.")
        check_float("return_scale", self.return_scale, minimum=0.0, min_open=True, fix="set return_scale > 0")
        if self.target_return is not None:
            check_float("target_return", self.target_return, fix="set target_return to a finite return, or None")
        if self.gating not in ("none", "gru"):
            raise ValueError(
                f"gating must be 'none' (GPT-2's residuals) or 'gru' (GTrXL's gated residuals), got {self.gating!r}."
            )
        check_float("gate_bias", self.gate_bias, fix="set gate_bias to a finite number (2.0 in the GTrXL paper)")


__all__ = ["TffDecisionTransformerConfig"]
