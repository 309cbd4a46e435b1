"""Compressive Transformer for long-range sequence modelling (Rae et al. 2019, arXiv:1911.05507).

Transformer-XL (segment-level recurrence, relative positions) with a second, compressed memory per layer: states
that leave the FIFO memory of ``n_m`` = `mem_len` states are compressed by the rate ``c`` = `compression_rate` with
a compression function ``f_c`` (`compression`: max / mean pooling, 1D convolution, dilated convolution, most-used)
and kept in a FIFO compressed memory of ``n_cm`` = `cmem_len` slots. Every layer attends over
``[compressed memory, memory, segment]`` with Transformer-XL relative positions across all three (a compressed slot
counts as one position). The compression network is trained only by the auxiliary attention-reconstruction loss
(section 3.2: content attention of the segment over the old memories vs over their compression, with the
segment, the memories and the attention weights detached), optionally with the auto-encoding loss; both are
reported separately and added to `loss` with the weights of the config.

Reference for parity: none exists (no released code or weights). What the tests prove instead: with `cmem_len=0`
the model reproduces `TffTransfoXLLMHeadModel` on the same weights over several segments; the compression functions
match hand-computed cases and slow twins (`tf_family.memory.compression`); the memories fill and roll over as
algorithm 1 says (`tf_family.memory.compressive`).

Choices where the paper is silent (documented, tested):
- states leave the memory in whole groups of ``c`` (the memory holds up to ``n_m + c - 1`` states between
  segments), so compression groups align with the start of the stream;
- masked (reset or padded) states never enter a compressed slot; a slot is real when any source is real;
- "most-used" ranks states by their average usage: the attention (mean over heads) they received over their whole
  stay in the memory divided by the number of queries that could attend to them; the statistics travel in
  `CompressiveMemory.usage`, and the layers compute attention probabilities (the eager path) to gather them;
- "dilated convolution" is a stack of kernel-2 convolutions with dilations 1, 2, 4, ... inside each group of ``c``;
- the auxiliary losses are mean squared errors, summed over layers; the auto-encoding decoder is a transposed
  convolution with kernel = stride = ``c``;
- the adaptive input / softmax, the attention, the layer and the stack's shared steps are the Transformer-XL
  family's (`tf_family.layers`, `tf_family.layers.xl_scaffold`); the attention receives
  ``[compressed memory, memory]`` as its ``memory``.

Config field <-> paper symbol: `mem_len` = n_m, `cmem_len` = n_cm, `compression_rate` = c, `compression` = f_c,
`n_layer` = l, `attention_reconstruction_loss_weight` weights L^attn, `autoencoding_loss_weight` weights L^ae.
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from transformers.utils import logging

from ...layers import RelativeDecoderLayer
from ...layers.adaptive import adaptive_embeddings_view, resize_adaptive_token_embeddings
from ...layers.xl_scaffold import (
    adaptive_tied_weights_keys,
    build_adaptive_embedding,
    build_adaptive_softmax,
    build_segment_masks,
    check_memory_batch,
    init_xl_weights,
    output_flags,
    relative_attention_inputs,
)
from ...memory import (
    CompressiveMemory,
    SegmentMemory,
    attention_reconstruction_loss,
    autoencoding_loss,
    compress_memory,
    conv_transpose_decompress,
    dilated_conv_layers,
)
from ...modeling.fused_lm_head import FusedLMHeadMixin, answers_fused_lm_head
from ...modeling.heads import memory_generation_inputs
from ...modeling.losses import IGNORE_INDEX, NumItems, batch_share
from ...modeling.outputs import CompressiveCausalLMOutput, CompressiveModelOutput
from ...modeling.pretrained import TffPreTrainedModel
from ...modeling.state_names import MEMORY_NAME, memory_from_aliases
from ...modeling.validation import (
    ValidatedGenerationMixin,
    check_memory_states,
    refuse_key_value_cache,
)
from .configuration_compressive import TffCompressiveConfig

logger = logging.get_logger(__name__)


class TffCompressiveCompression(nn.Module):
    """The learned part of one layer's compression function ``f_c`` (1D or dilated convolution; pooling and
    most-used have no weights) and, with the auto-encoding loss, its decoder ``g``."""

    def __init__(self, config: TffCompressiveConfig):
        super().__init__()
        self.kind, self.rate = config.compression, config.compression_rate
        width = config.d_model
        if self.kind == "conv":
            self.conv = nn.Conv1d(width, width, kernel_size=self.rate, stride=self.rate)
        elif self.kind == "dilated_conv":
            self.dilated = nn.ModuleList(
                nn.Conv1d(width, width, kernel_size=2, dilation=2**layer)
                for layer in range(dilated_conv_layers(self.rate))
            )
        if config.autoencoding_loss_weight > 0:
            self.decoder = nn.ConvTranspose1d(width, width, kernel_size=self.rate, stride=self.rate)

    def compression_function(self) -> functools.partial:
        """``f_c`` with this layer's parameters bound, as `CompressiveMemory.update` takes it: called as
        ``f(states, mask, usage=usage)``, ``(B, N, D)`` states leaving the memory -> ``(B, N / c, D)`` compressed
        slots and their mask."""
        weights, biases = (), ()
        if self.kind == "conv":
            weights, biases = (self.conv.weight,), (self.conv.bias,)
        elif self.kind == "dilated_conv":
            weights = tuple(conv.weight for conv in self.dilated)
            biases = tuple(conv.bias for conv in self.dilated)
        return functools.partial(compress_memory, self.kind, rate=self.rate, weights=weights, biases=biases)

    def decode(self, compressed: torch.Tensor) -> torch.Tensor:
        """``(B, G, D)`` -> ``(B, G * c, D)``: the decoder ``g`` of the auto-encoding loss."""
        return conv_transpose_decompress(compressed, self.rate, self.decoder.weight, self.decoder.bias)


class TffCompressivePreTrainedModel(TffPreTrainedModel):
    """Flags and weights initialisation (`tf_family.layers.xl_scaffold.init_xl_weights`, the compression kernels
    drawn as linear layers), and the resizing of the adaptive embeddings."""

    config_class = TffCompressiveConfig
    config: TffCompressiveConfig
    base_model_prefix = "transformer"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["RelativeDecoderLayer"]
    _supports_sdpa = True
    # the attention reads config._attn_implementation at every call, so switching it later is safe
    _can_set_attn_implementation_cached_value = True
    carried_state = "compressive_memory"  # a CompressiveMemory, passed as `mems` and returned

    @torch.no_grad()
    def _init_weights(self, module: nn.Module):
        normal_modules = (nn.Linear, nn.Conv1d, nn.ConvTranspose1d)
        init_xl_weights(module, self.config.init_std, self.config.proj_init_std, normal_modules)

    # Copied from tf_family.models.transfo_xl.modeling_transfo_xl.TffTransfoXLPreTrainedModel._supports_default_dynamic_cache with TransfoXL->Compressive
    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        # The recurrence state is a memory object returned as `mems`, not a transformers Cache.
        return False

    # Copied from tf_family.models.transfo_xl.modeling_transfo_xl.TffTransfoXLPreTrainedModel.resize_token_embeddings with TransfoXL->Compressive
    def resize_token_embeddings(
        self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None, mean_resizing: bool = True
    ) -> nn.Module:
        """Resize the vocabulary's last cluster (`resize_adaptive_token_embeddings`; transformers' ``mean_resizing``
        fits one embedding matrix and does not apply to clustered embeddings)."""
        return resize_adaptive_token_embeddings(self, new_num_tokens, pad_to_multiple_of)

    # Copied from tf_family.models.transfo_xl.modeling_transfo_xl.TffTransfoXLPreTrainedModel.embeddings with TransfoXL->Compressive
    @property
    def embeddings(self) -> nn.Module:
        """The adaptive input embedding as ``embeddings.word_embeddings``, where PEFT's prompt learning looks
        (`adaptive_embeddings_view`)."""
        return adaptive_embeddings_view(self)


def _as_memory(mems, num_layers: int, batch_size: int, width: int) -> CompressiveMemory | None:
    if mems is None:
        return None
    refuse_key_value_cache("mems", mems, "the Compressive Transformer", "a memory of hidden states")
    if isinstance(mems, SegmentMemory):
        mems = CompressiveMemory(mems, SegmentMemory(tuple(s[:, :0] for s in mems.states), mems.mask[:, :0]))
    elif isinstance(mems, (list, tuple)) and mems and all(isinstance(m, torch.Tensor) for m in mems):
        mems = CompressiveMemory.from_states(mems)
    elif not isinstance(mems, CompressiveMemory):
        raise TypeError(
            f"mems must be a CompressiveMemory (or a SegmentMemory / sequence of (B, M, D) tensors for a memory "
            f"without compressed slots), got {type(mems)}."
        )
    check_memory_batch(mems, num_layers, batch_size)
    check_memory_states("mems", mems.memory.states, width)
    check_memory_states("mems (compressed)", mems.compressed.states, width)
    return mems


def _split_heads(states: torch.Tensor, num_heads: int) -> torch.Tensor:
    batch, length, _ = states.shape
    return states.view(batch, length, num_heads, -1).transpose(1, 2)  # (B, H, N, Dh)


def _usage(probs: torch.Tensor, allowed: torch.Tensor, compressed_length: int) -> torch.Tensor:
    """Per key of ``[memory, segment]``: the attention it received in this layer (mean over heads, summed over
    queries) and the number of queries allowed to see it, ``(B, M + T, 2)`` (the memory adds what its slots had
    gathered before), from the probabilities ``(B, H, T, S)`` and the mask ``(B or 1, 1, T, S)``."""
    received = probs.detach().float().mean(1)[..., compressed_length:].sum(1)  # (B, M + T)
    seen_by = allowed[:, 0, :, compressed_length:].sum(1).float().expand(probs.shape[0], -1)  # (B, M + T)
    return torch.stack([received, seen_by], dim=-1)  # (B, M + T, 2)


class TffCompressiveModel(TffCompressivePreTrainedModel):
    """The Compressive Transformer decoder stack: last hidden state, both updated memories, auxiliary losses."""

    def __init__(self, config: TffCompressiveConfig):
        super().__init__(config)
        layers = [RelativeDecoderLayer.from_config(config) for _ in range(config.n_layer)]  # drawn first
        self.word_embeddings = build_adaptive_embedding(config)
        self.dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(layers)
        if not config.untie_r:  # u, v shared by all layers
            self.content_bias = nn.Parameter(torch.zeros(config.n_head, config.d_head))
            self.position_bias = nn.Parameter(torch.zeros(config.n_head, config.d_head))
        self.gradient_checkpointing = False
        if config.cmem_len > 0:
            self.compression = nn.ModuleList(TffCompressiveCompression(config) for _ in range(config.n_layer))
        self.post_init()

    # Copied from tf_family.models.transfo_xl.modeling_transfo_xl.TffTransfoXLModel.get_input_embeddings
    def get_input_embeddings(self) -> nn.Module:
        return self.word_embeddings

    # Copied from tf_family.models.transfo_xl.modeling_transfo_xl.TffTransfoXLModel.set_input_embeddings
    def set_input_embeddings(self, new_embeddings: nn.Module):
        self.word_embeddings = new_embeddings

    def _project(self, layer: int, *states: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Query, key and value ``(B, H, N, Dh)`` of each of ``states`` with layer ``layer``'s attention weights,
        detached from them (the auxiliary losses train the compression network only). One call of the layer's
        `RelativeDecoderLayer.project_detached`, a forward method FSDP gathers the layer's weights for."""
        lengths = [part.shape[1] for part in states]
        projected = self.layers[layer].project_detached(torch.cat(states, dim=1))  # 3 x (B, sum N, H*Dh)
        parts = [x.split(lengths, dim=1) for x in projected]
        return [tuple(_split_heads(x[i], self.config.n_head) for x in parts) for i in range(len(states))]

    def _auxiliary_losses(self, segment_inputs, evicted, evicted_mask, compressed, compressed_mask) -> dict:
        """The attention-reconstruction and auto-encoding losses (each summed over layers) and their weighted sum,
        as `CompressiveModelOutput` names them; zero when nothing left the memory in this segment."""
        config = self.config
        reconstruction = autoencoding = segment_inputs[0].new_zeros((), dtype=torch.float32)
        layers = zip(segment_inputs, evicted, compressed, strict=True) if compressed else ()  # () if none left
        for layer, (segment, old, new) in enumerate(layers):
            (query, _, _), (_, old_key, old_value), (_, new_key, new_value) = self._project(
                layer, segment.detach(), old.to(segment.dtype), new.to(segment.dtype)
            )
            reconstruction = reconstruction + attention_reconstruction_loss(
                query, (old_key, old_value, evicted_mask), (new_key, new_value, compressed_mask)
            )
            if config.autoencoding_loss_weight > 0:
                decoded = self.compression[layer].decode(new)  # (B, N, D)
                autoencoding = autoencoding + autoencoding_loss(old, decoded, evicted_mask)
        aux_loss = (
            config.attention_reconstruction_loss_weight * reconstruction
            + config.autoencoding_loss_weight * autoencoding
        )
        return {
            "aux_loss": aux_loss,
            "attention_reconstruction_loss": reconstruction,
            "autoencoding_loss": autoencoding if config.autoencoding_loss_weight != 0 else None,
        }

    def _update_memories(self, memory, layer_inputs, segment_mask, usage, compute_losses: bool) -> tuple:
        """Both memories after this segment (`CompressiveMemory.update`), and the states that left the memory with
        their compression (the inputs of the auxiliary losses); tracked by autograd only with ``compute_losses``."""
        config = self.config
        compress = None
        if config.cmem_len > 0:
            compress = [compression.compression_function() for compression in self.compression]
        previous = memory if memory is not None else CompressiveMemory.empty_like(layer_inputs)
        with torch.set_grad_enabled(torch.is_grad_enabled() and compute_losses):
            new_memory, *evicted = previous.update(
                layer_inputs,
                mem_len=config.mem_len,
                cmem_len=config.cmem_len,
                rate=config.compression_rate,
                compress=compress,
                new_mask=segment_mask,
                usage=usage,
            )
        return new_memory, evicted

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        mems: CompressiveMemory | SegmentMemory | tuple[torch.Tensor, ...] | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        reset_mems: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        output_compression_loss: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> CompressiveModelOutput | tuple:
        r"""The keyword parameters follow transformers' ``forward`` convention (hence more than STYLE's six).

        Args:
            input_ids: ``(B, T)`` token ids of the segment.
            mems: the `CompressiveMemory` returned for the previous segment of the same streams, or ``None`` at the
                start (a `SegmentMemory` or per-layer ``(B, M, D)`` tensors give a memory without compressed slots).
            attention_mask: ``(B, T)`` 0/1 padding mask of the segment, or ``(B, >= M + T)`` covering
                ``[memory, segment]`` (what `generate` passes), or a ``(B, 1, T, C + M + T)`` bool mask of allowed
                query-key pairs over ``[compressed memory, memory, segment]``, combined with the causal mask.
            reset_mems: ``(B,)`` bool; rows where it is True forget both memories (a new document starts).
            use_cache: update and return the memories (defaults to ``config.use_cache``).
            output_compression_loss: compute the auxiliary losses when states are compressed (defaults to
                ``self.training``). They exist only where the memories are updated (``use_cache``).
        """
        config = self.config
        flags = output_flags(config, output_attentions, output_hidden_states, use_cache, return_dict)
        compute_losses = output_compression_loss if output_compression_loss is not None else self.training
        batch, length = self._check_token_inputs(input_ids, inputs_embeds, embedding_width=config.d_model)
        self._check_mask("attention_mask", attention_mask, batch, length, at_least=True, dims=(2, 4))
        self._check_reset_mems(reset_mems, batch)
        embeddings = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds  # (B, T, D)
        memory = _as_memory(mems, config.n_layer, batch, config.d_model)
        if reset_mems is not None and memory is not None:
            memory = memory.reset(reset_mems)
        masks = build_segment_masks(
            embeddings,
            attention_mask,
            None if memory is None else memory.memory.mask,
            None if memory is None else memory.compressed.mask,
            max_span=config.mem_len if config.same_length else None,
        )
        # most-used compression ranks states by the attention they receive, so it needs the probabilities
        need_usage = flags.use_cache and config.cmem_len > 0 and config.compression == "most_used"
        inputs = relative_attention_inputs(
            config,
            embeddings,
            masks.allowed,
            None if config.untie_r else (self.content_bias, self.position_bias),
            flags.output_attentions or need_usage,
            dropout=self.dropout if self.training else None,
        )
        compressed_length = 0 if memory is None else memory.compressed.length
        usages = []

        hidden = self.dropout(embeddings)  # (B, T, D)
        layer_inputs, all_hidden, all_attentions = [], (), ()  # the layer inputs are what the memories keep
        for index, layer in enumerate(self.layers):
            layer_inputs.append(hidden)
            if flags.output_hidden_states:
                all_hidden += (hidden,)
            layer_memory = None  # (B, C + M, D): the attention reads [compressed memory, memory] as its memory
            if memory is not None:
                layer_memory = torch.cat([memory.compressed.states[index], memory.memory.states[index]], dim=1)
            hidden, probs = layer(hidden, layer_memory, inputs=inputs)
            if need_usage:
                usages.append(_usage(probs, masks.allowed, compressed_length))
            if flags.output_attentions:
                all_attentions += (probs,)
        hidden = self.dropout(hidden)
        if flags.output_hidden_states:
            all_hidden += (hidden,)

        new_memory, losses = None, {}
        if flags.use_cache and config.mem_len > 0:
            usage = usages if need_usage else None
            new_memory, evicted = self._update_memories(memory, layer_inputs, masks.segment, usage, compute_losses)
            if compute_losses and config.cmem_len > 0:
                losses = self._auxiliary_losses(layer_inputs, *evicted)
        output = CompressiveModelOutput(
            last_hidden_state=hidden,
            mems=new_memory,
            **losses,
            hidden_states=all_hidden if flags.output_hidden_states else None,
            attentions=all_attentions if flags.output_attentions else None,
        )
        return output if flags.return_dict else output.to_tuple()


class TffCompressiveLMHeadModel(FusedLMHeadMixin, TffCompressivePreTrainedModel, ValidatedGenerationMixin):
    """Compressive Transformer with an adaptive (or, with no `cutoffs`, plain) softmax head. `logits` are
    log-probabilities; `loss` is the language-model loss plus the weighted auxiliary losses."""

    # Copied from tf_family.models.transfo_xl.modeling_transfo_xl.TffTransfoXLLMHeadModel.__init__ with TransfoXL->Compressive
    def __init__(self, config: TffCompressiveConfig):
        super().__init__(config)
        # transformers infers the loss type from the class name ("...ForCausalLM"); `Trainer` reads it to count
        # ``labels[:, 1:]`` (the shifted targets) for ``num_items_in_batch``
        self.loss_type = "ForCausalLM"
        self.transformer = TffCompressiveModel(config)
        self.lm_head = build_adaptive_softmax(config)
        # per instance: which tensors are tied depends on the config (save_pretrained reads this attribute)
        self._tied_weights_keys = self.get_expanded_tied_weights_keys()
        self.post_init()

    # Copied from tf_family.models.transfo_xl.modeling_transfo_xl.TffTransfoXLLMHeadModel.get_expanded_tied_weights_keys with TransfoXL->Compressive
    def get_expanded_tied_weights_keys(self, all_submodels: bool = False) -> dict[str, str]:
        """Output layers tie to the input embeddings (`tie_word_embeddings`); tail projections tie to the input
        projections (`tie_projs`), as in the original code."""
        return adaptive_tied_weights_keys(self.lm_head, self.transformer.word_embeddings, self.config)

    # Copied from tf_family.models.transfo_xl.modeling_transfo_xl.TffTransfoXLLMHeadModel.get_output_embeddings with TransfoXL->Compressive
    def get_output_embeddings(self):
        return None  # the adaptive softmax is not one matrix; tying is handled by get_expanded_tied_weights_keys

    @answers_fused_lm_head
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        mems: CompressiveMemory | SegmentMemory | tuple[torch.Tensor, ...] | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        reset_mems: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        output_compression_loss: bool | None = None,
        return_dict: bool | None = None,
        num_items_in_batch: NumItems = None,
        **kwargs,
    ) -> CompressiveCausalLMOutput | tuple:
        r"""The keyword parameters follow transformers' ``forward`` convention (hence more than STYLE's six).

        Args:
            labels: ``(B, T)`` token ids, usually ``input_ids``; position ``t`` is predicted from positions ``<= t-1``
                (the shift happens inside), ``-100`` is ignored. With an adaptive softmax (non-empty `cutoffs`) the
                full `logits` are not computed when labels are given, only the losses.
            num_items_in_batch: `Trainer`'s count of ``labels[:, 1:]`` over the accumulated batch. The language-model
                loss is then the sum over it; the auxiliary losses (means over this call's memories, not sums over
                tokens) enter weighted by this call's share of the counted tokens (`tf_family.modeling.losses.batch_share`),
                so that accumulated they are the token-weighted average of the micro-batches' auxiliary losses.
                `aux_loss` and its parts are reported unweighted.
            output_compression_loss: compute the auxiliary losses (defaults to training mode or labels given).
            Other arguments: see `TffCompressiveModel.forward`.
        """
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        mems = memory_from_aliases(mems, kwargs, type(self).__name__)  # its names before, for one release
        if output_compression_loss is None:
            output_compression_loss = self.training or labels is not None
        outputs = self.transformer(
            input_ids,
            mems=mems,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            reset_mems=reset_mems,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            output_compression_loss=output_compression_loss,
            return_dict=True,
        )
        self._check_lm_labels(labels, *outputs.last_hidden_state.shape[:2])
        logits, losses, lm_loss = self.lm_head.causal_lm_outputs(outputs.last_hidden_state, labels, num_items_in_batch)
        loss = lm_loss
        if lm_loss is not None and outputs.aux_loss is not None:
            counted = (labels[:, 1:] != IGNORE_INDEX).sum()
            loss = lm_loss + batch_share(outputs.aux_loss, counted, num_items_in_batch)
        output = CompressiveCausalLMOutput(
            loss=loss,
            logits=logits,
            losses=losses,
            lm_loss=lm_loss,
            aux_loss=outputs.aux_loss,
            attention_reconstruction_loss=outputs.attention_reconstruction_loss,
            autoencoding_loss=outputs.autoencoding_loss,
            mems=outputs.mems,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
        return output if return_dict else output.to_tuple()

    # Copied from tf_family.models.transfo_xl.modeling_transfo_xl.TffTransfoXLLMHeadModel.prepare_inputs_for_generation with TransfoXL->Compressive
    def prepare_inputs_for_generation(
        self, input_ids, mems=None, attention_mask=None, inputs_embeds=None, use_cache=None, **kwargs
    ) -> dict:
        """Once the memory exists only the newest token is fed (`memory_generation_inputs`)."""
        first = kwargs.get("is_first_iteration", True)
        return memory_generation_inputs(input_ids, mems, attention_mask, inputs_embeds, use_cache, first)

    # Copied from tf_family.models.transfo_xl.modeling_transfo_xl.TffTransfoXLLMHeadModel._update_model_kwargs_for_generation with TransfoXL->Compressive
    def _update_model_kwargs_for_generation(self, outputs, model_kwargs, *args, **kwargs) -> dict:
        """The memory travels between steps as ``mems`` (`MEMORY_NAME`), in the output and in the model kwargs, as
        transformers 5 carries XLNet's."""
        model_kwargs = super()._update_model_kwargs_for_generation(outputs, model_kwargs, *args, **kwargs)
        if getattr(outputs, "mems", None) is not None:
            model_kwargs[MEMORY_NAME] = outputs.mems
        return model_kwargs

    # Copied from tf_family.models.transfo_xl.modeling_transfo_xl.TffTransfoXLLMHeadModel._reorder_cache with TransfoXL->Compressive
    def _reorder_cache(self, mems, beam_idx: torch.Tensor):
        return mems.index_select(beam_idx)


__all__ = [
    "TffCompressiveLMHeadModel",
    "TffCompressiveModel",
    "TffCompressivePreTrainedModel",
]
