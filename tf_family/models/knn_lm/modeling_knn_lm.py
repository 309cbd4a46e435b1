"""kNN-LM: any causal LM interpolated with a nearest-neighbour distribution over a datastore.

Paper: Khandelwal, Levy, Jurafsky, Zettlemoyer, Lewis, "Generalization through Memorization: Nearest Neighbor
Language Models", ICLR 2020, arXiv:1911.00172. Reference implementations read: urvashik/knnlm (fairseq) and
neulab/knn-transformers (forward hooks on hard-coded module paths per model type). Here the base model is any
``AutoModelForCausalLM`` held as ``self.lm``; the query is read by a forward hook at the same point the datastore's
keys were read (`tf_family.retrieval.datastore.resolve_key_module`), so no per-architecture code is needed.

    p(y | x) = λ · p_kNN(y | x) + (1 − λ) · p_LM(y | x)                       (paper eq. 2; λ = ``lmbda``)
    p_kNN(y | x) ∝ Σ_{(k_i, v_i) ∈ N(x), v_i = y} exp(−d(k_i, f(x)) / τ)     (eq. 1; τ = ``knn_temperature``)

computed in log space (`tf_family.memory.knn_lm`). ``logits`` of the output are the interpolated
*log-probabilities* (softmax of them is the distribution; log-softmax leaves them unchanged), so the usual
cross-entropy, sampling and greedy decoding apply unchanged. The base model's KV cache is passed through, so
``generate()`` decodes incrementally; each new position searches the datastore once.

Export: ``torch.export`` traces the model without retrieval (no datastore, or ``lmbda=0``), which is the base
model; with a datastore it raises `NotImplementedError` (the search runs over an external store).

Deviations: the paper's datastore of WikiText-103 used fairseq's ``last_ffn_input`` key (``key_point="ffn_input"``
here); the default here is the input of the output layer, which needs no knowledge of the layer layout. State is
explicit: the datastore is attached (`set_datastore`, ``from_pretrained``) or passed to ``forward(datastore=...)``.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, PreTrainedModel
from transformers.utils import ModelOutput, logging

from ...memory.knn_lm import interpolate_log_probs, knn_log_probs
from ...modeling.fused_lm_head import FusedLMHeadMixin, answers_fused_lm_head
from ...modeling.losses import NumItems, nll
from ...modeling.pretrained import TffPreTrainedModel
from ...modeling.state_names import GENERATION_CACHE_KEY, accepts_past_key_values, state_argument_name
from ...modeling.validation import ValidatedGenerationMixin, check_cache, check_positive_int
from ...retrieval.datastore import (
    DatastoreMismatchError,
    KNNDatastore,
    capture_module_inputs,
    check_fingerprints,
    model_fingerprints,
    resolve_key_module,
)
from .configuration_knn_lm import TffKNNLMConfig

logger = logging.get_logger(__name__)

DATASTORE_FOLDER = "datastore"


@dataclass
class KNNLMCausalLMOutput(ModelOutput):
    """Output of `TffKNNLMForCausalLM`.

    Args:
        loss: mean negative log-likelihood of the interpolated distribution (labels shifted inside the model).
        logits: ``(B, T, V)`` interpolated log-probabilities.
        lm_log_probs: ``(B, T, V)`` the base model's log-probabilities (before interpolation).
        knn_scores / knn_tokens: ``(B, T, K)`` the neighbours' scores and next tokens (None without retrieval).
        cache, hidden_states, attentions: the base model's.
    """

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    lm_log_probs: torch.FloatTensor | None = None
    knn_scores: torch.FloatTensor | None = None
    knn_tokens: torch.LongTensor | None = None
    cache: object | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


class TffKNNLMPreTrainedModel(TffPreTrainedModel):
    config_class = TffKNNLMConfig
    base_model_prefix = "knn_lm"
    carried_state = None  # nothing carried between calls
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _can_set_attn_implementation_cached_value = True

    def _init_weights(self, module):
        # the wrapper owns no parameters; the base model (a PreTrainedModel) initialises its own
        return

    def get_correct_attn_implementation(self, requested_attention: str | None, is_init_check: bool = False) -> str:
        """The wrapper computes no attention of its own: its ``attn_implementation`` is its base model's, checked by
        the base model's class (transformers' rule for a transformers model, tf_family's for one of ours), so that
        ``config._attn_implementation`` names what runs and a client that copies it (TRL builds its reference model
        with the policy's) gets a value the base model accepts."""
        base_class = AutoModelForCausalLM._model_mapping.get(type(self.config.base_config), None)
        if base_class is None or not issubclass(base_class, TffPreTrainedModel):
            return PreTrainedModel.get_correct_attn_implementation(self, requested_attention, is_init_check)
        return super().get_correct_attn_implementation(requested_attention, is_init_check)


class TffKNNLMForCausalLM(FusedLMHeadMixin, TffKNNLMPreTrainedModel, ValidatedGenerationMixin):
    """A causal LM whose next-token distribution is interpolated with a kNN distribution over a datastore.

    Build one around a model you have with `from_base`, or from a config (the base is built from
    ``config.base_config``). Attach a datastore (`set_datastore`) built by `tf_family.retrieval.build_datastore` with
    the same base model; without a datastore (or with ``lmbda=0``) the model is exactly the base LM.
    """

    def __init__(self, config: TffKNNLMConfig, base_model: PreTrainedModel | None = None):
        super().__init__(config)
        self.lm = base_model if base_model is not None else AutoModelForCausalLM.from_config(config.base_config)
        self.datastore: KNNDatastore | None = None
        # datastores already checked against this base model (`set_datastore`, or a first `forward(datastore=...)`)
        self._checked_datastores: dict[int, weakref.ref] = {}
        # the stale datastore `save_pretrained` last warned about leaving out (one warning per datastore, not per save)
        self._stale_datastore_warned: weakref.ref | None = None
        self.post_init()

    # ------------------------------------------------------------------------------------------------ construction
    @classmethod
    def from_base(
        cls, base_model: PreTrainedModel, datastore: KNNDatastore | None = None, **config_kwargs
    ) -> TffKNNLMForCausalLM:
        """Wrap ``base_model`` (its weights are shared, not copied); ``config_kwargs`` are `TffKNNLMConfig` fields."""
        config_kwargs.setdefault("base_model_name_or_path", getattr(base_model.config, "_name_or_path", None) or None)
        # building the composite config and model resets the sub-config's attention implementation (to None, which
        # transformers then treats as "no mask"); the base model keeps the one it was built with
        implementation = base_model.config._attn_implementation
        config = TffKNNLMConfig(base_config=base_model.config, **config_kwargs)
        model = cls(config, base_model=base_model)
        base_model.config._attn_implementation = implementation
        if datastore is not None:
            model.set_datastore(datastore)
        return model

    def set_datastore(
        self, datastore: KNNDatastore | None, force: bool | None = None, allow_unverified: bool = False
    ) -> None:
        """Attach ``datastore`` (or detach with None) after checking it was built by this base model (its weights
        fingerprint): another model's is refused unless ``force=True`` (or ``config.check_datastore=False``); one
        whose description records no fingerprint is refused unless ``allow_unverified=True``; both then warn."""
        if datastore is not None:
            self._check_datastore(datastore, force, allow_unverified)
        self.datastore = datastore

    def _check_datastore(
        self, datastore: KNNDatastore, force: bool | None = None, allow_unverified: bool = False
    ) -> None:
        """`check_fingerprints` once per datastore object: ``forward(datastore=...)`` applies the same check as
        `set_datastore` without fingerprinting the weights on every decoding step."""
        checked = self._checked_datastores.get(id(datastore))
        if checked is not None and checked() is datastore:
            return
        force = (not self.config.check_datastore) if force is None else force
        where = str(datastore.folder or "")
        check_fingerprints(datastore.description, self.lm, None, force, where=where, allow_unverified=allow_unverified)
        if datastore.description.get("module_path") != self.key_module_name:
            logger.warning(
                f"the datastore's keys were read at {datastore.description.get('module_path')!r}, the queries "
                f"are read at {self.key_module_name!r}; set config.key_module_path to match."
            )
        self._checked_datastores = {key: ref for key, ref in self._checked_datastores.items() if ref() is not None}
        self._checked_datastores[id(datastore)] = weakref.ref(datastore)

    @property
    def key_module_name(self) -> str:
        return resolve_key_module(self.lm, self.config.key_point, self.config.key_module_path)[0]

    def get_input_embeddings(self):
        return self.lm.get_input_embeddings()

    def set_input_embeddings(self, value):
        self.lm.set_input_embeddings(value)

    def get_output_embeddings(self):
        return self.lm.get_output_embeddings()

    def set_output_embeddings(self, new_embeddings):
        self.lm.set_output_embeddings(new_embeddings)

    def resize_token_embeddings(self, new_num_tokens: int | None = None, *args, **kwargs):
        """Resize the base model's token embeddings (and output layer) and keep ``config.base_config`` in step.

        An attached datastore stays attached while every token it predicts is still in the vocabulary (its keys are
        hidden states, which new embedding rows do not change); shrinking below one of its tokens is refused.
        """
        if new_num_tokens is not None and self.datastore is not None:
            largest = max((int(values.max()) for values in self.datastore.value_shards if values.numel()), default=-1)
            if new_num_tokens <= largest:
                raise ValueError(
                    f"resize_token_embeddings({new_num_tokens}) would drop token {largest}, which the attached "
                    "datastore predicts; keep new_num_tokens > that, or detach the datastore first "
                    "(set_datastore(None)) and build a new one."
                )
        embeddings = self.lm.resize_token_embeddings(new_num_tokens, *args, **kwargs)
        self.config.base_config = self.lm.config
        if self.datastore is not None:  # the same keys, now of the resized model: its copy carries new fingerprints
            old = self.datastore
            description = {**old.description, **model_fingerprints(self.lm)}
            self.datastore = KNNDatastore(old.key_shards, old.value_shards, description, old.folder, old.index)
            if self.config.datastore_path is not None:
                logger.warning(
                    f"resize_token_embeddings: the datastore at {self.config.datastore_path} was fingerprinted with "
                    "the model before resizing; save it again (model.datastore.save(folder)) or set "
                    "config.datastore_path=None so that save_pretrained writes a copy that matches."
                )
        return embeddings

    # -------------------------------------------------------------------------------------------------- forward
    @answers_fused_lm_head
    @accepts_past_key_values
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache=None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        datastore: KNNDatastore | None = None,
        lmbda: float | None = None,
        k: int | None = None,
        num_items_in_batch: NumItems = None,
        **kwargs,
    ) -> KNNLMCausalLMOutput:
        r"""
        Args:
            labels: ``(B, T)`` token ids, shifted inside the model (``labels[:, 1:]`` scores ``logits[:, :-1]``);
                ``-100`` is ignored. The loss is on the interpolated distribution.
            num_items_in_batch: `Trainer`'s count of ``labels[:, 1:]`` over the accumulated batch; the loss is then
                the sum over it (`tf_family.modeling.losses.nll`).
            datastore: overrides the attached datastore for this call; checked like `set_datastore` (once per
                datastore object; to use an unverified one, attach it with ``allow_unverified=True`` first).
            lmbda / k: override ``config.lmbda`` / ``config.k`` for this call (e.g. a λ sweep); ``lmbda`` must be a
                finite number in [0, 1].

        transformers' language-model signature plus the retrieval options (`generate`, `Trainer` and
        lm-evaluation-harness pass them by name), hence more than ~6 parameters.
        """
        if datastore is not None and datastore is not self.datastore:
            self._check_datastore(datastore)
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        self._check_inputs(input_ids, inputs_embeds, attention_mask, labels, k, cache)
        datastore = self.datastore if datastore is None else datastore
        lmbda = self._call_lmbda(lmbda)
        k = self.config.k if k is None else k
        retrieve = datastore is not None and lmbda > 0
        if retrieve and torch.compiler.is_exporting():
            raise NotImplementedError(
                "torch.export cannot trace the kNN-LM's retrieval: the datastore is searched outside the model "
                "(memory-mapped shards or a faiss index, a data-dependent search). Export the base model "
                "(model.lm), or this model with lmbda=0 or no datastore (set_datastore(None)), and interpolate "
                "with the search results outside the exported graph."
            )
        base_inputs = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "inputs_embeds": inputs_embeds,
            "output_attentions": output_attentions,
            "output_hidden_states": output_hidden_states,
            "return_dict": True,
            **kwargs,
        }
        # the optional ones only when given: a base model may not take them (or may default them differently)
        # the state under the base model's name for it: `cache`, or `mems` for a Transformer-XL-family base
        optional = {"position_ids": position_ids, state_argument_name(self.lm): cache, "use_cache": use_cache}
        base_inputs.update({name: value for name, value in optional.items() if value is not None})
        outputs, queries = self._run_base_model(base_inputs, retrieve)
        lm_log_probs = F.log_softmax(outputs.logits.float(), dim=-1)  # (B, T, V)
        log_probs, scores, tokens = lm_log_probs, None, None
        if retrieve:
            log_probs, scores, tokens = self._interpolate_with_neighbours(lm_log_probs, queries, datastore, lmbda, k)
        loss = None
        if labels is not None:
            loss = nll(
                log_probs[:, :-1].reshape(-1, log_probs.shape[-1]), labels[:, 1:].reshape(-1), num_items_in_batch
            )
        output = KNNLMCausalLMOutput(
            loss=loss,
            logits=log_probs,
            lm_log_probs=lm_log_probs,
            knn_scores=scores,
            knn_tokens=tokens,
            # a KV cache, or a segment memory (Transformer-XL's `mems`), carried to the next decoding step
            cache=getattr(outputs, state_argument_name(self.lm), None),
            hidden_states=getattr(outputs, "hidden_states", None),
            attentions=getattr(outputs, "attentions", None),
        )
        return output if return_dict else output.to_tuple()

    def _check_inputs(self, input_ids, inputs_embeds, attention_mask, labels, k, cache) -> None:
        """The wrapped model's inputs, checked against its vocabulary and width before it reads them, and ``k``."""
        batch, length = self._check_token_inputs(input_ids, inputs_embeds)
        self._check_mask("attention_mask", attention_mask, batch, length, at_least=True, dims=(2, 4))
        self._check_lm_labels(labels, batch, length)
        if k is not None:
            check_positive_int("k", k, fix="pass k >= 1 neighbours, or None for config.k")
        if cache is not None and self.lm._supports_default_dynamic_cache():
            # a key/value cache of this batch and of the base model's heads (a memory model checks its own memory)
            base = self.config.base_config
            heads = getattr(base, "num_key_value_heads", None) or getattr(base, "num_attention_heads", None)
            head_dim = getattr(base, "head_dim", None) or (base.hidden_size // heads if heads else None)
            check_cache(cache, batch, heads, head_dim)

    def _run_base_model(self, base_inputs: dict, retrieve: bool):
        """The base model's output on ``base_inputs`` and, when retrieving, the inputs of its key module (the
        queries of the search; ``None`` otherwise)."""
        if not retrieve:
            return self.lm(**base_inputs), None
        _, module = resolve_key_module(self.lm, self.config.key_point, self.config.key_module_path)
        with capture_module_inputs(module) as captured:
            outputs = self.lm(**base_inputs)
        return outputs, captured[-1]

    def _call_lmbda(self, lmbda) -> float:
        """This call's λ: ``lmbda`` (a number or a one-element tensor) or ``config.lmbda``, checked to be in [0, 1]."""
        lmbda = self.config.lmbda if lmbda is None else lmbda
        if isinstance(lmbda, torch.Tensor) and lmbda.numel() == 1:
            lmbda = lmbda.item()
        if isinstance(lmbda, bool) or not isinstance(lmbda, (int, float)) or not 0.0 <= lmbda <= 1.0:
            source = "config.lmbda" if lmbda is self.config.lmbda else "lmbda"
            raise ValueError(
                f"{source}={lmbda!r} must be a number in [0, 1] (the weight of the kNN distribution; 0 is the base LM)."
            )
        return lmbda

    def _interpolate_with_neighbours(self, lm_log_probs, queries, datastore: KNNDatastore, lmbda: float, k: int):
        """The base LM's ``(B, T, V)`` log-probabilities mixed with the kNN distribution of the ``k`` nearest keys
        to ``queries`` (the key module's inputs), and the neighbours' scores and tokens ``(B, T, K)``."""
        batch, length = lm_log_probs.shape[:2]
        queries = queries.detach().reshape(batch * length, -1)  # (B*T, D); some heads see (B*T, D) already
        scores, tokens = datastore.search(
            queries, k, self.config.distance, self.config.recompute_distances
        )  # (B*T, K) each
        knn = knn_log_probs(scores, tokens, lm_log_probs.shape[-1], self.config.knn_temperature)  # (B*T, V)
        log_probs = interpolate_log_probs(lm_log_probs, knn.view_as(lm_log_probs), lmbda)
        return log_probs, scores.view(batch, length, -1), tokens.view(batch, length, -1)

    # ------------------------------------------------------------------------------------------------ generation
    @accepts_past_key_values
    def prepare_inputs_for_generation(
        self, input_ids, cache=None, attention_mask=None, inputs_embeds=None, **kwargs
    ) -> dict:
        """The base model's inputs for one decoding step (``inputs_embeds`` named here, so that
        ``generate(inputs_embeds=...)`` is accepted), plus this call's ``datastore`` / ``lmbda`` / ``k``."""
        inputs = self.lm.prepare_inputs_for_generation(
            input_ids,
            **{state_argument_name(self.lm): cache},
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            **kwargs,
        )
        if "cache" in inputs:  # a transformers base names it `cache`; PEFT's prompt learning reads the other name
            inputs[GENERATION_CACHE_KEY] = inputs.pop("cache")
        for name in ("datastore", "lmbda", "k"):
            if name in kwargs:
                inputs[name] = kwargs[name]
        return inputs

    def _supports_default_dynamic_cache(self) -> bool:
        # the base model decides: a KV-cache model gets a DynamicCache, a segment-memory model (Transformer-XL) not
        return self.lm._supports_default_dynamic_cache()

    # --------------------------------------------------------------------------------------------- save / load
    def save_pretrained(self, save_directory: str | os.PathLike, *args, save_datastore: bool | None = None, **kwargs):
        """Save the base weights (safetensors) and config; the attached datastore goes to ``datastore/`` unless
        ``config.datastore_path`` points at it elsewhere (``save_datastore=True`` copies it anyway).

        When the base weights changed since the attached datastore was built (a training step — every checkpoint a
        trainer saves —, or a LoRA adapter merged with ``merge_and_unload()``) and ``config.check_datastore`` is on,
        the datastore no longer fits: its keys are the old weights' representations, and the folder's own
        `from_pretrained` would refuse it. The weights and the config are then saved without it (the saved config
        points at no datastore), with one warning that says how to rebuild it (`tf_family.retrieval.build_datastore`,
        or ``recipes/knn_lm.py build``, then `set_datastore`); the folder loads as the model without a datastore.
        ``save_datastore=True`` asks for the datastore by name, and is refused (`ValueError`, nothing written)."""
        stale = self._stale_datastore_error()
        if stale is not None and save_datastore:
            raise ValueError(
                f"save_pretrained(save_datastore=True) refused: {stale} Rebuild the datastore with this model "
                f"({_REBUILD}) and attach it with set_datastore(), or save without it (save_datastore=None or False)."
            )
        if save_datastore is None:
            save_datastore = self.datastore is not None and self.config.datastore_path is None and stale is None
        warned = self._stale_datastore_warned
        if stale is not None and (warned is None or warned() is not self.datastore):
            logger.warning(
                f"save_pretrained: the kNN datastore is left out of the saved folder (and of every later save, "
                f"without another warning): {stale} The folder loads as the model without a datastore. Rebuild it "
                f"with the saved model ({_REBUILD}) and attach it with set_datastore()."
            )
            self._stale_datastore_warned = weakref.ref(self.datastore)
        datastore_path = self.config.datastore_path
        if stale is not None:  # the saved config must not point at the stale datastore either
            self.config.datastore_path = None
        try:
            super().save_pretrained(save_directory, *args, **kwargs)
        finally:
            self.config.datastore_path = datastore_path
        if save_datastore and self.datastore is not None:
            target = Path(save_directory) / DATASTORE_FOLDER
            if self.datastore.folder is None or Path(self.datastore.folder).resolve() != target.resolve():
                folder, index = self.datastore.folder, self.datastore.index
                copy = KNNDatastore(self.datastore.key_shards, self.datastore.value_shards, self.datastore.description)
                copy.save(target)
                if index is not None and folder is not None:
                    index.save(target / f"index-{self.config.index_type}", metadata=copy.index_metadata())

    def _stale_datastore_error(self) -> str | None:
        """Why the attached datastore no longer fits the base weights (their fingerprint changed since it was built),
        or None: no datastore, ``config.check_datastore`` off, or the datastore fits."""
        if self.datastore is None or not self.config.check_datastore:
            return None
        try:
            check_fingerprints(self.datastore.description, self.lm, None, force=False)
        except DatastoreMismatchError as error:
            return (
                "the base model's weights changed after its kNN datastore was built (a training step, or a LoRA "
                f"adapter merged with merge_and_unload()), so its keys are the old weights' representations ({error})."
            )
        return None

    @classmethod
    def _finish_loading(
        cls,
        model: TffKNNLMForCausalLM,
        pretrained_model_name_or_path,
        load_kwargs: dict,
        *,
        datastore: KNNDatastore | None = None,
        allow_unverified_datastore: bool = False,
    ) -> None:
        """The last step of ``from_pretrained`` (`tf_family.modeling.pretrained.TffPreTrainedModel`), whose keyword
        arguments ``datastore`` and ``allow_unverified_datastore`` are these: attach ``datastore``, else
        ``config.datastore_path``, else the checkpoint's ``datastore/`` folder (a local folder's, or a Hub
        repository's, fetched into the Hub cache beside the weights), searching with ``config.index_type``. The
        datastore is checked as `set_datastore` checks it; ``allow_unverified_datastore=True`` accepts one without a
        fingerprint (or an index that records no shards) with a warning."""
        if datastore is None:
            folder = model.config.datastore_path
            if folder is None and pretrained_model_name_or_path is not None:
                hub_kwargs = {name: load_kwargs[name] for name in _HUB_KWARGS if load_kwargs.get(name) is not None}
                folder = _checkpoint_datastore(str(pretrained_model_name_or_path), hub_kwargs)
            if folder is not None:
                index = None if model.config.index_type == "exact" else model.config.index_type
                datastore = KNNDatastore.load(folder, index_type=index, allow_unverified=allow_unverified_datastore)
        if datastore is not None:
            model.set_datastore(datastore, allow_unverified=allow_unverified_datastore)
        else:
            logger.warning(
                f"{pretrained_model_name_or_path}: loaded with no datastore (the folder has no {DATASTORE_FOLDER}/ and "
                "config.datastore_path is None): the model is its base language model until a datastore is built "
                f"({_REBUILD}) and attached with set_datastore(), or passed as from_pretrained(..., datastore=...)."
            )


# how a user rebuilds a kNN-LM's datastore, named in the messages about a stale one
_REBUILD = "tf_family.retrieval.build_datastore, or `recipes/knn_lm.py build --model_name_or_path <the saved folder>`"

# from_pretrained's arguments that say where and how a Hub repository is read
_HUB_KWARGS = ("cache_dir", "revision", "token", "local_files_only", "force_download", "proxies", "subfolder")


def _checkpoint_datastore(name_or_path: str, hub_kwargs: dict) -> str | None:
    """The ``datastore/`` folder of a checkpoint: inside a local folder, or for a Hub id the repository's
    ``datastore/`` files fetched into the Hub cache (only those; the weights are already there). None without one."""
    local = Path(name_or_path) / hub_kwargs.get("subfolder", "") / DATASTORE_FOLDER
    if Path(name_or_path).is_dir():
        return str(local) if local.is_dir() else None
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError

    subfolder = hub_kwargs.pop("subfolder", "")
    prefix = f"{subfolder.strip('/')}/" if subfolder else ""
    try:
        snapshot = snapshot_download(name_or_path, allow_patterns=[f"{prefix}{DATASTORE_FOLDER}/*"], **hub_kwargs)
    except HFValidationError:  # neither a folder nor a Hub id: transformers already said what it could read
        return None
    except Exception as error:  # offline without the files cached, unreachable, no access: load without one
        logger.warning(
            f"{name_or_path}: could not fetch its {DATASTORE_FOLDER}/ folder ({type(error).__name__}: {error}); the "
            "model is loaded without a datastore (it is the base model until set_datastore is called)."
        )
        return None
    folder = Path(snapshot) / prefix / DATASTORE_FOLDER
    return str(folder) if (folder / "datastore.json").is_file() else None


__all__ = ["KNNLMCausalLMOutput", "TffKNNLMForCausalLM", "TffKNNLMPreTrainedModel"]
