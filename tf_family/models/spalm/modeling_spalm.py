"""SPALM: adaptive semiparametric language models (Yogatama, de Masson d'Autume, Kong, TACL 2021, arXiv:2102.02557).

A Transformer-XL (short-term memory: the previous segments' hidden states, `mem_len` per layer) whose prediction
also reads a long-term, non-parametric memory: a kNN datastore of (final hidden state, next token) pairs over a
corpus (`tf_family.retrieval.KNNDatastore`, the kNN-LM's). At every position t, with ``h_t`` the last layer's
output (after the final dropout) and ``W`` the output embedding matrix (``lm_head.out_layers[0].weight``, tied to the
input embeddings by default):

    y_1 … y_K   = the next tokens of the K keys nearest to h_t in the datastore          (retrieval, K = ``k``)
    u_k         = W[y_k]                                                                    (their output embeddings)
    m_t         = Σ_k softmax_k(u_k · h_t) u_k                                              (attention over them)
    g_t         = σ(w_g · h_t)                                                              (a scalar gate, no bias)
    z_t         = (1 − g_t) · h_t + g_t · m_t
    p(x_{t+1})  = softmax(W z_t + b)

Each rule is a test in ``tests/models/spalm/test_modeling_spalm.py``. Neighbours missing from a datastore smaller
than K (token -1) get no attention weight; with none at all ``m_t = 0``. Without a datastore (none attached or
passed) ``z_t = h_t``: the model is a Transformer-XL with a plain softmax, exactly (tested against
`TffTransfoXLLMHeadModel` on the same weights). The gate's orientation (g_t weighs the long-term memory) is the
issue's; writing it the other way round is the same family of functions with ``w_g`` negated.

Keys and queries are read at one point, `RETRIEVAL_POINT`: the input of ``transformer.retrieval_point`` (an identity
module after the stack), i.e. ``h_t``. The datastore is built by the Transformer-XL stack alone
(`TffSpalmForCausalLM.build_datastore`), so its fingerprint is the stack's: the gate ``w_g`` (and the output layer)
can be trained with the datastore attached. Following the paper, keys are computed once by a trained model and kept
fixed (no end-to-end training through the retrieval): train the stack as a Transformer-XL first (no datastore),
build the datastore from the training data with that stack, then train the gate (and, with
``check_datastore=False``, the rest). The retrieval itself carries no gradient (the search is discrete); ``m_t``
is differentiable in ``h_t`` and ``W``.

Choices where the paper is silent or where we differ (documented): the search is the kNN-LM datastore's (exact
PyTorch or a faiss index; ``distance="l2"`` by default, the paper used an approximate inner-product search); a
datastore built on the same text the gate is trained on retrieves each position's own next token, so the gate should
be trained on text the datastore does not hold (the bench trains it on a held-out part of the training split).

Export: ``torch.export`` / ONNX trace the model without a datastore (the Transformer-XL); with one, the search runs
over an external, data-dependent store and raises `NotImplementedError` while exporting.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers.utils import ModelOutput, logging

from ...layers import RelativeDecoderLayer
from ...layers.adaptive import adaptive_embeddings_view, resize_adaptive_token_embeddings
from ...layers.xl_scaffold import (
    adaptive_tied_weights_keys,
    as_segment_memory,
    build_adaptive_embedding,
    build_adaptive_softmax,
    build_segment_masks,
    init_xl_weights,
    output_flags,
    relative_attention_inputs,
)
from ...memory import SegmentMemory
from ...modeling.fused_lm_head import FusedLMHeadMixin, answers_fused_lm_head
from ...modeling.heads import memory_generation_inputs
from ...modeling.losses import NumItems
from ...modeling.outputs import MemoryModelOutput
from ...modeling.pretrained import TffPreTrainedModel
from ...modeling.state_names import MEMORY_NAME, memory_from_aliases
from ...modeling.validation import (
    ValidatedGenerationMixin,
    check_positive_int,
)
from ...retrieval.datastore import DatastoreMismatchError, KNNDatastore, build_datastore, check_fingerprints
from .configuration_spalm import TffSpalmConfig

logger = logging.get_logger(__name__)

DATASTORE_FOLDER = "datastore"
# the module (relative to the base model) whose input is h_t: the datastore's keys and the queries are read there
RETRIEVAL_POINT = "retrieval_point"


@dataclass
class SpalmCausalLMOutput(ModelOutput):
    """Output of `TffSpalmForCausalLM`.

    Args:
        loss: mean negative log-likelihood of the predicted tokens (labels shifted inside the model).
        logits: ``(B, T, V)`` log-probabilities of the next token (of ``softmax(W z_t)``).
        losses: ``(B, T - 1)`` per-token negative log-likelihood, 0 where the label is -100.
        gate: ``(B, T)`` the gate g_t (None without retrieval).
        knn_scores / knn_tokens: ``(B, T, K)`` the neighbours' scores and next tokens (None without retrieval).
        mems, hidden_states, attentions: the Transformer-XL's.
    """

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    losses: torch.FloatTensor | None = None
    gate: torch.FloatTensor | None = None
    knn_scores: torch.FloatTensor | None = None
    knn_tokens: torch.LongTensor | None = None
    mems: SegmentMemory | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


class TffSpalmPreTrainedModel(TffPreTrainedModel):
    """Flags and weights initialisation: the Transformer-XL family's (`tf_family.layers.xl_scaffold.init_xl_weights`;
    the gate ``w_g`` is drawn as a linear layer), and the resizing of the adaptive embeddings."""

    config_class = TffSpalmConfig
    config: TffSpalmConfig
    base_model_prefix = "transformer"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["RelativeDecoderLayer"]
    _supports_sdpa = True
    # the attention reads config._attn_implementation at every call, so switching it later is safe
    _can_set_attn_implementation_cached_value = True
    carried_state = "segment_memory"  # a SegmentMemory, passed as `mems` and returned

    # Copied from tf_family.models.transfo_xl.modeling_transfo_xl.TffTransfoXLPreTrainedModel._init_weights with TransfoXL->Spalm
    @torch.no_grad()
    def _init_weights(self, module: nn.Module):
        init_xl_weights(module, self.config.init_std, self.config.proj_init_std)

    # Copied from tf_family.models.transfo_xl.modeling_transfo_xl.TffTransfoXLPreTrainedModel._supports_default_dynamic_cache with TransfoXL->Spalm
    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        # The recurrence state is a memory object returned as `mems`, not a transformers Cache.
        return False

    # Copied from tf_family.models.transfo_xl.modeling_transfo_xl.TffTransfoXLPreTrainedModel.resize_token_embeddings with TransfoXL->Spalm
    def resize_token_embeddings(
        self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None, mean_resizing: bool = True
    ) -> nn.Module:
        """Resize the vocabulary's last cluster (`resize_adaptive_token_embeddings`; transformers' ``mean_resizing``
        fits one embedding matrix and does not apply to clustered embeddings)."""
        return resize_adaptive_token_embeddings(self, new_num_tokens, pad_to_multiple_of)

    # Copied from tf_family.models.transfo_xl.modeling_transfo_xl.TffTransfoXLPreTrainedModel.embeddings with TransfoXL->Spalm
    @property
    def embeddings(self) -> nn.Module:
        """The adaptive input embedding as ``embeddings.word_embeddings``, where PEFT's prompt learning looks
        (`adaptive_embeddings_view`)."""
        return adaptive_embeddings_view(self)


def _as_memory(mems, num_layers: int, batch_size: int, width: int) -> SegmentMemory | None:
    return as_segment_memory(mems, "SPALM", num_layers, batch_size, width)


class TffSpalmModel(TffSpalmPreTrainedModel):
    """The Transformer-XL stack of SPALM: the last hidden state ``h_t`` (read by `retrieval_point`) and the memory."""

    def __init__(self, config: TffSpalmConfig):
        super().__init__(config)
        layers = [RelativeDecoderLayer.from_config(config) for _ in range(config.n_layer)]  # drawn first
        self.word_embeddings = build_adaptive_embedding(config)
        self.dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(layers)
        if not config.untie_r:  # u, v shared by all layers
            self.content_bias = nn.Parameter(torch.zeros(config.n_head, config.d_head))
            self.position_bias = nn.Parameter(torch.zeros(config.n_head, config.d_head))
        self.gradient_checkpointing = False
        self.retrieval_point = nn.Identity()  # its input is h_t: datastore keys and queries are read there
        self.post_init()

    # Copied from tf_family.models.transfo_xl.modeling_transfo_xl.TffTransfoXLModel.get_input_embeddings
    def get_input_embeddings(self) -> nn.Module:
        return self.word_embeddings

    # Copied from tf_family.models.transfo_xl.modeling_transfo_xl.TffTransfoXLModel.set_input_embeddings
    def set_input_embeddings(self, new_embeddings: nn.Module):
        self.word_embeddings = new_embeddings

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        mems: SegmentMemory | tuple[torch.Tensor, ...] | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        reset_mems: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> MemoryModelOutput | tuple:
        r"""The keyword parameters follow transformers' ``forward`` convention (hence more than STYLE's six).

        Args:
            input_ids: ``(B, T)`` token ids of the segment.
            mems: the memory returned for the previous segment of the same streams, or ``None`` at the start.
            attention_mask: ``(B, T)`` 0/1 padding mask, ``(B, >= M + T)`` over ``[memory, segment]``, or a
                ``(B, 1, T, M + T)`` bool mask of allowed pairs.
            reset_mems: ``(B,)`` bool; rows where it is True ignore their memory (a new document starts).
            use_cache: return the updated memory (defaults to ``config.use_cache``).
        """
        config = self.config
        flags = output_flags(config, output_attentions, output_hidden_states, use_cache, return_dict)
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
            None if memory is None else memory.mask,
            max_span=config.mem_len if config.same_length else None,
        )
        inputs = relative_attention_inputs(
            config,
            embeddings,
            masks.allowed,
            None if config.untie_r else (self.content_bias, self.position_bias),
            flags.output_attentions,
            dropout=self.dropout if self.training else None,
        )

        hidden = self.dropout(embeddings)  # (B, T, D)
        layer_inputs, all_hidden, all_attentions = [], (), ()  # the layer inputs are what the memory keeps
        for index, layer in enumerate(self.layers):
            layer_inputs.append(hidden)
            if flags.output_hidden_states:
                all_hidden += (hidden,)
            hidden, probs = layer(hidden, None if memory is None else memory.states[index], inputs=inputs)
            if flags.output_attentions:
                all_attentions += (probs,)
        hidden = self.dropout(hidden)
        if flags.output_hidden_states:
            all_hidden += (hidden,)

        new_memory = None
        if flags.use_cache:
            previous = memory if memory is not None else SegmentMemory.empty_like(layer_inputs)
            new_memory = previous.update(layer_inputs, mem_len=config.mem_len, new_mask=masks.segment)
        output = MemoryModelOutput(
            last_hidden_state=self.retrieval_point(hidden),
            mems=new_memory,
            hidden_states=all_hidden if flags.output_hidden_states else None,
            attentions=all_attentions if flags.output_attentions else None,
        )
        return output if flags.return_dict else output.to_tuple()


def spalm_mix(
    hidden: torch.Tensor, tokens: torch.Tensor, embeddings: torch.Tensor, gate_weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """SPALM's combination of ``h_t`` with its neighbours: ``(z_t (B, T, D), g_t (B, T))``.

    Args:
        hidden: ``(B, T, D)`` h_t.
        tokens: ``(B, T, K)`` the neighbours' next tokens, -1 where the datastore had fewer than K keys.
        embeddings: ``(V, D)`` the output embedding matrix W.
        gate_weight: ``(1, D)`` w_g.
    """
    valid = tokens >= 0  # (B, T, K)
    neighbours = F.embedding(tokens.clamp_min(0), embeddings).to(hidden.dtype)  # (B, T, K, D) u_k = W[y_k]
    scores = torch.einsum("btkd,btd->btk", neighbours, hidden)  # (B, T, K) u_k · h_t
    scores = scores.float().masked_fill(~valid, torch.finfo(torch.float32).min)
    weights = torch.softmax(scores, dim=-1) * valid  # (B, T, K); all zero when no neighbour was found
    long_term = torch.einsum("btk,btkd->btd", weights.to(hidden.dtype), neighbours)  # (B, T, D) m_t
    gate = torch.sigmoid(F.linear(hidden, gate_weight))  # (B, T, 1) g_t = σ(w_g · h_t)
    return (1 - gate) * hidden + gate * long_term, gate.squeeze(-1)


class TffSpalmForCausalLM(FusedLMHeadMixin, TffSpalmPreTrainedModel, ValidatedGenerationMixin):
    """SPALM: the Transformer-XL stack, the gate ``w_g`` (``gate``) and a plain softmax head whose weight ``W`` also
    embeds the retrieved tokens. ``logits`` are log-probabilities. The datastore is attached with `set_datastore`
    (or built with `build_datastore`, or loaded by ``from_pretrained``) or passed to ``forward(datastore=...)``."""

    # a step without a datastore (the Transformer-XL stage of training) leaves the gate without gradient: DDP must
    # search for unused parameters (`tf_family.training.may_leave_parameters_unused`)
    may_leave_parameters_unused = True

    def __init__(self, config: TffSpalmConfig):
        super().__init__(config)
        # transformers infers the loss type from the class name ("...ForCausalLM"); `Trainer` reads it to count
        # ``labels[:, 1:]`` (the shifted targets) for ``num_items_in_batch``
        self.loss_type = "ForCausalLM"
        self.transformer = TffSpalmModel(config)
        self.lm_head = build_adaptive_softmax(config)
        # per instance: which tensors are tied depends on the config (save_pretrained reads this attribute)
        self._tied_weights_keys = self.get_expanded_tied_weights_keys()
        self.gate = nn.Linear(config.d_model, 1, bias=False)  # w_g
        self.datastore: KNNDatastore | None = None
        self._checked_datastores: dict[int, weakref.ref] = {}
        self.post_init()

    # Copied from tf_family.models.transfo_xl.modeling_transfo_xl.TffTransfoXLLMHeadModel.get_expanded_tied_weights_keys with TransfoXL->Spalm
    def get_expanded_tied_weights_keys(self, all_submodels: bool = False) -> dict[str, str]:
        """Output layers tie to the input embeddings (`tie_word_embeddings`); tail projections tie to the input
        projections (`tie_projs`), as in the original code."""
        return adaptive_tied_weights_keys(self.lm_head, self.transformer.word_embeddings, self.config)

    # Copied from tf_family.models.transfo_xl.modeling_transfo_xl.TffTransfoXLLMHeadModel.get_output_embeddings with TransfoXL->Spalm
    def get_output_embeddings(self):
        return None  # the adaptive softmax is not one matrix; tying is handled by get_expanded_tied_weights_keys

    # ------------------------------------------------------------------------------------------------ datastore
    def build_datastore(
        self, batches: Iterable[Mapping[str, torch.Tensor]], folder: str | os.PathLike | None = None, **kwargs
    ) -> KNNDatastore:
        """Build the long-term memory from ``batches`` (``input_ids`` and aligned next-token ``labels``, as
        `tf_family.retrieval.build_datastore` reads them) with this model's Transformer-XL stack (keys: ``h_t``),
        attach it and return it. ``kwargs`` go to `build_datastore` (``tokenizer``, ``key_dtype``, ...)."""
        datastore = build_datastore(self.transformer, batches, folder, module_path=RETRIEVAL_POINT, **kwargs)
        self.set_datastore(datastore)
        return datastore

    def set_datastore(
        self, datastore: KNNDatastore | None, force: bool | None = None, allow_unverified: bool = False
    ) -> None:
        """Attach ``datastore`` (or detach with None) after checking it: keys of width ``d_model``, read at
        `RETRIEVAL_POINT`, built by this model's Transformer-XL stack (its weights fingerprint; another stack's is
        refused unless ``force=True`` or ``config.check_datastore=False``, which warn)."""
        if datastore is not None:
            self._check_datastore(datastore, force, allow_unverified)
        self.datastore = datastore

    def _check_datastore(self, datastore: KNNDatastore, force: bool | None = None, allow_unverified: bool = False):
        checked = self._checked_datastores.get(id(datastore))
        if checked is not None and checked() is datastore:
            return
        if not isinstance(datastore, KNNDatastore):
            raise TypeError(f"datastore must be a tf_family.retrieval.KNNDatastore, got {type(datastore).__name__}.")
        if datastore.dim != self.config.d_model:
            raise ValueError(
                f"the datastore's keys have width {datastore.dim}, SPALM's hidden states d_model={self.config.d_model}; "
                "build it with this model (model.build_datastore)."
            )
        if datastore.description.get("module_path") not in (None, RETRIEVAL_POINT):
            logger.warning(
                f"the datastore's keys were read at {datastore.description.get('module_path')!r}, SPALM's queries at "
                f"{RETRIEVAL_POINT!r} (the final hidden state); build it with model.build_datastore."
            )
        force = (not self.config.check_datastore) if force is None else force
        check_fingerprints(
            datastore.description,
            self.transformer,
            None,
            force,
            where=str(datastore.folder or ""),
            allow_unverified=allow_unverified,
        )
        self._checked_datastores = {key: ref for key, ref in self._checked_datastores.items() if ref() is not None}
        self._checked_datastores[id(datastore)] = weakref.ref(datastore)

    def neighbour_embeddings(self) -> torch.Tensor:
        """``(V, D)`` the output embedding matrix W that embeds the retrieved tokens."""
        return self.lm_head.out_layers[0].weight

    # -------------------------------------------------------------------------------------------------- forward
    @answers_fused_lm_head
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        mems: SegmentMemory | tuple[torch.Tensor, ...] | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        reset_mems: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        datastore: KNNDatastore | None = None,
        k: int | None = None,
        num_items_in_batch: NumItems = None,
        **kwargs,
    ) -> SpalmCausalLMOutput | tuple:
        r"""transformers' language-model signature plus the retrieval options (`generate`, `Trainer` and
        lm-evaluation-harness pass them by name), hence more than ~6 parameters.

        Args:
            labels: ``(B, T)`` token ids; position ``t`` is predicted from positions ``<= t-1`` (the shift happens
                inside), ``-100`` is ignored. With ``num_items_in_batch`` the loss is the sum over it.
            datastore: overrides the attached datastore for this call (checked like `set_datastore`).
            k: overrides ``config.k`` for this call.
            Other arguments: see `TffSpalmModel.forward`.
        """
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        mems = memory_from_aliases(mems, kwargs, type(self).__name__)  # its names before, for one release
        if datastore is not None and datastore is not self.datastore:
            self._check_datastore(datastore)
        datastore = self.datastore if datastore is None else datastore
        if k is not None:
            check_positive_int("k", k, fix="pass k >= 1 neighbours, or None for config.k")
        k = self.config.k if k is None else k
        if datastore is not None and torch.compiler.is_exporting():
            raise NotImplementedError(
                "torch.export cannot trace SPALM's retrieval: the datastore is searched outside the model (a "
                "data-dependent search over memory-mapped shards or a faiss index). Export the model without a "
                "datastore (set_datastore(None)): it is then its Transformer-XL."
            )
        outputs = self.transformer(
            input_ids=input_ids,
            mems=mems,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            reset_mems=reset_mems,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        hidden = outputs.last_hidden_state  # (B, T, D) h_t
        batch, length, width = hidden.shape
        self._check_lm_labels(labels, batch, length)
        gate = scores = tokens = None
        mixed = hidden
        if datastore is not None:
            scores, tokens = datastore.search(hidden.detach().reshape(-1, width), k, self.config.distance)
            scores, tokens = scores.view(batch, length, -1), tokens.view(batch, length, -1).to(hidden.device)
            mixed, gate = spalm_mix(hidden, tokens, self.neighbour_embeddings(), self.gate.weight)
        logits, losses, loss = self.lm_head.causal_lm_outputs(mixed, labels, num_items_in_batch)
        output = SpalmCausalLMOutput(
            loss=loss,
            logits=logits,
            losses=losses,
            gate=gate,
            knn_scores=scores,
            knn_tokens=tokens,
            mems=outputs.mems,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
        return output if return_dict else output.to_tuple()

    def prepare_inputs_for_generation(
        self, input_ids, mems=None, attention_mask=None, inputs_embeds=None, use_cache=None, **kwargs
    ) -> dict:
        """Once the memory exists only the newest token is fed (`memory_generation_inputs`); this call's
        ``datastore`` / ``k`` are passed on when `generate` was given them."""
        first = kwargs.get("is_first_iteration", True)
        inputs = memory_generation_inputs(input_ids, mems, attention_mask, inputs_embeds, use_cache, first)
        inputs.update({name: kwargs[name] for name in ("datastore", "k") if kwargs.get(name) is not None})
        return inputs

    # Copied from tf_family.models.transfo_xl.modeling_transfo_xl.TffTransfoXLLMHeadModel._update_model_kwargs_for_generation with TransfoXL->Spalm
    def _update_model_kwargs_for_generation(self, outputs, model_kwargs, *args, **kwargs) -> dict:
        """The memory travels between steps as ``mems`` (`MEMORY_NAME`), in the output and in the model kwargs, as
        transformers 5 carries XLNet's."""
        model_kwargs = super()._update_model_kwargs_for_generation(outputs, model_kwargs, *args, **kwargs)
        if getattr(outputs, "mems", None) is not None:
            model_kwargs[MEMORY_NAME] = outputs.mems
        return model_kwargs

    # Copied from tf_family.models.transfo_xl.modeling_transfo_xl.TffTransfoXLLMHeadModel._reorder_cache with TransfoXL->Spalm
    def _reorder_cache(self, mems, beam_idx: torch.Tensor):
        return mems.index_select(beam_idx)

    # --------------------------------------------------------------------------------------------- save / load
    def save_pretrained(self, save_directory: str | os.PathLike, *args, save_datastore: bool | None = None, **kwargs):
        """Save the weights (safetensors) and config; the attached datastore goes to ``datastore/`` unless
        ``config.datastore_path`` points at it elsewhere (``save_datastore=True`` copies it anyway). A datastore no
        longer built by this Transformer-XL stack (its weights were trained since) is left out with a warning
        (``save_datastore=True`` is then refused): its keys are the old weights' states."""
        stale = self._stale_datastore_error()
        if stale is not None and save_datastore:
            raise ValueError(f"save_pretrained(save_datastore=True) refused: {stale}")
        if save_datastore is None:
            save_datastore = self.datastore is not None and self.config.datastore_path is None and stale is None
        if stale is not None:
            logger.warning(f"save_pretrained: the datastore is left out of {save_directory}: {stale}")
        datastore_path = self.config.datastore_path
        if stale is not None:
            self.config.datastore_path = None
        try:
            super().save_pretrained(save_directory, *args, **kwargs)
        finally:
            self.config.datastore_path = datastore_path
        if save_datastore and self.datastore is not None:
            target = Path(save_directory) / DATASTORE_FOLDER
            if self.datastore.folder is None or Path(self.datastore.folder).resolve() != target.resolve():
                source = self.datastore
                KNNDatastore(source.key_shards, source.value_shards, source.description).save(target)

    def _stale_datastore_error(self) -> str | None:
        if self.datastore is None or not self.config.check_datastore:
            return None
        try:
            check_fingerprints(self.datastore.description, self.transformer, None, force=False)
        except DatastoreMismatchError as error:
            return (
                "the Transformer-XL stack's weights changed after the datastore was built, so its keys are the old "
                f"weights' hidden states ({error}). Rebuild it with model.build_datastore."
            )
        return None

    @classmethod
    def _finish_loading(
        cls,
        model: TffSpalmForCausalLM,
        pretrained_model_name_or_path,
        load_kwargs: dict,
        *,
        datastore: KNNDatastore | None = None,
        allow_unverified_datastore: bool = False,
    ) -> None:
        """The last step of ``from_pretrained``, whose keyword arguments ``datastore`` and
        ``allow_unverified_datastore`` are these: attach ``datastore``, else ``config.datastore_path``, else a local
        checkpoint folder's ``datastore/`` (a Hub repository's is not fetched: download it and pass
        ``datastore=KNNDatastore.load(...)``). Without any, the model is its Transformer-XL."""
        if datastore is None:
            folder = model.config.datastore_path
            if folder is None and pretrained_model_name_or_path is not None:
                local = Path(str(pretrained_model_name_or_path)) / load_kwargs.get("subfolder", "") / DATASTORE_FOLDER
                folder = str(local) if local.is_dir() else None
            if folder is not None:
                datastore = KNNDatastore.load(folder, allow_unverified=allow_unverified_datastore)
        if datastore is not None:
            model.set_datastore(datastore, allow_unverified=allow_unverified_datastore)


__all__ = [
    "RETRIEVAL_POINT",
    "SpalmCausalLMOutput",
    "TffSpalmForCausalLM",
    "TffSpalmModel",
    "TffSpalmPreTrainedModel",
    "spalm_mix",
]
