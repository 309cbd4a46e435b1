"""Decision Transformer: reinforcement learning via sequence modelling (Chen et al. 2021, arXiv:2106.01345).

A trajectory is the token sequence ``(R_1, s_1, a_1, R_2, s_2, a_2, ...)`` of returns-to-go, states and actions.
Each modality has its own linear embedding, every token of step ``t`` gets the timestep embedding of ``t`` (the only
position signal), and a GPT-2-style causal transformer reads the ``3K`` tokens of the last ``K`` steps. The action
``a_t`` is predicted from the hidden state of the token ``s_t``, which has seen ``R_t`` and ``s_t`` but not ``a_t``
(section 3 of the paper). Conditioning on a high return-to-go at test time asks for a good trajectory.

Parity reference: transformers 5 `DecisionTransformerModel` (itself a port of the authors' kzl/decision-transformer
`DecisionTransformer`); `convert_decision_transformer.py` loads its checkpoints and the tests check equal outputs.

Additions and deviations:
- raw states and returns go in: the state mean/std and the return scale live in the config and the model
  normalises (transformers expects normalised inputs and keeps the statistics in the model card);
- a loss when ``labels`` (the actions) are given: mean squared error (continuous) or cross-entropy (discrete) over
  real steps only, plus optional next-state / next-return losses; discrete action spaces (one-hot action tokens,
  logits out); `get_action` with left padding to ``K`` done here; an evaluation loop in `evaluation.py`;
- the attention mask is built on the inputs' device (transformers builds its default mask on the CPU); a padded
  query attends to itself only, so its (ignored) output stays finite;
- transformers' GPT-2 adds the learned position embedding of position 0 to every token (its position ids are all
  zero); that constant is folded into the bias of `embed_ln` on import, so this model has no position table;
- linear layers are `nn.Linear` (GPT-2's `Conv1D` stores the transposed weight; the converter transposes).

Config field <-> paper symbol: `context_length` = K, `hidden_size` = h, `return_scale` = the returns' ``scale``,
`target_return` = the conditioning return ``R_1`` at test time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.utils import ModelOutput, logging

from ...attention import attend
from ...layers.gated_residual import GRUGate
from ...modeling.losses import IGNORE_INDEX
from ...modeling.pretrained import TffPreTrainedModel
from ...modeling.validation import (
    check_class_labels,
    check_finite,
    check_ids_in_range,
    check_tensor,
)
from .configuration_decision_transformer import TffDecisionTransformerConfig

logger = logging.get_logger(__name__)


@dataclass
class TffDecisionTransformerOutput(ModelOutput):
    """Output of `TffDecisionTransformerModel`.

    Args:
        loss: ``action_loss`` plus the weighted auxiliary losses, when ``labels`` are given.
        action_loss: mean squared error (continuous) or cross-entropy (discrete) of the action predictions over
            the real steps.
        action_preds: ``(B, T, act_dim)``: actions (continuous; through tanh if `action_tanh`) or action logits
            (discrete); row ``t`` is predicted from ``R_{<=t}, s_{<=t}, a_{<t}``.
        state_preds: ``(B, T, state_dim)`` next normalised state predicted from the token ``a_t`` (if
            `predict_state`).
        return_preds: ``(B, T, 1)`` next scaled return-to-go predicted from the token ``a_t`` (if `predict_return`).
        last_hidden_state: ``(B, 3T, D)`` hidden states of the ``(R, s, a)`` tokens.
        hidden_states: per layer ``(B, 3T, D)`` when ``output_hidden_states=True`` (embeddings first).
        attentions: per layer ``(B, H, 3T, 3T)`` when ``output_attentions=True``.
    """

    loss: torch.FloatTensor | None = None
    action_loss: torch.FloatTensor | None = None
    action_preds: torch.FloatTensor | None = None
    state_preds: torch.FloatTensor | None = None
    return_preds: torch.FloatTensor | None = None
    last_hidden_state: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


def build_trajectory_attention_mask(step_mask: torch.Tensor) -> torch.Tensor:
    """Allowed query-key pairs over the interleaved ``(R, s, a)`` tokens: causal, real keys only.

    Args:
        step_mask: ``(B, T)`` bool, True on real steps (left or right padding).

    Returns:
        ``(B, 1, 3T, 3T)`` bool. A padded query may attend to itself, so no softmax row is empty.
    """
    batch, steps = step_mask.shape
    token_mask = step_mask.repeat_interleave(3, dim=1)  # (B, 3T): R_t, s_t, a_t share step t's flag
    length = 3 * steps
    causal = torch.ones(length, length, dtype=torch.bool, device=step_mask.device).tril()  # (3T, 3T)
    diagonal = torch.eye(length, dtype=torch.bool, device=step_mask.device)
    return ((causal & token_mask[:, None, :]) | diagonal)[:, None]  # (B, 1, 3T, 3T)


class TffDecisionTransformerAttention(nn.Module):
    """Multi-head causal self-attention (GPT-2's) through `tf_family.attention.attend` (eager or SDPA)."""

    def __init__(self, config: TffDecisionTransformerConfig, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads = config.n_head
        self.head_dim = config.hidden_size // config.n_head
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.out_proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.out_proj._is_residual_projection = True
        self.attention_dropout = nn.Dropout(config.attn_pdrop)
        self.dropout = nn.Dropout(config.resid_pdrop)

    def forward(
        self, hidden: torch.Tensor, allowed: torch.Tensor, output_attentions: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        batch, length, width = hidden.shape
        query, key, value = self.qkv(hidden).split(width, dim=-1)  # 3 x (B, T, D)
        query = query.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)
        key = key.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, S, Dh)
        value = value.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, S, Dh)
        # Attention maps come from the eager dense twin, whatever the configured implementation. SDPA stays
        # PyTorch's in CPU training too (cpu_kernels=False): tf_family's CPU kernels were measured at the sparse
        # models' tile shapes, and a seed keeps drawing the same dropout masks as before.
        attended, probs = attend(
            query,
            key,
            value,
            allowed,
            dropout_p=self.attention_dropout.p if self.training else 0.0,
            implementation="eager" if output_attentions else self.config._attn_implementation,
            cpu_kernels=False,
        )  # (B, H, T, Dh), (B, H, T, S) or None
        attended = attended.transpose(1, 2).reshape(batch, length, width)  # (B, T, D)
        return self.dropout(self.out_proj(attended)), probs


class TffDecisionTransformerMLP(nn.Module):
    def __init__(self, config: TffDecisionTransformerConfig):
        super().__init__()
        self.fc_in = nn.Linear(config.hidden_size, config.n_inner)
        self.fc_out = nn.Linear(config.n_inner, config.hidden_size)
        self.fc_out._is_residual_projection = True
        self.act = ACT2FN[config.activation_function]
        self.dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.fc_out(self.act(self.fc_in(hidden))))


class TffDecisionTransformerBlock(GradientCheckpointingLayer):
    """A pre-norm GPT-2 block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))``; with ``gating="gru"`` a GTrXL block:
    ``x1 = g1(x, relu(attn(ln(x))))``, then ``g2(x1, relu(mlp(ln(x1))))`` (`GRUGate` in place of each residual)."""

    def __init__(self, config: TffDecisionTransformerConfig, layer_idx: int):
        super().__init__()
        self.attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_epsilon)
        self.attention = TffDecisionTransformerAttention(config, layer_idx)
        self.mlp_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_epsilon)
        self.mlp = TffDecisionTransformerMLP(config)
        gated = config.gating == "gru"
        self.attention_gate = GRUGate(config.hidden_size, config.gate_bias) if gated else None
        self.mlp_gate = GRUGate(config.hidden_size, config.gate_bias) if gated else None

    def forward(
        self, hidden: torch.Tensor, allowed: torch.Tensor, output_attentions: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        attended, probs = self.attention(self.attention_norm(hidden), allowed, output_attentions)
        if self.attention_gate is None:
            hidden = hidden + attended
            return hidden + self.mlp(self.mlp_norm(hidden)), probs
        hidden = self.attention_gate(hidden, F.relu(attended))
        return self.mlp_gate(hidden, F.relu(self.mlp(self.mlp_norm(hidden)))), probs


class TffDecisionTransformerPreTrainedModel(TffPreTrainedModel):
    config_class = TffDecisionTransformerConfig
    config: TffDecisionTransformerConfig
    base_model_prefix = "decision_transformer"
    carried_state = None  # nothing carried between calls
    # `Trainer` gets no ``num_items_in_batch`` from this model and divides the loss by the accumulation steps itself:
    # what it would count (``labels != -100``) is not what the loss averages over (continuous actions are floats and
    # padded steps are marked by ``attention_mask``, not -100; the next-state / next-return losses average over
    # pairs of real steps). Accumulated, the loss is the mean of the micro-batches' losses (as the
    # decision_transformer recipe accumulates): the large-batch loss when the micro-batches hold as many real steps.
    accepts_loss_kwargs = False
    main_input_name = "states"
    supports_gradient_checkpointing = True
    _no_split_modules = ["TffDecisionTransformerBlock"]
    _supports_sdpa = True
    # the attention reads config._attn_implementation at every call, so switching it later is safe
    _can_set_attn_implementation_cached_value = True

    def enable_input_require_grads(self):
        """Make the transformer's input tokens require grad, so that reentrant gradient checkpointing
        (``use_reentrant=True``) gives frozen-body adapters (LoRA) their gradients: transformers' version hooks
        `get_input_embeddings`, a token embedding this model does not have (its steps are states, returns and
        actions, embedded apart); the hook sits on ``embed_ln`` instead, whose output is every step's token."""

        def make_inputs_require_grads(module, input, output):
            output.requires_grad_(True)

        self._require_grads_hooks = [
            module.embed_ln.register_forward_hook(make_inputs_require_grads)
            for module in self.modules()
            if isinstance(module, TffDecisionTransformerModel)
        ]
        self._require_grads_hook = self._require_grads_hooks[0]  # transformers' older name for the first hook

    @torch.no_grad()
    def _init_weights(self, module: nn.Module):
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            if getattr(module, "_is_residual_projection", False):
                # GPT-2: residual projections scaled by 1/sqrt(2 * n_layer) (two per block)
                std = std / math.sqrt(2 * self.config.n_layer)
            init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, GRUGate):  # GTrXL: Xavier matrices, b_g at its configured value (near identity)
            module.reset_parameters()


class TffDecisionTransformerModel(TffDecisionTransformerPreTrainedModel):
    """The Decision Transformer: embeddings of ``(R, s, a)`` steps, a causal transformer, and action (optionally
    next-state and next-return) prediction heads, with a loss when the actions are given as ``labels``."""

    def __init__(self, config: TffDecisionTransformerConfig):
        super().__init__(config)
        width = config.hidden_size
        self.embed_timestep = nn.Embedding(config.max_ep_len, width)
        self.embed_return = nn.Linear(1, width)
        self.embed_state = nn.Linear(config.state_dim, width)
        self.embed_action = nn.Linear(config.act_dim, width)
        self.embed_ln = nn.LayerNorm(width, eps=config.layer_norm_epsilon)
        self.dropout = nn.Dropout(config.embd_pdrop)
        self.layers = nn.ModuleList(TffDecisionTransformerBlock(config, i) for i in range(config.n_layer))
        self.final_norm = nn.LayerNorm(width, eps=config.layer_norm_epsilon)
        self.predict_action = nn.Linear(width, config.act_dim)
        self.predict_state = nn.Linear(width, config.state_dim) if config.predict_state else None
        self.predict_return = nn.Linear(width, 1) if config.predict_return else None
        self.gradient_checkpointing = False
        self.post_init()

    # ----------------------------------------------------------------------------------------------- inputs
    def normalize_states(self, states: torch.Tensor) -> torch.Tensor:
        """``(s - state_mean) / state_std`` with the statistics of the config."""
        mean = torch.tensor(self.config.state_mean, device=states.device, dtype=states.dtype)
        std = torch.tensor(self.config.state_std, device=states.device, dtype=states.dtype)
        return (states - mean) / std

    def action_features(self, actions: torch.Tensor) -> torch.Tensor:
        """Actions as the ``(B, T, act_dim)`` float vectors the action embedding reads.

        Discrete actions may be ids ``(B, T)`` (a negative id, e.g. ``-100``, means "no action yet": a zero vector)
        or one-hot vectors ``(B, T, act_dim)``.
        """
        if self.config.discrete and actions.dim() == 2:
            if actions.is_floating_point():
                raise TypeError(f"discrete actions given as ids must be integers, got dtype {actions.dtype}.")
            valid = actions >= 0
            one_hot = F.one_hot(actions.clamp(min=0), self.config.act_dim)  # (B, T, act_dim)
            return (one_hot * valid[..., None]).to(self.embed_action.weight.dtype)
        if actions.dim() != 3 or actions.shape[-1] != self.config.act_dim:
            expected = "(B, T) ids or (B, T, act_dim) one-hot" if self.config.discrete else "(B, T, act_dim)"
            raise ValueError(
                f"actions must have shape {expected} with act_dim={self.config.act_dim}, got {tuple(actions.shape)}."
            )
        return actions.to(self.embed_action.weight.dtype)

    def _check_inputs(self, states, actions, returns_to_go, timesteps, attention_mask) -> None:
        if states is None or actions is None or returns_to_go is None or timesteps is None:
            missing = [
                name
                for name, value in (
                    ("states", states),
                    ("actions", actions),
                    ("returns_to_go", returns_to_go),
                    ("timesteps", timesteps),
                )
                if value is None
            ]
            raise ValueError(f"TffDecisionTransformerModel.forward needs {missing} (every one of the (R, s, a, t)).")
        for name, value in (("states", states), ("actions", actions), ("returns_to_go", returns_to_go)):
            check_tensor(name, value)
        check_tensor("timesteps", timesteps, integer=True)
        if states.dim() != 3 or states.shape[-1] != self.config.state_dim:
            raise ValueError(
                f"states must have shape (B, T, state_dim={self.config.state_dim}), got {tuple(states.shape)}."
            )
        batch, steps = states.shape[:2]
        if batch == 0 or steps == 0:
            raise ValueError(
                f"states is empty (shape {tuple(states.shape)}): pass at least one step of one trajectory."
            )
        if returns_to_go.shape not in ((batch, steps, 1), (batch, steps)):
            raise ValueError(f"returns_to_go must have shape {(batch, steps, 1)}, got {tuple(returns_to_go.shape)}.")
        if timesteps.shape != (batch, steps):
            raise ValueError(f"timesteps must have shape {(batch, steps)}, got {tuple(timesteps.shape)}.")
        if tuple(actions.shape[:2]) != (batch, steps):
            raise ValueError(
                f"actions must cover the same (B, T)={(batch, steps)} as states, got {tuple(actions.shape)}."
            )
        if attention_mask is not None:
            check_tensor("attention_mask", attention_mask)
        if attention_mask is not None and attention_mask.shape != (batch, steps):
            raise ValueError(f"attention_mask must have shape {(batch, steps)}, got {tuple(attention_mask.shape)}.")
        # a NaN in one step would reach every step of its row through attention (0 * NaN): refuse it here
        for name, value in (("states", states), ("returns_to_go", returns_to_go), ("actions", actions)):
            check_finite(name, value, max_abs=None)  # the magnitude is checked where the embeddings read them
        if self.config.discrete and actions.dim() == 2:
            if actions.is_floating_point():
                raise TypeError(f"discrete actions given as ids must be integers, got dtype {actions.dtype}.")
            check_ids_in_range("actions", actions[actions >= 0], self.config.act_dim, what="act_dim")
        if not torch.compiler.is_compiling():
            low, high = int(timesteps.min()), int(timesteps.max())
            if low < 0 or high >= self.config.max_ep_len:
                raise ValueError(
                    f"timesteps must lie in [0, max_ep_len={self.config.max_ep_len}), got values in [{low}, {high}]; "
                    "clamp them or raise max_ep_len."
                )

    # ---------------------------------------------------------------------------------------------- forward
    def forward(
        self,
        states: torch.Tensor | None = None,
        actions: torch.Tensor | None = None,
        returns_to_go: torch.Tensor | None = None,
        timesteps: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        rewards: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> TffDecisionTransformerOutput | tuple:
        r"""
        Args:
            states: ``(B, T, state_dim)`` raw environment states (normalised inside with the config's statistics).
            actions: ``(B, T, act_dim)`` continuous actions, or discrete action ids ``(B, T)`` (negative = none) or
                one-hot ``(B, T, act_dim)``. ``a_t`` never influences the prediction of ``a_t``; when acting, the
                current step's action is a placeholder (zeros / ``-100``).
            returns_to_go: ``(B, T, 1)`` or ``(B, T)`` raw undiscounted returns-to-go (divided by
                ``config.return_scale`` inside).
            timesteps: ``(B, T)`` episode timesteps, in ``[0, max_ep_len)``.
            attention_mask: ``(B, T)`` 1 on real steps, 0 on padding (left or right); defaults to all ones, on the
                inputs' device.
            labels: the target actions, shaped like continuous ``actions`` or, for discrete actions, ids ``(B, T)``
                (``-100`` ignored). Padded steps never count.
            rewards: accepted for compatibility with transformers' `DecisionTransformerModel`; unused (as there).

        transformers' `DecisionTransformerModel` signature (the recipe and `Trainer` pass these by name), hence more
        than ~6 parameters.
        """
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        output_attentions = output_attentions if output_attentions is not None else self.config.output_attentions
        output_hidden_states = (
            output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states
        )
        self._check_inputs(states, actions, returns_to_go, timesteps, attention_mask)
        batch, steps = states.shape[:2]
        step_mask = (
            torch.ones(batch, steps, dtype=torch.bool, device=states.device)
            if attention_mask is None
            else attention_mask.to(device=states.device, dtype=torch.bool)
        )  # (B, T)
        if returns_to_go.dim() == 2:
            returns_to_go = returns_to_go[..., None]  # (B, T, 1)
        hidden = self._embed_trajectory(states, actions, returns_to_go, timesteps)  # (B, 3T, D)
        allowed = build_trajectory_attention_mask(step_mask)  # (B, 1, 3T, 3T)
        hidden, all_hidden, all_attentions = self._run_layers(hidden, allowed, output_attentions, output_hidden_states)

        per_step = hidden.view(batch, steps, 3, self.config.hidden_size)  # (B, T, 3, D): each step's R, s, a tokens
        action_preds = self.predict_action(per_step[:, :, 1])  # from s_t: (B, T, act_dim)
        if self.config.action_tanh:
            action_preds = torch.tanh(action_preds)
        state_preds = self.predict_state(per_step[:, :, 2]) if self.predict_state is not None else None
        return_preds = self.predict_return(per_step[:, :, 2]) if self.predict_return is not None else None

        loss = action_loss = None
        if labels is not None:
            action_loss = self._action_loss(action_preds, labels, step_mask)
            loss = self._add_next_step_losses(action_loss, state_preds, return_preds, states, returns_to_go, step_mask)
        output = TffDecisionTransformerOutput(
            loss=loss,
            action_loss=action_loss,
            action_preds=action_preds,
            state_preds=state_preds,
            return_preds=return_preds,
            last_hidden_state=hidden,
            hidden_states=all_hidden if output_hidden_states else None,
            attentions=all_attentions if output_attentions else None,
        )
        return output if return_dict else output.to_tuple()

    def _embed_trajectory(self, states, actions, returns_to_go, timesteps) -> torch.Tensor:
        """The interleaved token sequence ``(R_1, s_1, a_1, R_2, ...)`` ``(B, 3T, D)``, after the embedding norm and
        dropout (``returns_to_go`` ``(B, T, 1)``)."""
        batch, steps = states.shape[:2]
        dtype = self.embed_state.weight.dtype
        time = self.embed_timestep(timesteps)  # (B, T, D)
        normalized_states = self.normalize_states(states.to(dtype))
        scaled_returns = returns_to_go.to(dtype) / self.config.return_scale
        # what the embeddings read must stay in float32's working range (checked once, here)
        check_finite("states (after config.state_mean / state_std)", normalized_states)
        check_finite("returns_to_go (after config.return_scale)", scaled_returns)
        check_finite("actions", actions)
        state_tokens = self.embed_state(normalized_states) + time
        action_tokens = self.embed_action(self.action_features(actions)) + time
        return_tokens = self.embed_return(scaled_returns) + time
        # (R_1, s_1, a_1, R_2, ...): stack on a new axis after T, then merge the two
        tokens = torch.stack([return_tokens, state_tokens, action_tokens], dim=2)
        return self.dropout(self.embed_ln(tokens.reshape(batch, 3 * steps, self.config.hidden_size)))

    def _run_layers(self, hidden, allowed, output_attentions: bool, output_hidden_states: bool):
        """Every layer, then the final norm: the last hidden state ``(B, 3T, D)``, the hidden states (every
        layer's input and the normed output, when asked for) and every layer's probabilities (when asked for)."""
        all_hidden, all_attentions = (), ()
        for layer in self.layers:
            if output_hidden_states:
                all_hidden += (hidden,)
            hidden, probs = layer(hidden, allowed, output_attentions=output_attentions)
            if output_attentions:
                all_attentions += (probs,)
        hidden = self.final_norm(hidden)  # (B, 3T, D)
        if output_hidden_states:
            all_hidden += (hidden,)
        return hidden, all_hidden, all_attentions

    def _add_next_step_losses(self, loss, state_preds, return_preds, states, returns_to_go, step_mask) -> torch.Tensor:
        """``loss`` plus the weighted next-state and next-return mean squared errors (those with a weight above 0);
        targets exist where steps t and t + 1 are both real."""
        dtype = self.embed_state.weight.dtype
        pair_mask = step_mask[:, :-1] & step_mask[:, 1:]  # (B, T-1)
        if self.config.state_loss_weight > 0:
            target = self.normalize_states(states.to(dtype))[:, 1:]
            loss = loss + self.config.state_loss_weight * _masked_mse(state_preds[:, :-1], target, pair_mask)
        if self.config.return_loss_weight > 0:
            target = returns_to_go.to(dtype)[:, 1:] / self.config.return_scale
            loss = loss + self.config.return_loss_weight * _masked_mse(return_preds[:, :-1], target, pair_mask)
        return loss

    def _action_loss(self, action_preds: torch.Tensor, labels: torch.Tensor, step_mask: torch.Tensor) -> torch.Tensor:
        batch, steps = step_mask.shape
        check_tensor("labels", labels)
        if self.config.discrete:
            if labels.shape != (batch, steps) or labels.is_floating_point():
                raise ValueError(
                    f"discrete labels must be action ids of shape {(batch, steps)} (-100 ignored), got "
                    f"{tuple(labels.shape)} {labels.dtype}."
                )
            check_class_labels("labels", labels, self.config.act_dim, (batch, steps), "act_dim")
            targets = labels.masked_fill(~step_mask, IGNORE_INDEX).reshape(-1)  # (B*T,)
            return F.cross_entropy(
                action_preds.float().reshape(-1, self.config.act_dim), targets, ignore_index=IGNORE_INDEX
            )
        if labels.shape != action_preds.shape:
            raise ValueError(f"labels must have shape {tuple(action_preds.shape)}, got {tuple(labels.shape)}.")
        check_finite("labels", labels)
        return _masked_mse(action_preds, labels, step_mask)

    # ------------------------------------------------------------------------------------------------ acting
    @torch.no_grad()
    def get_action(
        self,
        states: torch.Tensor,
        actions: torch.Tensor,
        returns_to_go: torch.Tensor,
        timesteps: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        do_sample: bool = False,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """The action for the last state of each trajectory, from its last ``K = config.context_length`` steps.

        Pass the history as it is; cropping to ``K`` steps, left padding and the attention mask happen here.

        Args:
            states: ``(B, t, state_dim)`` (or ``(t, state_dim)`` for one trajectory) raw states, the current one
                last.
            actions: the actions taken so far, ``t - 1`` steps (or ``t`` with a placeholder last); continuous
                ``(B, ·, act_dim)``, discrete ids ``(B, ·)``.
            returns_to_go: ``(B, t)`` or ``(B, t, 1)`` raw returns-to-go, the current target last.
            timesteps: ``(B, t)`` timesteps (clamped to ``max_ep_len - 1``).
            attention_mask: ``(B, t)`` for histories that are themselves padded (e.g. from `TrajectoryContext`).
            do_sample: discrete actions only: sample from the predicted distribution (with ``generator``) instead
                of taking the most likely action.

        Returns:
            ``(B, act_dim)`` continuous actions or ``(B,)`` discrete action ids (no batch dimension for unbatched
            input).
        """
        history, unbatched = self._check_history(states, actions, returns_to_go, timesteps, attention_mask)
        outputs = self(**self._acting_window(*history), return_dict=True)
        prediction = outputs.action_preds[:, -1]  # (B, act_dim)
        if self.config.discrete:
            if do_sample:
                probs = prediction.float().softmax(-1)
                prediction = torch.multinomial(probs, 1, generator=generator)[:, 0]
            else:
                prediction = prediction.argmax(-1)  # (B,)
        return prediction[0] if unbatched else prediction

    def _check_history(self, states, actions, returns_to_go, timesteps, attention_mask) -> tuple[tuple, bool]:
        """`get_action`'s history checked and made batched: ``states`` ``(B, t, state_dim)``, ``actions`` over the
        ``t`` steps (the placeholder of the action to predict appended), ``returns_to_go`` ``(B, t)``,
        ``timesteps`` ``(B, t)`` and the step mask ``(B, t)`` bool; and whether it was one unbatched trajectory."""
        for name, value in (("states", states), ("actions", actions), ("returns_to_go", returns_to_go)):
            check_tensor(name, value)
        check_tensor("timesteps", timesteps, integer=True)
        if states.dim() not in (2, 3) or states.shape[-2] == 0:
            raise ValueError(
                f"states must be a non-empty history (t, state_dim) or (B, t, state_dim), got shape {tuple(states.shape)}."
            )
        unbatched = states.dim() == 2
        if unbatched:  # one trajectory
            states, actions = states[None], actions[None]
            returns_to_go, timesteps = returns_to_go[None], timesteps[None]
            attention_mask = None if attention_mask is None else attention_mask[None]
        batch, length = states.shape[:2]
        if returns_to_go.dim() not in (2, 3) or tuple(returns_to_go.shape[:2]) != (batch, length):
            raise ValueError(
                f"returns_to_go must cover the states' {length} steps, got shape {tuple(returns_to_go.shape)}."
            )
        if tuple(timesteps.shape) != (batch, length):
            raise ValueError(f"timesteps must cover the states' {length} steps, got shape {tuple(timesteps.shape)}.")
        if actions.dim() not in (2, 3) or actions.shape[0] != batch:
            raise ValueError(f"actions must have one row per trajectory ({batch}), got shape {tuple(actions.shape)}.")
        if returns_to_go.dim() == 3:
            returns_to_go = returns_to_go[..., 0]
        if actions.shape[1] == length - 1:  # append the placeholder of the action to predict
            placeholder_shape = (batch, 1) if actions.dim() == 2 else (batch, 1, actions.shape[-1])
            fill = IGNORE_INDEX if self.config.discrete and actions.dim() == 2 else 0
            actions = torch.cat([actions, actions.new_full(placeholder_shape, fill)], dim=1)
        if actions.shape[1] != length:
            raise ValueError(f"actions must cover {length - 1} or {length} steps (states cover {length}).")
        mask = (
            torch.ones(batch, length, dtype=torch.bool, device=states.device)
            if attention_mask is None
            else attention_mask.to(torch.bool)
        )
        return (states, actions, returns_to_go, timesteps, mask), unbatched

    def _acting_window(self, states, actions, returns_to_go, timesteps, mask) -> dict:
        """The model's inputs for acting: the last ``K = config.context_length`` steps of a checked history, left
        padded up to ``K`` (padded steps masked; discrete ids there mean "no action"), timesteps clamped to
        ``max_ep_len - 1``."""
        context = self.config.context_length
        states, actions = states[:, -context:], actions[:, -context:]
        returns_to_go, timesteps, mask = returns_to_go[:, -context:], timesteps[:, -context:], mask[:, -context:]
        pad = context - states.shape[1]
        if pad > 0:  # left padding up to K steps
            states = F.pad(states, (0, 0, pad, 0))
            if actions.dim() == 3:
                actions = F.pad(actions, (0, 0, pad, 0))
            else:  # discrete ids: padded steps hold "no action"
                actions = F.pad(actions, (pad, 0), value=IGNORE_INDEX)
            returns_to_go, timesteps = F.pad(returns_to_go, (pad, 0)), F.pad(timesteps, (pad, 0))
            mask = F.pad(mask, (pad, 0), value=False)
        return {
            "states": states,
            "actions": actions,
            "returns_to_go": returns_to_go,
            "timesteps": timesteps.long().clamp(0, self.config.max_ep_len - 1),
            "attention_mask": mask,
        }


def _masked_mse(prediction: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean squared error over the entries of the real steps (``mask``: ``(B, T)`` bool)."""
    squared = (prediction.float() - target.float()).pow(2) * mask[..., None]  # (B, T, F)
    count = mask.sum() * prediction.shape[-1]
    return squared.sum() / count.clamp(min=1)


@dataclass
class TrajectoryContext:
    """The rolling context of a batch of episodes: the last ``K`` steps, left-padded, with their mask.

    Every tensor keeps exactly ``K = config.context_length`` steps; the newest step is last. Use it to act step by
    step (one row per environment of a vector env)::

        context = TrajectoryContext.start(model.config, first_states, target_return=200.0)
        while ...:
            action = model.get_action(**context.model_inputs())
            next_states, rewards, ... = env.step(action)
            context = context.advance(action, rewards, next_states)

    Attributes:
        states: ``(B, K, state_dim)``; actions: ``(B, K, act_dim)`` (continuous) or ``(B, K)`` ids (discrete; -100
        before an action is known); returns_to_go: ``(B, K)``; timesteps: ``(B, K)``; mask: ``(B, K)`` bool.
    """

    states: torch.Tensor
    actions: torch.Tensor
    returns_to_go: torch.Tensor
    timesteps: torch.Tensor
    mask: torch.Tensor

    @classmethod
    def start(
        cls,
        config: TffDecisionTransformerConfig,
        states: torch.Tensor,
        target_return: float | torch.Tensor | None = None,
    ) -> TrajectoryContext:
        """A context whose only real step is the first state ``(B, state_dim)`` with return-to-go
        ``target_return`` (a number or ``(B,)``; defaults to ``config.target_return``)."""
        if target_return is None:
            if config.target_return is None:
                raise ValueError("Pass target_return, or set config.target_return (the return to condition on).")
            target_return = config.target_return
        batch, device = states.shape[0], states.device
        context = config.context_length
        actions = (
            torch.full((batch, context), IGNORE_INDEX, dtype=torch.long, device=device)
            if config.discrete
            else torch.zeros(batch, context, config.act_dim, device=device)
        )
        empty = cls(
            states=torch.zeros(batch, context, config.state_dim, device=device),
            actions=actions,
            returns_to_go=torch.zeros(batch, context, device=device),
            timesteps=torch.zeros(batch, context, dtype=torch.long, device=device),
            mask=torch.zeros(batch, context, dtype=torch.bool, device=device),
        )
        return empty.restart(torch.ones(batch, dtype=torch.bool, device=device), states, target_return)

    def restart(
        self, rows: torch.Tensor, states: torch.Tensor, target_return: float | torch.Tensor
    ) -> TrajectoryContext:
        """Begin a new episode in the rows where ``rows`` (``(B,)`` bool) is True, with first ``states``."""
        rows = rows.to(self.mask.device)
        target = torch.as_tensor(target_return, dtype=self.returns_to_go.dtype, device=self.mask.device)
        target = target.expand(rows.shape[0])
        fresh_mask = torch.zeros_like(self.mask)
        fresh_mask[:, -1] = True
        mask = torch.where(rows[:, None], fresh_mask, self.mask)
        new_states = self.states.clone()
        new_states[rows, -1] = states.to(self.states)[rows]
        returns_to_go = self.returns_to_go.clone()
        returns_to_go[rows, -1] = target[rows]
        timesteps = self.timesteps.clone()
        timesteps[rows, -1] = 0
        actions = self.actions.clone()
        actions[rows] = IGNORE_INDEX if actions.dim() == 2 else 0
        return TrajectoryContext(new_states, actions, returns_to_go, timesteps, mask)

    def advance(self, actions: torch.Tensor, rewards: torch.Tensor, next_states: torch.Tensor) -> TrajectoryContext:
        """Record the action taken in the newest step and its reward, then open the next step at ``next_states``
        with return-to-go ``R - reward`` (the oldest step drops out once ``K`` steps are kept)."""
        device = self.mask.device
        recorded = self.actions.clone()
        recorded[:, -1] = actions.to(device=device, dtype=recorded.dtype)
        rewards = torch.as_tensor(rewards, dtype=self.returns_to_go.dtype, device=device)

        def roll(tensor: torch.Tensor, newest: torch.Tensor) -> torch.Tensor:
            return torch.cat([tensor[:, 1:], newest[:, None]], dim=1)

        placeholder = (
            torch.full_like(recorded[:, -1], IGNORE_INDEX)
            if recorded.dim() == 2
            else torch.zeros_like(recorded[:, -1])
        )
        return TrajectoryContext(
            states=roll(self.states, next_states.to(self.states)),
            actions=roll(recorded, placeholder),
            returns_to_go=roll(self.returns_to_go, self.returns_to_go[:, -1] - rewards),
            timesteps=roll(self.timesteps, self.timesteps[:, -1] + 1),
            mask=roll(self.mask, torch.ones_like(self.mask[:, -1])),
        )

    def model_inputs(self) -> dict[str, torch.Tensor]:
        """Keyword arguments for `TffDecisionTransformerModel.get_action`."""
        return {
            "states": self.states,
            "actions": self.actions,
            "returns_to_go": self.returns_to_go,
            "timesteps": self.timesteps,
            "attention_mask": self.mask,
        }


__all__ = [
    "TffDecisionTransformerModel",
    "TffDecisionTransformerOutput",
    "TffDecisionTransformerPreTrainedModel",
    "TrajectoryContext",
    "build_trajectory_attention_mask",
]
