"""Kernelised-attention transformers: the Performer (FAVOR+; Choromanski et al. 2021, arXiv:2009.14794), the
Linear Transformer (Katharopoulos et al. 2020, arXiv:2006.16236) and Random Feature Attention with its gate (Peng et
al. 2021, arXiv:2103.02143).

Attention is ``phi(q) (phi(k)^T v) / phi(q) (phi(k)^T 1)`` (`tf_family.attention.kernelized`): linear in the
length. The feature map ``phi`` is the config's `feature_map`: FAVOR+ positive orthogonal random features
(``"favor"``), ``elu(x) + 1`` (``"elu"``) or random Fourier features of l2-normalised q and k (``"rfa"``, with the
optional RFA-Gate decay). The random projection of each layer is a buffer saved with the weights (a reloaded model
gives the same outputs), redrawn every `feature_redraw_interval` training calls from a generator seeded by the config
(never in eval). Causal models compute prefix sums chunk by chunk, in float32 whatever the autocast dtype, and
generate with a constant-size recurrent state per layer (`TffPerformerCache`: ``sum phi(k) v^T`` and
``sum phi(k)``).

Blocks are pre-layer-norm (GPT-2's), with learned absolute positions counted over real tokens (left padding gives
the same result as none).

Parity reference: performer-pytorch 1.1.4 ``PerformerLM`` given the same projection matrices, on copied weights
(``tests/models/performer/test_parity_performer.py``).

Deviations from performer-pytorch:
- causal FAVOR+ stabilises keys by the data-independent bound ``max_f |w_f|^2 / 2`` without ``+eps`` instead of a
  max over the whole sequence with ``+eps``, so that a key's features never depend on later keys and cached
  generation equals the full forward (logits within 0.3 % of performer-pytorch's);
- orthogonal random features fold the signs of R's diagonal into Q (Haar-distributed blocks); performer-pytorch's
  QR without it draws rows that are not isotropic, which biases the estimate (parity copies its matrices);
- padded keys get zero features and do not set the key stabiliser (performer-pytorch multiplies values by the mask
  only); the key stabiliser is one max per (batch, head), never over the batch.

Config field <-> paper symbol: `num_random_features` = m (Performer) / D (RFA), `feature_redraw_interval` = the
redrawing period, `rfa_gate` = RFA-Gate's g_t.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.utils import logging

from ...attention.kernelized import (
    causal_linear_attention,
    causal_linear_attention_reference,
    causal_linear_attention_weights,
    draw_random_projection,
    elu_features,
    favor_causal_key_features,
    favor_key_features,
    favor_query_features,
    linear_attention,
    linear_attention_weights,
    mask_key_features,
    random_fourier_features,
)
from ...modeling.fused_lm_head import FusedLMHeadMixin, answers_fused_lm_head
from ...modeling.heads import GenericForMaskedLM, GenericForSequenceClassification, GenericForTokenClassification
from ...modeling.losses import causal_lm_loss
from ...modeling.pretrained import TffPreTrainedModel
from ...modeling.state_names import accepts_past_key_values
from ...modeling.utils import Dropout, build_activation, decoding_step_inputs
from ...modeling.validation import ValidatedGenerationMixin, check_tensor, refuse_key_value_cache
from .cache_performer import TffPerformerCache
from .configuration_performer import TffLinearTransformerConfig, TffPerformerConfig, TffRFAConfig

logger = logging.get_logger(__name__)


def projection_generator(seed: int, layer_idx: int, redraw: int) -> torch.Generator:
    """The generator of layer ``layer_idx``'s ``redraw``-th projection (0: the initial one)."""
    return torch.Generator().manual_seed((seed * 1_000_003 + layer_idx * 10_007 + redraw) % (2**63))


class TffPerformerEmbeddings(nn.Module):
    """Word + learned position + token-type embeddings and dropout. Positions count real tokens from 0."""

    def __init__(self, config: TffPerformerConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids, inputs_embeds, token_type_ids, position_ids) -> torch.Tensor:
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)  # (B, T, D)
        if not torch.compiler.is_compiling() and int(position_ids.max()) >= self.position_embeddings.num_embeddings:
            raise ValueError(
                f"The input needs position {int(position_ids.max())} but max_position_embeddings="
                f"{self.position_embeddings.num_embeddings}; shorten the input (prompt and generated tokens) to at "
                f"most {self.position_embeddings.num_embeddings} tokens or raise max_position_embeddings."
            )
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(position_ids)
        embeddings = (
            inputs_embeds + self.position_embeddings(position_ids) + self.token_type_embeddings(token_type_ids)
        )
        return self.dropout(embeddings)


class TffPerformerAttention(nn.Module):
    """Kernelised self-attention with its output projection. Holds the layer's random projection ``(F, Dh)`` as a
    buffer (FAVOR+ and RFA), with ``redraws`` (projections drawn since the first) and ``calls_since_redraw``."""

    def __init__(self, config: TffPerformerConfig, layer_idx: int):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.layer_idx = layer_idx
        self.feature_map = config.feature_map
        self.causal = config.causal
        self.chunk_size = config.chunk_size
        self.projection_seed = config.projection_seed
        self.orthogonal = config.orthogonal_features
        self.redraw_interval = config.feature_redraw_interval
        self.num_random_features = config.random_features()
        width = config.hidden_size
        self.query, self.key, self.value = (nn.Linear(width, width) for _ in range(3))
        self.out_proj = nn.Linear(width, width)
        if self.feature_map != "elu":
            self.register_buffer("projection", self.draw_projection(0))
            self.register_buffer("redraws", torch.zeros((), dtype=torch.long, device="cpu"))
            self.register_buffer("calls_since_redraw", torch.zeros((), dtype=torch.long, device="cpu"))
        if self.feature_map == "rfa":
            # RFA's learned kernel width sigma, as its inverse per head (phi reads scale * x / |x|)
            self.feature_scale = nn.Parameter(torch.ones(self.num_heads))
        # RFA-Gate: g_t = sigmoid(w_g x_t + b_g), one per head and position
        self.gate = nn.Linear(width, self.num_heads) if config.rfa_gate else None

    def draw_projection(self, redraw: int) -> torch.Tensor:
        """The ``redraw``-th projection of this layer (float32, CPU): a pure function of the config and ``redraw``."""
        generator = projection_generator(self.projection_seed, self.layer_idx, redraw)
        with torch.device("cpu"):
            return draw_random_projection(self.num_random_features, self.head_dim, generator, self.orthogonal)

    @torch.no_grad()
    def step_redraw_schedule(self) -> None:
        """Count one training call; every `feature_redraw_interval` calls draw the next projection."""
        if self.feature_map == "elu" or self.redraw_interval == 0:
            return
        self.calls_since_redraw += 1
        if int(self.calls_since_redraw) >= self.redraw_interval:
            self.redraws += 1
            self.calls_since_redraw.zero_()
            self.projection.copy_(self.draw_projection(int(self.redraws)))

    def _heads(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.view(*tensor.shape[:2], self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)

    def _features(self, query: torch.Tensor, key: torch.Tensor, key_valid: torch.Tensor):
        """``phi(q)``, ``phi(k)`` ``(B, H, T, F)`` (float32); padded keys' features are zero."""
        if self.feature_map == "elu":
            query_features, key_features = elu_features(query), elu_features(key)
        elif self.feature_map == "rfa":
            query_features = random_fourier_features(query, self.projection, self.feature_scale)
            key_features = random_fourier_features(key, self.projection, self.feature_scale)
        else:
            query_features = favor_query_features(query, self.projection)
            if self.causal:
                key_features = favor_causal_key_features(key, self.projection)
            else:
                key_features = favor_key_features(key, self.projection, key_valid)
        return query_features, mask_key_features(key_features, key_valid)

    def forward(
        self,
        hidden: torch.Tensor,
        key_valid: torch.Tensor,
        output_attentions: bool = False,
        cache: TffPerformerCache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``hidden`` ``(B, T, D)`` the new positions; ``key_valid`` ``(B, T)`` which of them are real tokens;
        ``cache``: the causal state of earlier calls (read and updated)."""
        batch, length, _ = hidden.shape
        query, key, value = (
            self._heads(self.query(hidden)),
            self._heads(self.key(hidden)),
            self._heads(self.value(hidden)),
        )
        query_features, key_features = self._features(query, key, key_valid)
        probs = None
        if not self.causal:
            attended = linear_attention(query_features, key_features, value)  # (B, H, T, Dh)
            if output_attentions:
                probs = linear_attention_weights(query_features, key_features)
        else:
            log_decay = None
            if self.gate is not None:
                gate_logits = self.gate(hidden).float().transpose(1, 2)  # (B, H, T)
                # a padded position keeps the state as it is: g = 1 (log g = 0), and it adds nothing
                log_decay = torch.where(key_valid[:, None, :], F.logsigmoid(gate_logits), 0.0)
                key_features = key_features * torch.sigmoid(-gate_logits)[..., None]  # (1 - g_t) phi(k_t)
            state = cache.layer_state(self.layer_idx) if cache is not None else None
            if output_attentions:
                if state is not None:
                    raise ValueError(
                        "output_attentions=True is not available with a filled cache: the recurrent state keeps no "
                        "per-key weights. Call without a cache (or use_cache=False) to get attention maps."
                    )
                probs = causal_linear_attention_weights(query_features, key_features, log_decay)
            if torch.compiler.is_exporting() and cache is None:
                # an exported graph (ONNX) has a dynamic length, which the chunk loop cannot follow: the dense twin
                attended = causal_linear_attention_reference(query_features, key_features, value, log_decay)
            else:
                attended, state = causal_linear_attention(
                    query_features, key_features, value, log_decay=log_decay, state=state, chunk_size=self.chunk_size
                )
            if cache is not None:
                cache.set_layer_state(self.layer_idx, state)
        attended = attended.transpose(1, 2).reshape(batch, length, -1)  # (B, T, D)
        return self.out_proj(attended), probs


class TffPerformerFeedForward(nn.Module):
    def __init__(self, config: TffPerformerConfig):
        super().__init__()
        self.fc_in = nn.Linear(config.hidden_size, config.intermediate_size)
        self.activation = build_activation(config.hidden_act)
        self.fc_out = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.fc_out(self.activation(self.fc_in(hidden)))


class TffPerformerLayer(GradientCheckpointingLayer):
    """Pre-layer-norm block: ``x + attention(ln(x))``, then ``x + feed_forward(ln(x))``."""

    def __init__(self, config: TffPerformerConfig, layer_idx: int):
        super().__init__()
        self.attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.attention = TffPerformerAttention(config, layer_idx)
        self.feed_forward_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.feed_forward = TffPerformerFeedForward(config)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, hidden, key_valid, output_attentions=False, cache=None):
        attended, probs = self.attention(
            self.attention_norm(hidden), key_valid=key_valid, output_attentions=output_attentions, cache=cache
        )
        hidden = hidden + self.dropout(attended)
        hidden = hidden + self.dropout(self.feed_forward(self.feed_forward_norm(hidden)))
        return hidden, probs


class TffPerformerPreTrainedModel(TffPreTrainedModel):
    config_class = TffPerformerConfig
    config: TffPerformerConfig
    base_model_prefix = "performer"
    carried_state = None  # nothing carried between training calls (generation's state is a Cache)
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["TffPerformerLayer"]

    @torch.no_grad()
    def _init_weights(self, module: nn.Module):
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=std)
            if module.padding_idx is not None:
                init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, TffPerformerAttention):
            if module.feature_map == "rfa":
                init.ones_(module.feature_scale)
            if module.feature_map != "elu":  # a model built on the meta device gets its projection here
                init.copy_(module.projection, module.draw_projection(0))
                init.zeros_(module.redraws)
                init.zeros_(module.calls_since_redraw)

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # generate makes no cache: the first forward does (a `TffPerformerCache`)


class TffPerformerModel(TffPerformerPreTrainedModel):
    """The stack of kernelised-attention blocks (bidirectional, or causal with ``config.causal``) and a final layer
    norm."""

    def __init__(self, config: TffPerformerConfig, add_pooling_layer: bool = False):
        super().__init__(config)
        if add_pooling_layer:
            raise ValueError("TffPerformerModel has no pooler; the heads pool the first real token themselves.")
        self.embeddings = TffPerformerEmbeddings(config)
        self.layers = nn.ModuleList(TffPerformerLayer(config, i) for i in range(config.num_hidden_layers))
        self.final_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Module):
        self.embeddings.word_embeddings = value

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
        cache: TffPerformerCache | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast | tuple:
        r"""
        Args:
            input_ids: ``(B, T)`` token ids (or pass ``inputs_embeds`` ``(B, T, D)``); with a filled ``cache``, the
                new tokens only.
            attention_mask: ``(B, T)`` (or ``(B, P + T)`` with a cache of ``P`` positions: the new columns are
                read) 1 for real tokens, 0 for padding (left or right).
            token_type_ids, position_ids: ``(B, T)``; positions default to the count of real tokens before each.
            output_attentions: return the ``(B, H, T, T)`` attention matrix each layer implies (quadratic).
            cache: a `TffPerformerCache` of earlier calls (causal models only): the recurrent state of every layer.
            use_cache: return the cache (a new `TffPerformerCache` when none is given); causal models only.

        transformers' encoder signature (heads and `Trainer` pass these by name), hence more than ~6 parameters.
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
        if self.training:
            for layer in self.layers:  # once per call here, not in the layers (checkpointing recomputes those)
                layer.attention.step_redraw_schedule()
        if use_cache and cache is None:
            cache = TffPerformerCache()
        device = (input_ids if input_ids is not None else inputs_embeds).device
        if attention_mask is None:
            key_valid = torch.ones(batch, length, dtype=torch.bool, device=device)
        else:
            key_valid = attention_mask[:, -length:].to(torch.bool)
        if position_ids is None:
            real = key_valid.long()
            position_ids = (real.cumsum(dim=1) - 1).clamp_min(0)  # (B, T)
            if cache is not None and cache.real_tokens is not None:
                position_ids = position_ids + cache.real_tokens[:, None]
        hidden = self.embeddings(input_ids, inputs_embeds, token_type_ids, position_ids)
        all_hidden, all_attentions = (), ()
        for layer in self.layers:
            if output_hidden_states:
                all_hidden += (hidden,)
            hidden, probs = layer(hidden, key_valid=key_valid, output_attentions=output_attentions, cache=cache)
            if output_attentions:
                all_attentions += (probs,)
        hidden = self.final_norm(hidden)
        if output_hidden_states:
            all_hidden += (hidden,)
        if cache is not None:
            cache.advance(key_valid)
        output = BaseModelOutputWithPast(
            last_hidden_state=hidden,
            cache=cache,
            hidden_states=all_hidden if output_hidden_states else None,
            attentions=all_attentions if output_attentions else None,
        )
        return output if return_dict else output.to_tuple()

    def _check_inputs(
        self, *, input_ids, inputs_embeds, attention_mask, token_type_ids, position_ids, cache, use_cache
    ) -> tuple[int, int, bool]:
        """`forward`'s inputs checked once, at the edge: ``(B, T)`` and whether to keep a cache."""
        batch, length = self._check_token_inputs(input_ids, inputs_embeds)
        config = self.config
        self._check_index_inputs(
            "token_type_ids", token_type_ids, batch, length, config.type_vocab_size, "type_vocab_size"
        )
        self._check_index_inputs(
            "position_ids", position_ids, batch, length, config.max_position_embeddings, "max_position_embeddings"
        )
        if not isinstance(cache, TffPerformerCache):
            refuse_key_value_cache("cache", cache, type(self).__name__, "a recurrent state (TffPerformerCache)")
        if cache is not None and not isinstance(cache, TffPerformerCache):
            raise TypeError(f"cache must be a TffPerformerCache, got {type(cache).__name__}.")
        if (cache is not None or use_cache) and not config.causal:
            raise ValueError(
                "cache (past_key_values) / use_cache need a causal model (config.causal=True, e.g. "
                f"{type(self).__name__.replace('Model', 'ForCausalLM')}): bidirectional attention reads later tokens."
            )
        if cache is not None and cache.real_tokens is not None and cache.real_tokens.shape[0] != batch:
            raise ValueError(
                f"cache holds {cache.real_tokens.shape[0]} rows but the input has {batch}; pass the cache returned "
                "for this batch, or None."
            )
        past = cache.get_seq_length() if cache is not None else 0
        if attention_mask is not None:
            check_tensor("attention_mask", attention_mask, dim=2)
            if attention_mask.shape[1] not in (length, past + length):
                raise ValueError(
                    f"attention_mask has {attention_mask.shape[1]} columns; expected {length} (the input) or "
                    f"{past + length} (the {past} cached positions and the input)."
                )
            self._check_mask("attention_mask", attention_mask[:, -length:], batch, length)
        if self.gradient_checkpointing and self.training and (use_cache or cache is not None):
            if cache is not None:
                raise ValueError("cache cannot be used with gradient checkpointing in training mode.")
            logger.warning_once("use_cache=True is incompatible with gradient checkpointing in training; not caching.")
            use_cache = False
        return batch, length, bool(use_cache)


class TffPerformerForCausalLM(FusedLMHeadMixin, TffPerformerPreTrainedModel, ValidatedGenerationMixin):
    """A causal kernelised-attention language model with a linear head tied to the input embeddings. Builds its stack
    with ``causal=True`` whatever the given config says; generates with a constant-size `TffPerformerCache`."""

    _tied_weights_keys = {"lm_head.weight": "performer.embeddings.word_embeddings.weight"}

    def __init__(self, config: TffPerformerConfig):
        if not config.causal:
            config = copy.deepcopy(config)
            config.causal = True
        super().__init__(config)
        self.performer = TffPerformerModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, new_embeddings):
        self.lm_head = new_embeddings

    @answers_fused_lm_head
    @accepts_past_key_values
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        labels=None,
        cache=None,
        use_cache=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        logits_to_keep: int = 0,
        num_items_in_batch=None,
        **kwargs,
    ) -> CausalLMOutputWithPast | tuple:
        r"""labels: ``(B, T)``, usually ``input_ids``; position ``t`` is predicted from positions ``<= t-1`` (the
        shift happens inside), -100 is ignored; with ``num_items_in_batch`` (`Trainer`'s count of ``labels[:, 1:]``
        over the accumulated batch) the loss is the sum over it. ``logits_to_keep``: only the last that many
        positions' logits. ``cache`` / ``use_cache``: the recurrent state, as in `TffPerformerModel`.

        transformers' language-model signature (`generate` and `Trainer` pass these by name), hence more than ~6
        parameters."""
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        outputs = self.performer(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            cache=cache,
            use_cache=use_cache,
        )
        hidden = outputs.last_hidden_state
        logits = self.lm_head(hidden[:, -logits_to_keep:] if logits_to_keep else hidden)  # (B, T, V)
        loss = None
        if labels is not None:
            self._check_lm_labels(labels, *logits.shape[:2])
            loss = causal_lm_loss(logits, labels, num_items_in_batch)
        output = CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            cache=outputs.cache,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
        return output if return_dict else output.to_tuple()

    @accepts_past_key_values
    def prepare_inputs_for_generation(
        self, input_ids, cache=None, attention_mask=None, inputs_embeds=None, use_cache=True, **kwargs
    ) -> dict:
        """With a cache (the default), only the tokens it has not seen; ``attention_mask`` covers the whole
        sequence (left padding is honoured)."""
        past = cache.get_seq_length() if cache is not None and use_cache else 0
        model_inputs = {"attention_mask": attention_mask, "use_cache": use_cache}
        if use_cache:
            model_inputs["cache"] = cache
        model_inputs.update(
            decoding_step_inputs(input_ids, past, attention_mask, inputs_embeds, self.get_input_embeddings())
        )
        if kwargs.get("logits_to_keep") is not None:
            model_inputs["logits_to_keep"] = kwargs["logits_to_keep"]
        return model_inputs


class TffPerformerForMaskedLM(GenericForMaskedLM, TffPerformerPreTrainedModel):
    """BERT's masked-LM head (dense, activation, layer norm, decoder tied to the input embeddings)."""

    base_model_class = TffPerformerModel
    _tied_weights_keys = {"lm_head.decoder.weight": "performer.embeddings.word_embeddings.weight"}


class TffPerformerForSequenceClassification(GenericForSequenceClassification, TffPerformerPreTrainedModel):
    """Classifier (dense + tanh + linear) on the first real token."""

    base_model_class = TffPerformerModel


class TffPerformerForTokenClassification(GenericForTokenClassification, TffPerformerPreTrainedModel):
    """A label per token."""

    base_model_class = TffPerformerModel


# ------------------------------------------------------------------------------------- the same models by other names
class TffLinearTransformerModel(TffPerformerModel):
    """The Linear Transformer's stack (``elu(x) + 1`` features): `TffPerformerModel` for `TffLinearTransformerConfig`."""

    config_class = TffLinearTransformerConfig


class TffLinearTransformerForCausalLM(TffPerformerForCausalLM):
    """The Linear Transformer language model: `TffPerformerForCausalLM` for `TffLinearTransformerConfig`."""

    config_class = TffLinearTransformerConfig


class TffRFAModel(TffPerformerModel):
    """Random Feature Attention's stack (random Fourier features, RFA-Gate): `TffPerformerModel` for `TffRFAConfig`."""

    config_class = TffRFAConfig


class TffRFAForCausalLM(TffPerformerForCausalLM):
    """The RFA language model: `TffPerformerForCausalLM` for `TffRFAConfig`."""

    config_class = TffRFAConfig


__all__ = [
    "TffLinearTransformerForCausalLM",
    "TffLinearTransformerModel",
    "TffPerformerForCausalLM",
    "TffPerformerForMaskedLM",
    "TffPerformerForSequenceClassification",
    "TffPerformerForTokenClassification",
    "TffPerformerModel",
    "TffPerformerPreTrainedModel",
    "TffRFAForCausalLM",
    "TffRFAModel",
    "projection_generator",
]
