"""BigBird: transformers for longer sequences (Zaheer et al. 2020, arXiv:2007.14062), ITC variant.

A BERT encoder whose attention is block sparse: every query block sees a sliding window of blocks, the first and
last (global) blocks, and random blocks; the global blocks see everything (section 2, appendix D). The kernel is
`tf_family.attention.block_sparse` (linear time and memory, blocks gathered and fed to scaled-dot-product attention).

Parity reference: transformers 5 `BigBirdModel` and its heads in eval mode, where transformers points every random
slot at the first block (`eval_random_blocks="first_block"`, set on import); `convert_big_bird.py` maps their
checkpoints and `tests/models/big_bird/test_parity_big_bird.py` compares outputs.

Deviations from transformers' BigBird (each one of its reported problems):
- random blocks come from a `torch.Generator` seeded per layer from `random_seed` (or the call), never from NumPy's
  global RNG; eval can use them (`eval_random_blocks="same"`, the default), drop them, or mimic transformers;
- a short input runs full attention for that call only; transformers switches the model to full attention for good
  (its issue #20031);
- `num_random_blocks=0` works; the window width is configurable (`window_blocks`);
- positions and the pooled / classified token follow `attention_mask` (identical for right padding);
- `output_attentions=True` runs the dense twin and returns ``(B, H, T, T)`` probabilities.

Config field <-> paper symbol: `block_size` = b, `num_random_blocks` = r, `window_blocks` = (w - 1) / 2 in blocks.

ETC (``attention_type="etc"``; Ainslie et al. 2020, arXiv:2004.08483, the global-local attention without CPC
pretraining; reference google-research `etcmodel`, no released PyTorch weights): `num_global_tokens` learned global
embeddings (``n_g``) go before the long input; global-global, global-long and long-global attention are full,
long-long attention stays within `local_radius` tokens; each layer learns relative keys for the relative labels
(`max_relative_position` = ETC's ``relative_pos_max_distance``; the label convention is in
`tf_family.attention.etc`). The long input keeps BigBird's absolute positions (as when ETC is lifted from BERT /
RoBERTa weights). Queries, keys, values and the feed-forward block are shared by both inputs. `last_hidden_state` is
the long input's; `global_last_hidden_state` the global input's; the pooler and the sequence classifier read the
first global token. The kernel is `tf_family.attention.etc.etc_attention` (never ``S x S``; its dense twin serves
``output_attentions`` and exports).

Positions (`position_embedding_type`): ``"absolute"`` (learned, BigBird's checkpoints), ``"rotary"`` (queries and keys
rotated on every attention type; ETC's global tokens are not rotated) or ``"alibi"`` (``-m_h * |i - j|`` on full
attention); rotary and ALiBi models have no position table and are trained from scratch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPooling, QuestionAnsweringModelOutput
from transformers.utils import logging

from ...attention import (
    attend,
    block_sparse_attention,
    build_block_sparse_counts,
    layer_seed,
    min_sparse_blocks,
    random_block_indices,
)
from ...attention.alibi import alibi_bias, alibi_slopes
from ...attention.etc import EtcPattern, etc_attention, etc_attention_reference
from ...attention.flex import BlockMaskCache, size_key
from ...attention.rotary import apply_rotary, rotary_cos_sin
from ...layers import BertFeedForward
from ...modeling.heads import (
    GenericForMaskedLM,
    GenericForMultipleChoice,
    GenericForSequenceClassification,
    GenericForTokenClassification,
    question_answering_output,
)
from ...modeling.pretrained import TffPreTrainedModel
from ...modeling.utils import (
    Dropout,
    build_activation,
    find_first_real_token,
    fused_projections,
    real_tensors_while_exporting,
)
from ...modeling.validation import check_seed, check_tensor
from .configuration_big_bird import TffBigBirdConfig

logger = logging.get_logger(__name__)


@dataclass
class TffBigBirdModelOutput(BaseModelOutputWithPooling):
    """`BaseModelOutputWithPooling` plus, in ETC mode, the global input's final states.

    Args:
        global_last_hidden_state: ``(B, G, D)``, ETC only (``None`` otherwise). `last_hidden_state` and
            `hidden_states` are the long input's; `attentions` (ETC) are ``(B, H, G + T, G + T)``, global rows and
            columns first.
    """

    global_last_hidden_state: torch.FloatTensor | None = None


@dataclass(frozen=True)
class AttentionPositions:
    """What ``"rotary"`` / ``"alibi"`` positions give every layer's attention: rotary tables ``cos``, ``sin``
    ``(B, 1, T, Dh)`` of the long input, or the ALiBi bias ``(B, H, T, T)``."""

    cos: torch.Tensor | None = None
    sin: torch.Tensor | None = None
    alibi: torch.Tensor | None = None


class TffBigBirdEmbeddings(nn.Module):
    """Word (optionally rescaled) + token-type + learned absolute position embeddings (``"absolute"`` positions),
    then dropout and layer norm (in that order, as in BigBird)."""

    def __init__(self, config: TffBigBirdConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = None  # rotary and ALiBi positions act in the attention
        if config.position_embedding_type == "absolute":
            self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)
        self.scale = config.hidden_size**0.5 if config.rescale_embeddings else 1.0
        # ETC's global input: a learned table of its own, separate from the long input
        self.global_embeddings = None
        if config.attention_type == "etc":
            self.global_embeddings = nn.Embedding(config.num_global_tokens, config.hidden_size)

    def global_inputs(self, batch: int) -> torch.Tensor:
        """ETC: the ``(B, G, D)`` global input (its embeddings, then dropout and the layer norm of the long input)."""
        return self.layer_norm(self.dropout(self.global_embeddings.weight)).expand(batch, -1, -1)

    def forward(self, input_ids, inputs_embeds, token_type_ids, position_ids) -> torch.Tensor:
        """``position_ids`` ``(B, T)``: each token's position (`TffBigBirdModel` counts real tokens, so that left
        padding does not shift them); added here for ``position_embedding_type="absolute"`` only."""
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)  # (B, T, D)
        batch, length = inputs_embeds.shape[:2]
        if token_type_ids is None:
            token_type_ids = torch.zeros(batch, length, dtype=torch.long, device=inputs_embeds.device)
        embeddings = inputs_embeds * self.scale + self.token_type_embeddings(token_type_ids)
        if self.position_embeddings is not None:
            # a data-dependent check: skipped while torch.compile / torch.export trace the model
            if (
                not torch.compiler.is_compiling()
                and int(position_ids.max()) >= self.position_embeddings.num_embeddings
            ):
                raise ValueError(
                    f"The input needs position {int(position_ids.max())} but max_position_embeddings="
                    f"{self.position_embeddings.num_embeddings}; shorten the input."
                )
            embeddings = embeddings + self.position_embeddings(position_ids)
        return self.layer_norm(self.dropout(embeddings))


class TffBigBirdAttention(nn.Module):
    """Block-sparse (or, per call, full) self-attention with output projection and post-layer-norm residual."""

    def __init__(self, config: TffBigBirdConfig, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.block_size, self.window_blocks = config.block_size, config.window_blocks
        self.num_random_blocks = config.num_random_blocks
        self.sparse = config.attention_type == "block_sparse"
        self.eval_random_blocks = config.eval_random_blocks
        width = config.hidden_size
        self.query, self.key, self.value = (nn.Linear(width, width, bias=config.use_bias) for _ in range(3))
        self.out_proj = nn.Linear(width, width)
        self.layer_norm = nn.LayerNorm(width, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)
        self.attention_dropout = config.attention_probs_dropout_prob
        # ETC: the pattern and this layer's relative keys, one (H * Dh)-vector per relative label
        self.etc_pattern = self.relative_keys = None
        if config.attention_type == "etc":
            self.etc_pattern = EtcPattern(config.num_global_tokens, config.local_radius, config.max_relative_position)
            self.relative_keys = nn.Embedding(self.etc_pattern.num_labels, width)

    def uses_sparse(self, length: int) -> bool:
        """Decided per call from the input length; the module is never changed."""
        num_blocks = -(-length // self.block_size)
        return self.sparse and num_blocks >= min_sparse_blocks(self.num_random_blocks, self.window_blocks)

    def random_blocks(self, num_blocks: int, seed: int, device) -> torch.Tensor | None:
        """``(H, N, R)`` random key blocks for this call (see `TffBigBirdConfig.eval_random_blocks`)."""
        if self.num_random_blocks == 0 or (not self.training and self.eval_random_blocks == "none"):
            return None
        if not self.training and self.eval_random_blocks == "first_block":
            return torch.zeros(self.num_heads, num_blocks, self.num_random_blocks, dtype=torch.long, device=device)
        return random_block_indices(
            num_blocks,
            self.num_heads,
            self.num_random_blocks,
            self.window_blocks,
            layer_seed(seed, self.layer_idx),
            device,
        )

    def _count_table(self, seed: int) -> torch.Tensor:
        """``(N_max + 1, H, N_max, N_max)`` uint8: for every number of blocks ``N`` an input can have, how many times
        each query block sees each key block (random blocks included; 1 everywhere where ``N`` is too short for the
        sparse path, i.e. full attention). Computed with real tensors even while tracing: it becomes a constant."""
        max_blocks = -(-self.config.max_position_embeddings // self.block_size)
        with real_tensors_while_exporting(), torch.no_grad():
            table = torch.ones(max_blocks + 1, self.num_heads, max_blocks, max_blocks, dtype=torch.uint8)
            for num_blocks in range(max_blocks + 1):
                if self.uses_sparse(num_blocks * self.block_size):
                    random_blocks = self.random_blocks(num_blocks, seed, "cpu")
                    counts = build_block_sparse_counts(num_blocks, random_blocks, self.window_blocks, self.num_heads)
                    table[num_blocks, :, :num_blocks, :num_blocks] = counts.to(torch.uint8)
        return table

    def _exported_attention(self, query, key, value, key_valid, seed: int, alibi=None) -> torch.Tensor:
        """The attention of an exported graph (ONNX, a dynamic length): the dense twin of both paths, each key
        weighted by how many times the query's block sees the key's block (the block-sparse path's arithmetic, as
        for attention maps), the counts picked from `_count_table` by the input's number of blocks. The same
        values as eager at every length, at the dense path's quadratic cost."""
        length = query.shape[2]
        table = self._count_table(seed).to(query.device)
        block = torch.arange(length, device=query.device) // self.block_size  # (T,)
        # the table's entry for N = last block + 1, picked by a tensor index (a graph input's length, not a number)
        counts = table.index_select(0, block[-1:] + 1)[0]  # (H, N_max, N_max)
        counts = counts[:, block[:, None], block[None, :]]  # (H, T, T)
        bias = counts.clamp(min=1).to(torch.promote_types(query.dtype, torch.float32)).log()
        allowed = (counts > 0)[None] & key_valid[:, None, None, :]  # (B, H, T, T)
        bias = bias[None] if alibi is None else bias[None] + alibi  # ALiBi: original_full only (all counts 1)
        return attend(query, key, value, allowed, bias=bias, dropout_p=0.0, implementation="eager")[0]

    def _etc_attention(self, hidden, long_valid, dropout_p: float, output_attentions: bool, positions=None):
        """ETC's global-local attention of ``(B, G + T, D)`` states: ``(B, G + T, D)`` and, for
        ``output_attentions`` (or an export), the dense twin's ``(B, H, G + T, G + T)`` probabilities. Rotary
        positions rotate the long rows only (a global token's rotation is the identity)."""
        batch, length, _ = hidden.shape
        query, key, value = (
            projected.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)
            for projected in fused_projections(hidden, self.query, self.key, self.value)
        )  # (B, H, G + T, Dh)
        if positions is not None and positions.cos is not None:
            num_global = self.etc_pattern.num_global
            cos, sin = positions.cos, positions.sin  # (B, 1, T, Dh)
            cos = torch.cat([cos.new_ones(batch, 1, num_global, self.head_dim), cos], dim=2)  # (B, 1, G + T, Dh)
            sin = torch.cat([sin.new_zeros(batch, 1, num_global, self.head_dim), sin], dim=2)
            query, key = apply_rotary(query, cos, sin), apply_rotary(key, cos, sin)
        relative_keys = self.relative_keys.weight.view(-1, self.num_heads, self.head_dim)  # (V, H, Dh)
        probs = None
        if output_attentions or torch.compiler.is_exporting():
            attended, probs = etc_attention_reference(query, key, value, relative_keys, self.etc_pattern, long_valid)
        else:
            attended = etc_attention(
                query,
                key,
                value,
                relative_keys,
                self.etc_pattern,
                long_valid,
                dropout_p=dropout_p,
                implementation=self.config._attn_implementation,
            )
        return attended.transpose(1, 2).reshape(batch, length, -1), probs

    def _plan(self, num_blocks: int, seed: int, device, block_masks: BlockMaskCache | None):
        """This call's random blocks and their key in ``block_masks`` (drawn once per seed, length and mode, then
        reused from the model's cache)."""
        mode = "train" if self.training else self.eval_random_blocks
        plan_key = ("big_bird_plan", self.layer_idx, *size_key(num_blocks), seed, mode, torch.device(device))
        if block_masks is None:
            return self.random_blocks(num_blocks, seed, device), plan_key
        return block_masks.get(plan_key, lambda: self.random_blocks(num_blocks, seed, device)), plan_key

    def forward(
        self,
        hidden: torch.Tensor,
        key_valid: torch.Tensor | None,
        seed: int,
        output_attentions: bool = False,
        block_masks: BlockMaskCache | None = None,
        positions: AttentionPositions | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``key_valid``: ``(B, T)`` bool, True at real tokens, or ``None`` for a call without an ``attention_mask``
        (nothing padded). ``block_masks``: the model's cache of random plans and FlexAttention block masks
        (``None``: drawn and built for this call). ETC: ``hidden`` is ``(B, G + T, D)``, the global input first, and
        ``key_valid`` covers the long input. ``positions``: rotary tables or the ALiBi bias (``None``: absolute
        positions, already in ``hidden``)."""
        batch, length, _ = hidden.shape
        dropout_p = self.attention_dropout if self.training else 0.0
        if self.etc_pattern is not None:
            attended, probs = self._etc_attention(hidden, key_valid, dropout_p, output_attentions, positions)
            return self.layer_norm(hidden + self.dropout(self.out_proj(attended))), probs
        padding = key_valid  # None: no attention_mask (the block-sparse path's interior blocks then carry no mask)
        if key_valid is None:
            key_valid = torch.ones(batch, length, dtype=torch.bool, device=hidden.device)
        # attention maps come from the dense twin, whatever the configured implementation
        implementation = "eager" if output_attentions else self.config._attn_implementation
        query, key, value = (
            projected.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)
            for projected in fused_projections(hidden, self.query, self.key, self.value)
        )  # (B, H, T, Dh)
        alibi = None if positions is None else positions.alibi  # (B, H, T, T), original_full only
        if positions is not None and positions.cos is not None:
            query, key = (
                apply_rotary(query, positions.cos, positions.sin),
                apply_rotary(key, positions.cos, positions.sin),
            )
        probs = None
        if torch.compiler.is_exporting() and not output_attentions:
            attended = self._exported_attention(query, key, value, key_valid, seed, alibi)
        elif self.uses_sparse(length):
            num_blocks = -(-length // self.block_size)
            random_blocks, plan_key = self._plan(num_blocks, seed, hidden.device, block_masks)
            if output_attentions:
                counts = build_block_sparse_counts(num_blocks, random_blocks, self.window_blocks, self.num_heads)
                counts = counts.repeat_interleave(self.block_size, 1).repeat_interleave(self.block_size, 2)
                counts = counts[:, :length, :length]  # (H, T, T)
                bias = counts.clamp(min=1).to(torch.promote_types(query.dtype, torch.float32)).log()
                allowed = (counts > 0)[None] & key_valid[:, None, None, :]
                attended, probs = attend(
                    query, key, value, allowed, bias=bias[None], dropout_p=0.0, implementation="eager"
                )
            else:
                # no dropout on block-sparse probabilities, as in the reference code and transformers
                attended = block_sparse_attention(
                    query,
                    key,
                    value,
                    block_size=self.block_size,
                    random_blocks=random_blocks,
                    window_blocks=self.window_blocks,
                    key_padding_mask=padding,
                    implementation=implementation,
                    block_masks=block_masks,
                    plan_key=plan_key,
                )
        else:
            allowed = None if padding is None else key_valid[:, None, None, :]  # None: flash-eligible
            attended, probs = attend(
                query, key, value, allowed, bias=alibi, dropout_p=dropout_p, implementation=implementation
            )
        attended = attended.transpose(1, 2).reshape(batch, length, -1)  # (B, T, D)
        return self.layer_norm(hidden + self.dropout(self.out_proj(attended))), probs


class TffBigBirdLayer(GradientCheckpointingLayer):
    # Copied from tf_family.models.longformer.modeling_longformer.TffLongformerLayer.__init__ with Longformer->BigBird
    def __init__(self, config: TffBigBirdConfig, layer_idx: int):
        super().__init__()
        self.attention = TffBigBirdAttention(config, layer_idx)
        self.feed_forward = BertFeedForward(
            config.hidden_size,
            config.intermediate_size,
            config.hidden_act,
            config.layer_norm_eps,
            config.hidden_dropout_prob,
        )

    def forward(self, hidden, key_valid, seed, output_attentions=False, block_masks=None, positions=None):
        hidden, probs = self.attention(
            hidden,
            key_valid=key_valid,
            seed=seed,
            output_attentions=output_attentions,
            block_masks=block_masks,
            positions=positions,
        )
        return self.feed_forward(hidden), probs


class TffBigBirdPreTrainedModel(TffPreTrainedModel):
    config_class = TffBigBirdConfig
    config: TffBigBirdConfig
    base_model_prefix = "bert"
    carried_state = None  # nothing carried between calls
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["TffBigBirdLayer"]
    _supports_sdpa = True  # eager (the dense twin per slab of blocks) and sdpa agree: tests/attention/test_backend.py
    _supports_flex_attn = True  # the sparse pattern as a FlexAttention block mask: tests/attention/test_flex.py
    # the attention reads config._attn_implementation at every call, so switching it later is safe
    _can_set_attn_implementation_cached_value = True

    # Copied from tf_family.models.longformer.modeling_longformer.TffLongformerPreTrainedModel._init_weights
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


class TffBigBirdModel(TffBigBirdPreTrainedModel):
    """The BigBird encoder, with an optional pooler (dense + tanh) on the first real token."""

    # Copied from tf_family.models.longformer.modeling_longformer.TffLongformerModel.__init__ with Longformer->BigBird
    def __init__(self, config: TffBigBirdConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = TffBigBirdEmbeddings(config)
        self.layers = nn.ModuleList(TffBigBirdLayer(config, i) for i in range(config.num_hidden_layers))
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size) if add_pooling_layer else None
        self.gradient_checkpointing = False
        # the attention's block masks (and BigBird's random plans), built once per (shape, pattern) and reused
        self.block_masks = BlockMaskCache()
        self.post_init()

    # Copied from tf_family.models.longformer.modeling_longformer.TffLongformerModel.get_input_embeddings
    def get_input_embeddings(self) -> nn.Module:
        return self.embeddings.word_embeddings

    # Copied from tf_family.models.longformer.modeling_longformer.TffLongformerModel.set_input_embeddings
    def set_input_embeddings(self, value: nn.Module):
        self.embeddings.word_embeddings = value

    def _attention_positions(self, position_ids: torch.Tensor, dtype: torch.dtype) -> AttentionPositions | None:
        """This call's rotary tables or ALiBi bias (``None`` for absolute positions), built once for every layer."""
        config = self.config
        if config.position_embedding_type == "rotary":
            head_dim = config.hidden_size // config.num_attention_heads
            return AttentionPositions(*rotary_cos_sin(position_ids, head_dim, config.rope_base, dtype))
        if config.position_embedding_type == "alibi":
            slopes = alibi_slopes(config.num_attention_heads).to(position_ids.device)
            # -m_h * |i - j|: the paper's causal bias made symmetric for an encoder
            bias = -alibi_bias(slopes, position_ids, position_ids).abs()  # (B, H, T, T)
            return AttentionPositions(alibi=bias.to(torch.promote_types(dtype, torch.float32)))
        return None

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        random_seed: int | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> TffBigBirdModelOutput | tuple:
        r"""
        Args:
            input_ids: ``(B, T)`` token ids (or pass ``inputs_embeds`` ``(B, T, D)``).
            attention_mask: ``(B, T)`` 1 for real tokens, 0 for padding (ETC: of the long input; the global tokens
                are always real).
            random_seed: seed of this call's random blocks (defaults to ``config.random_seed``); e.g. pass the
                training step to draw a new pattern every step.
            output_attentions: return ``(B, H, T, T)`` probabilities per layer (runs the dense twin).

        transformers' encoder signature plus the random-block seed (heads pass them by name), hence more than ~6
        parameters.
        """
        output_attentions = output_attentions if output_attentions is not None else self.config.output_attentions
        output_hidden_states = (
            output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states
        )
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        config = self.config
        batch, length = self._check_token_inputs(input_ids, inputs_embeds)
        source = input_ids if input_ids is not None else inputs_embeds
        self._check_mask("attention_mask", attention_mask, batch, length)
        self._check_index_inputs(
            "token_type_ids", token_type_ids, batch, length, config.type_vocab_size, "type_vocab_size"
        )
        self._check_index_inputs(
            "position_ids", position_ids, batch, length, config.max_position_embeddings, "max_position_embeddings"
        )
        if random_seed is not None:
            check_seed("random_seed", random_seed)
        key_valid = None if attention_mask is None else attention_mask.to(torch.bool)  # None: no padding
        seed = self.config.random_seed if random_seed is None else random_seed

        if position_ids is None:
            if attention_mask is None:
                position_ids = torch.arange(length, device=source.device).expand(batch, length)
            else:  # count real tokens, so that left padding does not shift positions
                position_ids = (attention_mask.to(torch.long).cumsum(dim=1) - 1).clamp(min=0)
        hidden = self.embeddings(input_ids, inputs_embeds, token_type_ids, position_ids)
        positions = self._attention_positions(position_ids, hidden.dtype)
        num_global = 0  # ETC: the global input goes first, (B, G + T, D)
        if self.embeddings.global_embeddings is not None:
            num_global = config.num_global_tokens
            hidden = torch.cat([self.embeddings.global_inputs(batch).to(hidden.dtype), hidden], dim=1)
        # a compiled graph builds its plans and masks once per forward, in a cache of its own (nothing outside mutated)
        block_masks = BlockMaskCache() if torch.compiler.is_compiling() else self.block_masks
        all_hidden, all_attentions = (), ()
        for layer in self.layers:
            if output_hidden_states:
                all_hidden += (hidden[:, num_global:],)
            hidden, probs = layer(
                hidden,
                key_valid=key_valid,
                seed=seed,
                output_attentions=output_attentions,
                block_masks=block_masks,
                positions=positions,
            )
            if output_attentions:
                all_attentions += (probs,)
        global_hidden, hidden = hidden[:, :num_global], hidden[:, num_global:]  # (B, G, D), (B, T, D)
        if output_hidden_states:
            all_hidden += (hidden,)
        pooled = None
        if self.pooler is not None and num_global:  # ETC: the first global token
            pooled = torch.tanh(self.pooler(global_hidden[:, 0]))  # (B, D)
        elif self.pooler is not None:
            first = find_first_real_token(attention_mask, batch, source.device)
            pooled = torch.tanh(self.pooler(hidden[torch.arange(batch, device=source.device), first]))  # (B, D)
        output = TffBigBirdModelOutput(
            last_hidden_state=hidden,
            pooler_output=pooled,
            hidden_states=all_hidden if output_hidden_states else None,
            attentions=all_attentions if output_attentions else None,
            global_last_hidden_state=global_hidden if num_global else None,
        )
        return output if return_dict else output.to_tuple()


class TffBigBirdForMaskedLM(GenericForMaskedLM, TffBigBirdPreTrainedModel):
    """BERT's masked-LM head (dense, activation, layer norm, decoder tied to the input embeddings). Keyword
    arguments the head does not use (``random_seed``, ``output_attentions`` …) go to `TffBigBirdModel`."""

    base_model_class = TffBigBirdModel
    _tied_weights_keys = {"lm_head.decoder.weight": "bert.embeddings.word_embeddings.weight"}


class TffBigBirdForSequenceClassification(GenericForSequenceClassification, TffBigBirdPreTrainedModel):
    """Classifier (dense + activation + linear) on the first real token (ETC: on the first global token)."""

    base_model_class = TffBigBirdModel
    classifier_activation = None  # the config's hidden_act, as transformers' BigBird

    def _logits(self, outputs: TffBigBirdModelOutput, attention_mask) -> torch.Tensor:
        if outputs.global_last_hidden_state is not None:  # ETC: the global input summarises the long one
            return self.classifier(outputs.global_last_hidden_state[:, 0])  # (B, num_labels)
        return super()._logits(outputs, attention_mask)


class TffBigBirdForTokenClassification(GenericForTokenClassification, TffBigBirdPreTrainedModel):
    """A label per token."""

    base_model_class = TffBigBirdModel


class TffBigBirdQuestionAnsweringHead(nn.Module):
    """Feed-forward block with residual layer norm, then start / end logits (transformers' BigBird QA head)."""

    def __init__(self, config: TffBigBirdConfig):
        super().__init__()
        self.dropout = Dropout(config.hidden_dropout_prob)
        self.fc_in = nn.Linear(config.hidden_size, config.intermediate_size)
        self.activation = build_activation(config.hidden_act)
        self.fc_out = nn.Linear(config.intermediate_size, config.hidden_size)
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        inner = self.fc_out(self.activation(self.fc_in(self.dropout(hidden))))
        return self.qa_outputs(self.layer_norm(self.dropout(inner) + hidden))  # (B, T, 2)


class TffBigBirdForQuestionAnswering(TffBigBirdPreTrainedModel):
    """Extractive QA. As in transformers' BigBird, the question (up to and including the first `sep_token_id`, or
    `question_lengths` tokens) cannot be an answer: its logits are lowered by 1e6, except the first real token's;
    without `token_type_ids`, the question is type 0 and the rest type 1."""

    def __init__(self, config: TffBigBirdConfig):
        super().__init__(config)
        self.bert = TffBigBirdModel(config, add_pooling_layer=False)
        self.qa_head = TffBigBirdQuestionAnsweringHead(config)
        self.post_init()

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        question_lengths=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        start_positions=None,
        end_positions=None,
        random_seed=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        num_items_in_batch=None,
        **kwargs,
    ) -> QuestionAnsweringModelOutput | tuple:
        r"""
        Args:
            question_lengths: ``(B,)`` or ``(B, 1)`` tokens of each row's question, counted from its first real
                token; defaults to the tokens up to and including the first `sep_token_id`.
            start_positions, end_positions: ``(B,)`` token indices of the answer span.

        transformers' BigBird QA signature (`Trainer` and pipelines pass these by name), hence more than ~6
        parameters.
        """
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        question_mask, question_types = self._question_mask(input_ids, attention_mask, inputs_embeds, question_lengths)
        if token_type_ids is None:
            token_type_ids = question_types
        outputs = self.bert(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            random_seed=random_seed,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        logits = self.qa_head(outputs.last_hidden_state)  # (B, T, 2)
        if question_mask is not None:
            logits = logits - question_mask[..., None] * 1e6
        output = question_answering_output(
            logits, start_positions, end_positions, outputs=outputs, num_items_in_batch=num_items_in_batch
        )
        return output if return_dict else output.to_tuple()

    def _question_mask(self, input_ids, attention_mask, inputs_embeds, question_lengths):
        """The positions that cannot be an answer ``(B, T)`` (the question but its first token; ``None`` when no
        question is known) and the default token types (0 in the question, 1 after; ``None`` likewise)."""
        # the question rule reads the inputs: check them first (the base model checks them again, cheaply)
        batch, length = self._check_token_inputs(input_ids, inputs_embeds)
        self._check_mask("attention_mask", attention_mask, batch, length)
        if question_lengths is not None:
            check_tensor("question_lengths", question_lengths, integer=True)
            if question_lengths.numel() != batch:
                raise ValueError(
                    f"question_lengths must have one length per row, shape ({batch},), got {tuple(question_lengths.shape)}."
                )
        source = input_ids if input_ids is not None else inputs_embeds
        first = find_first_real_token(attention_mask, batch, source.device)
        position = torch.arange(length, device=source.device)[None, :] - first[:, None]  # from the first real token
        if question_lengths is None and input_ids is not None and self.config.sep_token_id is not None:
            is_separator = (input_ids == self.config.sep_token_id) & (position >= 0)
            separator = is_separator.int().argmax(dim=-1)  # (B,)
            question_lengths = torch.where(is_separator.any(dim=-1), separator - first + 1, 1)
        if question_lengths is None:
            return None, None
        question = (position >= 0) & (position < question_lengths.view(batch, 1))  # (B, T)
        return question & (position != 0), (~question).long()


class TffBigBirdForMultipleChoice(GenericForMultipleChoice, TffBigBirdPreTrainedModel):
    """One score per choice from the pooled first token."""

    base_model_class = TffBigBirdModel
    dropout_field = "hidden_dropout_prob"  # as transformers' BigBird (not classifier_dropout)


__all__ = [
    "TffBigBirdForMaskedLM",
    "TffBigBirdForMultipleChoice",
    "TffBigBirdForQuestionAnswering",
    "TffBigBirdForSequenceClassification",
    "TffBigBirdForTokenClassification",
    "TffBigBirdModel",
    "TffBigBirdModelOutput",
    "TffBigBirdPreTrainedModel",
]
