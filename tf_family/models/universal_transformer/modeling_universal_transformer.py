"""Universal Transformer with Adaptive Computation Time (Dehghani et al. 2019, arXiv:1807.03819; Graves 2016,
arXiv:1603.08983).

One block (self-attention + transition function; `layers_per_step` of them) is applied recurrently to every
position. Before every step the position timing signal and the step timing signal (sinusoids, section 2.1) are added
to the state, and a halting unit gives each position its halting probability; a position halts when the sum passes
``1 - act_epsilon``, its last step weighted by the remainder (`tf_family.layers.halting`). The *unweighted*
transformed state feeds the next step -- so a halted position is still computed and still serves as a key for the
positions that keep running -- and the halting-weighted state is the output. The loop ends when every (real)
position has halted, or after `act_max_steps`, where (`act_force_halt_at_max_steps`, Graves 2016) the positions
still running halt with their remainder. The ponder cost (mean ``N + R`` over the real positions) is added to
the task loss with weight `act_loss_weight`; every output carries ``ponder_steps`` (``N`` per position),
``remainders`` (``R``) and ``ponder_cost``.

Key/value cache (the causal LM): a position's transformed state at step ``n`` does not depend on halting (halting
only weighs the output), so the keys and values of step ``n`` are a function of the prefix alone and a cache holds
them per step: layer ``n * layers_per_step + i`` of a `transformers.DynamicCache`. A later token may ponder longer
than the earlier ones did, so a forward that builds a cache runs every position through all `act_max_steps` steps
(the halting weights still stop the output at each position's halting step: cached and uncached outputs are equal).
Generation with a cache thus costs ``act_max_steps`` blocks per token; without one (``use_cache=False``) it stops
at halting but re-reads the prefix.

Exporting (`torch.export`, ONNX) runs all `act_max_steps` steps as well: the early stop is a branch on the data,
which an exported graph cannot hold. The outputs are the same; the saving of halting early is lost in the graph.

Reference: tensor2tensor ``universal_transformer_util.universal_transformer_act`` (``act_type`` ``basic`` and
``accumulated``) and ``step_preprocess`` (position and step timing signals added at every step); its halting rule is
tested rule by rule in ``tests/layers/test_halting.py``.

Deviations from tensor2tensor:
- by default a position still running at `act_max_steps` halts there with its remainder (Graves 2016); tensor2tensor
  leaves it ``R = 0`` (``act_force_halt_at_max_steps=False`` restores that);
- padding positions never run (they count as halted from the start) and are left out of the ponder cost;
- by default (``layer_norm_position="pre"``) blocks are pre-layer-norm with a final layer norm, as tensor2tensor's
  code (``layer_preprocess_sequence="n"``, ``layer_postprocess_sequence="da"``). The timing signals re-added at
  every step then pile up in the un-normalised residual state (step ``n`` carries ``n`` copies of the position
  signal, and at init the token's embedding is a seventh of the state's norm by step 8). ``"post"`` is the paper's
  section 2.1 equations, ``A = LN(H + P + MHSA(H + P))``, ``H' = LN(A + FFN(A))``: the state is re-normalised after
  every step, so each step's signals enter at a constant share (the final layer norm is kept in both);
- the step timing signal is by default a sinusoid (tensor2tensor's ``step_timing_signal_type="sinusoid"``; its
  default, ``"learned"``, is ``step_timing_signal="learned"``: `LearnedStepSignal`); the word embeddings (or ``inputs_embeds``) are scaled by ``sqrt(d)`` as in
  tensor2tensor (``multiply_embedding_mode="sqrt_depth"``), and the word embeddings start at std ``d^-0.5`` as
  tensor2tensor's symbol modality starts them (not `initializer_range`), so the scaled embeddings have unit variance.

Config field <-> paper symbol: `act_max_steps` = N (Graves), `act_epsilon` = epsilon, `act_loss_weight` = tau,
`hidden_size` = d.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
from torch import nn
from transformers import Cache
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutputWithPast,
    CausalLMOutputWithPast,
    MaskedLMOutput,
    SequenceClassifierOutput,
)
from transformers.utils import logging

from ...attention import attend
from ...layers.halting import HaltingLinear, HaltingState, HaltingUnit, accumulate_state, halting_step
from ...modeling.cache import GrowingCache
from ...modeling.fused_lm_head import FusedLMHeadMixin, answers_fused_lm_head
from ...modeling.heads import GenericForMaskedLM, GenericForSequenceClassification, LMPredictionHead
from ...modeling.losses import IGNORE_INDEX, NumItems, batch_share, causal_lm_loss
from ...modeling.pretrained import TffPreTrainedModel
from ...modeling.state_names import accepts_past_key_values
from ...modeling.utils import Dropout, build_activation, key_value_generation_inputs
from ...modeling.validation import ValidatedGenerationMixin, check_cache, check_tensor
from .configuration_universal_transformer import TffUniversalTransformerConfig

logger = logging.get_logger(__name__)


def timing_signal(positions: torch.Tensor, channels: int) -> torch.Tensor:
    """tensor2tensor's ``get_timing_signal_1d`` at the given positions: sines then cosines of ``channels // 2``
    timescales from 1 to 1e4 (a zero column when ``channels`` is odd). ``positions``: any shape ``(...)`` ->
    ``(..., channels)`` float32."""
    num_timescales = channels // 2
    increment = math.log(1.0e4) / max(num_timescales - 1, 1)
    inverse = torch.exp(torch.arange(num_timescales, device=positions.device, dtype=torch.float32) * -increment)
    scaled = positions.to(torch.float32)[..., None] * inverse  # (..., channels // 2)
    signal = torch.cat([torch.sin(scaled), torch.cos(scaled)], dim=-1)
    return nn.functional.pad(signal, (0, channels % 2))


def build_allowed_mask(key_valid: torch.Tensor, query_length: int, causal: bool) -> torch.Tensor:
    """``(B, T, S)`` bool of the query-key pairs that may attend: real keys, and (``causal``) keys not after the
    query; the queries are the last ``T`` of the ``S`` positions. A query with no allowed key (a padding position)
    attends to itself, so every row has one (its output is never used)."""
    total = key_valid.shape[1]
    query_positions = torch.arange(total - query_length, total, device=key_valid.device)  # (T,)
    key_positions = torch.arange(total, device=key_valid.device)  # (S,)
    allowed = key_valid[:, None, :].expand(-1, query_length, -1)  # (B, T, S)
    if causal:
        allowed = allowed & (key_positions[None, :] <= query_positions[:, None])
    itself = key_positions[None, :] == query_positions[:, None]  # (T, S)
    return allowed | (itself & ~allowed.any(dim=-1, keepdim=True))


@dataclass
class UniversalTransformerModelOutput(BaseModelOutputWithPast):
    r"""The base model's output.

    Args:
        ponder_steps: ``(B, T)`` steps each position took (``N``; 0 on padding).
        remainders: ``(B, T)`` the weight of each position's halting step (``R``; 0 where it did not halt: only with
            ``act_force_halt_at_max_steps=False``).
        ponder_cost: scalar, the mean of ``N + R`` over the real positions.
        hidden_states: the embeddings and the unweighted state after every step (when asked for); the last entry is
            the (weighted, normalised) output.
        attentions: ``(B, H, T, S)`` probabilities of every block at every step (when asked for).
    """

    ponder_steps: torch.Tensor | None = None
    remainders: torch.Tensor | None = None
    ponder_cost: torch.Tensor | None = None


@dataclass
class UniversalTransformerCausalLMOutput(CausalLMOutputWithPast):
    r"""`CausalLMOutputWithPast` plus ``ponder_steps``, ``remainders`` and ``ponder_cost`` (see
    `UniversalTransformerModelOutput`); ``loss`` includes ``act_loss_weight * ponder_cost``."""

    ponder_steps: torch.Tensor | None = None
    remainders: torch.Tensor | None = None
    ponder_cost: torch.Tensor | None = None


@dataclass
class UniversalTransformerMaskedLMOutput(MaskedLMOutput):
    r"""`MaskedLMOutput` plus the ponder outputs (see `UniversalTransformerCausalLMOutput`)."""

    ponder_steps: torch.Tensor | None = None
    remainders: torch.Tensor | None = None
    ponder_cost: torch.Tensor | None = None


@dataclass
class UniversalTransformerSequenceClassifierOutput(SequenceClassifierOutput):
    r"""`SequenceClassifierOutput` plus the ponder outputs (see `UniversalTransformerCausalLMOutput`)."""

    ponder_steps: torch.Tensor | None = None
    remainders: torch.Tensor | None = None
    ponder_cost: torch.Tensor | None = None


class TffUniversalTransformerAttention(nn.Module):
    """Multi-head self-attention with its residual: ``x + dropout(out_proj(attend(LN(x))))`` (``layer_norm_position``
    ``"pre"``, tensor2tensor's code) or ``LN(x + dropout(out_proj(attend(x))))`` (``"post"``, the paper's section 2.1)."""

    def __init__(self, config: TffUniversalTransformerConfig):
        super().__init__()
        self.config = config
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.post_norm = config.layer_norm_position == "post"
        width = config.hidden_size
        self.layer_norm = nn.LayerNorm(width, eps=config.layer_norm_eps)
        self.query, self.key, self.value = (nn.Linear(width, width) for _ in range(3))
        self.out_proj = nn.Linear(width, width)
        self.dropout = Dropout(config.hidden_dropout_prob)
        self.attention_dropout = config.attention_probs_dropout_prob

    def _heads(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.view(*tensor.shape[:2], self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)

    def forward(
        self,
        hidden: torch.Tensor,
        allowed: torch.Tensor,
        cache: Cache | None = None,
        cache_index: int = 0,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``allowed``: ``(B, T, S)``; with a cache, ``S`` counts the cached positions and the keys and values of
        this call are appended to its layer ``cache_index``."""
        batch, length, _ = hidden.shape
        normed = hidden if self.post_norm else self.layer_norm(hidden)
        query, key, value = (self._heads(projection(normed)) for projection in (self.query, self.key, self.value))
        if cache is not None:
            key, value = cache.update(key, value, cache_index)  # (B, H, S, Dh)
        implementation = "eager" if output_attentions else self.config._attn_implementation
        dropout_p = self.attention_dropout if self.training else 0.0
        attended, probs = attend(
            query, key, value, allowed[:, None], dropout_p=dropout_p, implementation=implementation
        )  # (B, H, T, Dh)
        attended = attended.transpose(1, 2).reshape(batch, length, -1)  # (B, T, D)
        output = hidden + self.dropout(self.out_proj(attended))
        return (self.layer_norm(output) if self.post_norm else output), probs


class TffUniversalTransformerTransition(nn.Module):
    """The transition function: a position-wise feed-forward block with its residual, the layer norm at its input
    (``"pre"``) or after the residual (``"post"``, the paper's section 2.1: ``LN(a + FFN(a))``)."""

    def __init__(self, config: TffUniversalTransformerConfig):
        super().__init__()
        self.post_norm = config.layer_norm_position == "post"
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.fc_in = nn.Linear(config.hidden_size, config.intermediate_size)
        self.activation = build_activation(config.hidden_act)
        self.fc_out = nn.Linear(config.intermediate_size, config.hidden_size)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.post_norm:
            return self.layer_norm(hidden + self.dropout(self.fc_out(self.activation(self.fc_in(hidden)))))
        return hidden + self.dropout(self.fc_out(self.activation(self.fc_in(self.layer_norm(hidden)))))  # (B, T, D)


class TffUniversalTransformerBlock(GradientCheckpointingLayer):
    """One block of the recurrent step: self-attention then the transition function (weights shared over steps)."""

    def __init__(self, config: TffUniversalTransformerConfig):
        super().__init__()
        self.attention = TffUniversalTransformerAttention(config)
        self.transition = TffUniversalTransformerTransition(config)

    def forward(self, hidden, allowed, cache=None, cache_index=0, output_attentions=False):
        hidden, probs = self.attention(
            hidden, allowed, cache=cache, cache_index=cache_index, output_attentions=output_attentions
        )
        return self.transition(hidden), probs


class LearnedStepSignal(nn.Module):
    """tensor2tensor's learned step timing signal (``get_layer_timing_signal_learned_1d``): one vector per step,
    ``weight`` ``(act_max_steps, D)`` started at std ``D ** -0.5`` and read scaled by ``sqrt(D)`` (unit variance at
    init, as the sinusoid's entries)."""

    def __init__(self, steps: int, channels: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(steps, channels))
        nn.init.normal_(self.weight, std=channels**-0.5)

    def forward(self) -> torch.Tensor:
        return self.weight * self.weight.shape[1] ** 0.5  # (steps, D)


class TffUniversalTransformerPreTrainedModel(TffPreTrainedModel):
    config_class = TffUniversalTransformerConfig
    config: TffUniversalTransformerConfig
    base_model_prefix = "transformer"
    carried_state = None  # a key/value cache at most (generation), nothing recurrent between calls
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["TffUniversalTransformerBlock"]
    _supports_sdpa = True  # eager and sdpa agree: tests/models/universal_transformer/
    # the attention reads config._attn_implementation at every call, so switching it later is safe
    _can_set_attn_implementation_cached_value = True

    @torch.no_grad()
    def _init_weights(self, module: nn.Module):
        std = self.config.initializer_range
        if isinstance(module, HaltingLinear):  # before the generic linear layers: its bias starts at bias_init
            init.normal_(module.weight, mean=0.0, std=std)
            init.constant_(module.bias, self.config.act_halting_bias_init)
        elif isinstance(module, LearnedStepSignal):
            init.normal_(module.weight, mean=0.0, std=self.config.hidden_size**-0.5)
        elif isinstance(module, nn.Linear):
            init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            # tensor2tensor's symbol modality: std d^-0.5, so the sqrt(d)-scaled embeddings have unit variance, as
            # large as the timing signals added at every step (std initializer_range left them 1/5 of it at d=64)
            init.normal_(module.weight, mean=0.0, std=self.config.hidden_size**-0.5)
            if module.padding_idx is not None:
                init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # generate makes no cache: the first forward does (one layer per step and block)


class TffUniversalTransformerModel(TffUniversalTransformerPreTrainedModel):
    """The Universal Transformer encoder (or, with ``causal=True``, decoder): embeddings, the recurrent ACT loop
    over the shared blocks, a final layer norm."""

    def __init__(self, config: TffUniversalTransformerConfig, add_pooling_layer: bool = False):
        super().__init__(config)
        if add_pooling_layer:
            raise ValueError(
                "add_pooling_layer=True: the Universal Transformer has no pooler (its classifier reads the first real "
                "token's state); build the model with add_pooling_layer=False."
            )
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.embedding_dropout = Dropout(config.hidden_dropout_prob)
        self.halting = HaltingUnit(config.hidden_size, config.act_halting_bias_init, config.initializer_range)
        # only when learned, so that a sinusoid model's weights (and its old checkpoints) are unchanged
        if config.step_timing_signal == "learned":
            self.step_signal = LearnedStepSignal(config.act_max_steps, config.hidden_size)
        self.blocks = nn.ModuleList(TffUniversalTransformerBlock(config) for _ in range(config.layers_per_step))
        self.final_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.word_embeddings

    def set_input_embeddings(self, value: nn.Module):
        self.word_embeddings = value

    @accepts_past_key_values
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        cache: Cache | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> UniversalTransformerModelOutput | tuple:
        r"""
        Args:
            input_ids: ``(B, T)`` token ids (or pass ``inputs_embeds`` ``(B, T, D)``); with a filled ``cache``, the
                new tokens only.
            attention_mask: ``(B, P + T)`` 1 for real tokens, 0 for padding (left or right); ``P`` is the number of
                cached positions (0 without a cache).
            token_type_ids: not used by the Universal Transformer; must be ``None`` (the shared heads pass it).
            position_ids: ``(B, T)`` positions of the position timing signal; by default counted over the real
                tokens (so left padding changes nothing).
            output_attentions: return the ``(B, H, T, P + T)`` probabilities of every block at every step.
            cache: a `transformers.Cache` of earlier calls' keys and values (causal models only), one layer per step
                and block; a forward with a cache runs all ``act_max_steps`` steps.
            use_cache: return the cache (a new one when none is given); causal models only. Defaults to
                ``config.use_cache`` for a causal model in eval mode, False otherwise (building it costs every step).

        transformers' encoder signature (heads, `generate` and `Trainer` pass these by name), hence more than ~6
        parameters.
        """
        config = self.config
        output_attentions = output_attentions if output_attentions is not None else config.output_attentions
        output_hidden_states = (
            output_hidden_states if output_hidden_states is not None else config.output_hidden_states
        )
        return_dict = return_dict if return_dict is not None else config.return_dict
        batch, length, use_cache = self._check_inputs(
            input_ids=input_ids,
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            cache=cache,
            use_cache=use_cache,
        )
        if use_cache and cache is None:
            cache = GrowingCache()  # layers are made as steps first write them
        past_length = cache.get_seq_length() if cache is not None else 0
        hidden = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds  # (B, T, D)
        # tensor2tensor's multiply_embedding_mode="sqrt_depth": unscaled, embeddings of std initializer_range would be
        # drowned by the timing signals (entries in [-1, 1], added again at every step) and the model would not learn
        hidden = self.embedding_dropout(hidden * math.sqrt(config.hidden_size))
        key_valid = (
            torch.ones(batch, past_length + length, dtype=torch.bool, device=hidden.device)
            if attention_mask is None
            else attention_mask.to(torch.bool)
        )  # (B, S)
        if position_ids is None:
            real = key_valid.long()
            position_ids = ((real.cumsum(dim=1) - 1).clamp(min=0) * real)[:, past_length:]  # (B, T)
        allowed = build_allowed_mask(key_valid, length, config.causal)  # (B, T, S)
        position_signal = timing_signal(position_ids, config.hidden_size).to(hidden.dtype)  # (B, T, D)
        if config.step_timing_signal == "learned":
            step_signals = self.step_signal()  # (act_max_steps, D)
        else:
            step_signals = timing_signal(torch.arange(config.act_max_steps, device=hidden.device), config.hidden_size)

        # every step when the keys of every step are kept (a cache) or when the loop is traced (an export)
        every_step = cache is not None or torch.compiler.is_exporting()
        halting = HaltingState.start(key_valid[:, past_length:])
        state, output = hidden, torch.zeros_like(hidden)
        all_hidden = (hidden,) if output_hidden_states else ()
        all_attentions = ()
        for step in range(config.act_max_steps):
            if not every_step and not bool(halting.running.any()):
                break
            state = state + position_signal + step_signals[step].to(state.dtype)
            last = config.act_force_halt_at_max_steps and step == config.act_max_steps - 1
            halting, weights = halting_step(halting, self.halting(state), config.act_threshold, force_halt=last)
            for index, block in enumerate(self.blocks):
                state, probs = block(
                    state,
                    allowed,
                    cache=cache,
                    cache_index=step * len(self.blocks) + index,
                    output_attentions=output_attentions,
                )
                if output_attentions:
                    all_attentions += (probs,)
            output = accumulate_state(output, state, weights, config.act_type == "accumulated")
            if output_hidden_states:
                all_hidden += (state,)
        output = self.final_layer_norm(output)
        if output_hidden_states:
            all_hidden += (output,)
        real = key_valid[:, past_length:].to(halting.n_updates.dtype)
        ponder_cost = (halting.ponder_time * real).sum() / real.sum().clamp(min=1)
        result = UniversalTransformerModelOutput(
            last_hidden_state=output,
            cache=cache,
            hidden_states=all_hidden if output_hidden_states else None,
            attentions=all_attentions if output_attentions else None,
            ponder_steps=halting.n_updates,
            remainders=halting.remainders,
            ponder_cost=ponder_cost,
        )
        return result if return_dict else result.to_tuple()

    def _check_inputs(
        self, *, input_ids, inputs_embeds, attention_mask, token_type_ids, position_ids, cache, use_cache
    ) -> tuple[int, int, bool]:
        """`forward`'s inputs checked once, at the edge: ``(B, T)`` and whether to build a cache. Every argument is
        `forward`'s, by name."""
        batch, length = self._check_token_inputs(input_ids, inputs_embeds)
        config = self.config
        if token_type_ids is not None:
            raise ValueError(
                "token_type_ids: the Universal Transformer has no token-type embeddings; pass token_type_ids=None."
            )
        if position_ids is not None:
            check_tensor("position_ids", position_ids, integer=True, dim=2)
            if position_ids.shape[1] != length or position_ids.shape[0] not in (1, batch):
                raise ValueError(f"position_ids must have shape {(batch, length)}, got {tuple(position_ids.shape)}.")
        check_cache(cache, batch, config.num_attention_heads, config.hidden_size // config.num_attention_heads)
        cache_layers = config.act_max_steps * config.layers_per_step
        if cache is not None and cache.layer_class_to_replicate is None and len(cache.layers) != cache_layers:
            raise ValueError(
                f"cache holds {len(cache.layers)} layers of keys and values, but this Universal Transformer keeps one "
                f"per recurrent step and block: act_max_steps x layers_per_step = {config.act_max_steps} x "
                f"{config.layers_per_step} = {cache_layers}. For PEFT prefix tuning, pass "
                f"PrefixTuningConfig(num_layers={cache_layers}, ...) (PEFT reads num_hidden_layers, the blocks of one "
                "step)."
            )
        if use_cache is None:
            use_cache = config.use_cache and config.causal and not self.training
        if (cache is not None or use_cache) and not config.causal:
            raise ValueError(
                "cache (past_key_values) / use_cache need a causal model (config.causal=True, e.g. "
                "TffUniversalTransformerForCausalLM): a bidirectional encoder also reads tokens that come later."
            )
        if self.gradient_checkpointing and self.training and (use_cache or cache is not None):
            if cache is not None:  # recomputed blocks would append their keys twice
                raise ValueError("cache cannot be used with gradient checkpointing in training mode.")
            logger.warning_once("use_cache=True is incompatible with gradient checkpointing in training; not caching.")
            use_cache = False
        past_length = cache.get_seq_length() if cache is not None else 0
        if attention_mask is not None:
            self._check_mask("attention_mask", attention_mask, batch, past_length + length)
        return batch, length, bool(use_cache)


def add_ponder_cost(
    task_loss: torch.Tensor, ponder_cost: torch.Tensor, weight: float, counted, num_items_in_batch: NumItems
) -> torch.Tensor:
    """``task_loss + weight * ponder_cost``. The ponder cost is a mean over this call's real positions; under
    `Trainer`'s gradient accumulation (``num_items_in_batch``) it enters weighted by the call's share ``counted /
    num_items_in_batch`` of the labelled items (`tf_family.modeling.losses.batch_share`): accumulated, the label-weighted
    average of the micro-batches' ponder costs (the task loss stays exact)."""
    return task_loss + weight * batch_share(ponder_cost.to(task_loss.dtype), counted, num_items_in_batch)


class _PonderingHead:
    """The shared heads' output with the ponder outputs added, and the ponder cost (times ``act_loss_weight``) in
    the loss (`add_ponder_cost`)."""

    def _finish(self, outputs, logits, *, labels, return_dict, num_items_in_batch=None):
        loss = None
        if labels is not None:
            task_loss = self._loss(logits, labels, num_items_in_batch)
            # the items `Trainer` counts: every entry of a classifier's labels, the non-ignored tokens of an LM's
            counted = labels.numel() if logits.dim() == 2 else (labels != IGNORE_INDEX).sum()
            weight = self.config.act_loss_weight
            loss = add_ponder_cost(task_loss, outputs.ponder_cost, weight, counted, num_items_in_batch)
        output = self.output_class(
            loss=loss,
            logits=logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            ponder_steps=outputs.ponder_steps,
            remainders=outputs.remainders,
            ponder_cost=outputs.ponder_cost,
        )
        return output if self._returns_dict(return_dict) else output.to_tuple()


class TffUniversalTransformerForMaskedLM(_PonderingHead, GenericForMaskedLM, TffUniversalTransformerPreTrainedModel):
    """Masked language modelling on the encoder (dense, activation, layer norm, decoder tied to the embeddings)."""

    base_model_class = TffUniversalTransformerModel
    output_class = UniversalTransformerMaskedLMOutput
    lm_head_activation = "gelu"
    _tied_weights_keys = {"lm_head.decoder.weight": "transformer.word_embeddings.weight"}


class TffUniversalTransformerForSequenceClassification(
    _PonderingHead, GenericForSequenceClassification, TffUniversalTransformerPreTrainedModel
):
    """A classifier (dense + tanh + linear) on the encoder's first real token."""

    base_model_class = TffUniversalTransformerModel
    output_class = UniversalTransformerSequenceClassifierOutput


class TffUniversalTransformerForCausalLM(
    FusedLMHeadMixin, TffUniversalTransformerPreTrainedModel, ValidatedGenerationMixin
):
    """A causal Universal Transformer language model. Builds its stack with ``causal=True`` whatever the given
    config says."""

    _tied_weights_keys = {"lm_head.decoder.weight": "transformer.word_embeddings.weight"}

    def __init__(self, config: TffUniversalTransformerConfig):
        if not config.causal:
            config = copy.deepcopy(config)
            config.causal = True
        super().__init__(config)
        self.transformer = TffUniversalTransformerModel(config)
        self.lm_head = LMPredictionHead(config.hidden_size, config.vocab_size, "gelu", config.layer_norm_eps)
        self.post_init()

    def get_output_embeddings(self):
        return self.lm_head.decoder

    def set_output_embeddings(self, new_embeddings):
        self.lm_head.decoder = new_embeddings

    @answers_fused_lm_head
    @accepts_past_key_values
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        inputs_embeds=None,
        labels=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        cache=None,
        use_cache=None,
        num_items_in_batch=None,
        **kwargs,
    ) -> UniversalTransformerCausalLMOutput | tuple:
        r"""labels: ``(B, T)``, usually ``input_ids``; position ``t`` is predicted from positions ``<= t-1`` (the
        shift happens inside), -100 is ignored; with ``num_items_in_batch`` the token loss is the sum over it. The
        loss adds ``act_loss_weight * ponder_cost``. ``cache`` / ``use_cache``: as in `TffUniversalTransformerModel`.

        transformers' language-model signature (`generate` and `Trainer` pass these by name), hence more than ~6
        parameters."""
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        outputs = self.transformer(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            cache=cache,
            use_cache=use_cache,
        )
        logits = self.lm_head(outputs.last_hidden_state)  # (B, T, V)
        loss = None
        if labels is not None:
            self._check_lm_labels(labels, *logits.shape[:2])
            loss = causal_lm_loss(logits, labels, num_items_in_batch)
            counted = (labels[:, 1:] != IGNORE_INDEX).sum()  # what `Trainer` counts ("ForCausalLM")
            weight = self.config.act_loss_weight
            loss = add_ponder_cost(loss, outputs.ponder_cost, weight, counted, num_items_in_batch)
        output = UniversalTransformerCausalLMOutput(
            loss=loss,
            logits=logits,
            cache=outputs.cache,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            ponder_steps=outputs.ponder_steps,
            remainders=outputs.remainders,
            ponder_cost=outputs.ponder_cost,
        )
        return output if return_dict else output.to_tuple()

    @accepts_past_key_values
    def prepare_inputs_for_generation(
        self, input_ids, cache=None, attention_mask=None, inputs_embeds=None, use_cache=True, **kwargs
    ) -> dict:
        """With a cache (the default), only the tokens it has not seen; without, the whole prefix every step.
        ``attention_mask`` always covers the whole sequence."""
        return key_value_generation_inputs(
            self, input_ids, cache, attention_mask, inputs_embeds, use_cache, kwargs.get("next_sequence_length")
        )


__all__ = [
    "LearnedStepSignal",
    "TffUniversalTransformerForCausalLM",
    "TffUniversalTransformerForMaskedLM",
    "TffUniversalTransformerForSequenceClassification",
    "TffUniversalTransformerModel",
    "TffUniversalTransformerPreTrainedModel",
    "UniversalTransformerCausalLMOutput",
    "UniversalTransformerMaskedLMOutput",
    "UniversalTransformerModelOutput",
    "UniversalTransformerSequenceClassifierOutput",
    "add_ponder_cost",
    "build_allowed_mask",
    "timing_signal",
]
