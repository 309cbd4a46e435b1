"""Small pieces of modeling code shared by several tf_family models."""

from __future__ import annotations

import functools
import importlib
import os

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache
from transformers.activations import ACT2FN
from transformers.cache_utils import DynamicLayer

from .attention.dropout import _check_p, dropout
from .files import check_checkpoint_folder


class Dropout(nn.Dropout):
    """`torch.nn.Dropout` computed by `tf_family.attention.dropout` (cheaper on CPU; same ``p``, no state;
    ``inplace`` is not supported)."""

    def __init__(self, p: float = 0.5):
        _check_p(p)
        super().__init__(p)

    def forward(self, tensor: torch.Tensor) -> torch.Tensor:
        return dropout(tensor, self.p, self.training)


def _registered_in_package(cls: type) -> bool:
    """Whether ``register_for_auto_class`` was called on ``cls``, a class of the tf_family package (not one loaded
    from exported code, whose flat files transformers copies itself)."""
    return cls.__dict__.get("_auto_class") is not None and cls.__module__.split(".")[0] == "tf_family"


class RemoteCodeMixin:
    """``save_pretrained(..., remote_code=True)``: save, then add the model's code to the folder
    (`tf_family.remote_code.export_remote_code`), so that plain transformers loads it with ``trust_remote_code=True``
    where tf_family is not installed. Listed first among the bases of every tf_family ``PreTrainedModel``, it is also
    where ``from_pretrained`` checks a local folder's files first (`tf_family.files.check_checkpoint_folder`)."""

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """transformers' ``from_pretrained``, after checking a local folder's ``config.json`` and safetensors files:
        a damaged or truncated file, or a shard named outside the folder, is a `ValueError` naming it; a local path
        that does not exist (`tf_family.user_errors.looks_local`) is said to be missing at once, where transformers
        would take it for a Hub id and retry the network."""
        try:  # by name: an export's code (loaded where tf_family may be missing) carries no user_errors module
            check_local_path = importlib.import_module("tf_family.user_errors").check_local_path
        except ImportError:
            check_local_path = None
        if check_local_path is not None:
            check_local_path(pretrained_model_name_or_path, f"{cls.__name__}.from_pretrained")
        if pretrained_model_name_or_path is not None and os.path.isdir(pretrained_model_name_or_path):
            check_checkpoint_folder(os.path.join(pretrained_model_name_or_path, kwargs.get("subfolder") or ""))
        return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)

    def save_pretrained(self, save_directory: str | os.PathLike, *args, remote_code: bool = False, **kwargs):
        """transformers' ``save_pretrained``; ``remote_code=True`` also writes the model's code and ``auto_map``.
        After ``register_for_auto_class()`` (transformers' way to ship custom code, which cannot copy tf_family's
        package-relative imports: a raw `FileNotFoundError` inside transformers) it does the same as
        ``remote_code=True``."""
        registered = [cls for cls in (type(self), type(self.config)) if _registered_in_package(cls)]
        remote_code = remote_code or bool(registered)
        saved = {cls: cls.__dict__["_auto_class"] for cls in registered}
        try:  # the export below writes the code; transformers' own copy of it would fail
            for cls in registered:
                cls._auto_class = None
            super().save_pretrained(save_directory, *args, **kwargs)
        finally:
            for cls, auto_class in saved.items():
                cls._auto_class = auto_class
        if remote_code and kwargs.get("is_main_process", True):
            try:  # by name: the exporter is not part of an export (the code files a folder carries)
                exporter = importlib.import_module("tf_family.remote_code")
            except ImportError as error:
                raise ValueError(
                    "save_pretrained(remote_code=True) needs tf_family installed (pip install tf-family); a model "
                    "loaded from exported code saves with remote_code=False and keeps its auto_map."
                ) from error
            exporter.export_remote_code(save_directory)


class AdaptiveTokenEmbeddingsMixin:
    """``resize_token_embeddings`` for the models whose input embeddings are a `tf_family.layers.AdaptiveEmbedding`
    and whose ``lm_head``, when they have one, is a `ProjectedAdaptiveLogSoftmax` (Transformer-XL, Compressive,
    Memorizing). transformers' own resizing needs one embedding matrix; here the last cluster of both is resized
    (`AdaptiveEmbedding.resize`), the cutoffs stay, and tied weights are tied again."""

    def resize_token_embeddings(
        self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None, mean_resizing: bool = True
    ) -> nn.Module:
        """Resize the vocabulary to ``new_num_tokens`` (rounded up to ``pad_to_multiple_of``) and return the input
        embeddings. New rows are drawn as ``_init_weights`` draws them (transformers' ``mean_resizing`` fits one
        embedding matrix; it does not apply to clustered embeddings). A size at or below the last cutoff raises a
        `ValueError` (the adaptive layout cannot shrink into its frequent-token clusters)."""
        embeddings = self.get_input_embeddings()
        if new_num_tokens is None and pad_to_multiple_of is None:
            return embeddings
        new_num_tokens = embeddings.bounds[-1] if new_num_tokens is None else new_num_tokens
        if pad_to_multiple_of is not None:
            if not isinstance(pad_to_multiple_of, int) or pad_to_multiple_of < 1:
                raise ValueError(f"pad_to_multiple_of must be a positive int, got {pad_to_multiple_of!r}.")
            new_num_tokens = -(-new_num_tokens // pad_to_multiple_of) * pad_to_multiple_of
        embeddings.resize(new_num_tokens, self._init_weights)
        head = getattr(self, "lm_head", None)
        if head is not None:
            head.resize(new_num_tokens, self._init_weights)
        self.config.vocab_size = new_num_tokens
        self.tie_weights()
        return embeddings


def build_activation(name: str) -> nn.Module:
    """transformers' activation ``name``; its Python tanh-approximate GELU (``gelu_new``) becomes PyTorch's fused
    one (the same function, several times faster on CPU)."""
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return nn.GELU(approximate="tanh")
    return ACT2FN[name]


def find_first_real_token(attention_mask: torch.Tensor | None, batch: int, device) -> torch.Tensor:
    """``(B,)`` index of each row's first real token (1 in ``attention_mask``; 0 without a mask), so that a model
    pools the same token under left and right padding."""
    if attention_mask is None:
        return torch.zeros(batch, dtype=torch.long, device=device)
    return attention_mask.to(torch.int).argmax(dim=1)  # (B,)


def accepts_past_key_values(function):
    """Let a ``forward`` or ``prepare_inputs_for_generation`` that takes the cache as ``cache`` (its name since
    transformers 5.24) also take it under its older name ``past_key_values``, as callers written for earlier
    transformers releases pass it. Passing both is a ValueError."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        if "past_key_values" in kwargs:
            old = kwargs.pop("past_key_values")
            if kwargs.get("cache") is not None and old is not None and kwargs["cache"] is not old:
                raise ValueError(
                    "Got both `cache` and `past_key_values`: they are the same argument (`past_key_values` is the "
                    "name transformers used before 5.24). Pass the cache once, as `cache`."
                )
            if kwargs.get("cache") is None:
                kwargs["cache"] = old
        return function(*args, **kwargs)

    return wrapper


def decoding_step_inputs(
    input_ids: torch.LongTensor,
    past_length: int,
    attention_mask: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
    embed: nn.Module,
) -> dict[str, torch.Tensor]:
    """What one `generate` step feeds a model whose cache holds ``past_length`` positions: ``{"input_ids": …}``
    (the tokens the cache has not seen) or ``{"inputs_embeds": …}``.

    Under ``generate(inputs_embeds=...)`` the prompt is embeddings and ``input_ids`` holds only the tokens generated
    so far; positions the cache has not seen are taken from the prompt's embeddings and from ``embed(input_ids)``
    (the model's input embeddings), so decoding without a cache re-reads the whole prefix too. ``attention_mask``,
    when given, covers the whole sequence (left padding included).
    """
    if inputs_embeds is None:
        total = attention_mask.shape[1] if attention_mask is not None else input_ids.shape[1]
        return {"input_ids": input_ids[:, input_ids.shape[1] - (total - past_length) :]}
    prompt = inputs_embeds.shape[1]
    if past_length >= prompt:  # the cache covers the prompt: only generated tokens are new
        return {"input_ids": input_ids[:, past_length - prompt :]}
    if input_ids.shape[1] == 0:
        return {"inputs_embeds": inputs_embeds[:, past_length:]}
    generated = embed(input_ids).to(inputs_embeds.dtype)  # (B, T_generated, D)
    return {"inputs_embeds": torch.cat([inputs_embeds, generated], dim=1)[:, past_length:]}


def is_plain_linear(module: nn.Module) -> bool:
    """A `torch.nn.Linear` itself (not a LoRA or quantised wrapper, nor a subclass) with no forward hooks."""
    return type(module) is nn.Linear and not (module._forward_hooks or module._forward_pre_hooks)


# below this many input rows (tokens), `fused_projections` calls the projections one by one: concatenating the
# weights copies every one of them, which costs more than the wider product saves when it multiplies only a few rows
# (a decoding step: at width 256 and batch 1 the copies took as long as the layer's products)
FUSE_MIN_ROWS = 64


def fused_projections(hidden: torch.Tensor, *linears: nn.Module) -> tuple[torch.Tensor, ...]:
    """``tuple(linear(hidden) for linear in linears)``, computed as one matrix product when it can be.

    Several projections of the same input (query, key, value) cost less as one wide product than as separate
    narrow ones (about 25 % less time forward + backward at width 256 on CPU). The parameters stay separate
    modules, so checkpoints, LoRA targets and `from_pretrained` see the usual names. When a module is not a plain
    ``nn.Linear`` (a LoRA or quantised wrapper) or carries hooks, each one is called as usual; so they are when
    ``hidden`` holds fewer than `FUSE_MIN_ROWS` rows (decoding), where copying the weights into one matrix would
    cost more than the one product saves.
    """
    if len(linears) < 2 or not all(is_plain_linear(linear) for linear in linears):
        return tuple(linear(hidden) for linear in linears)
    if hidden.numel() < FUSE_MIN_ROWS * hidden.shape[-1]:
        return tuple(linear(hidden) for linear in linears)
    biases = [linear.bias for linear in linears]
    if any(bias is None for bias in biases) and not all(bias is None for bias in biases):
        return tuple(linear(hidden) for linear in linears)
    weight = torch.cat([linear.weight for linear in linears])
    bias = None if biases[0] is None else torch.cat(biases)
    return F.linear(hidden, weight, bias).split([linear.out_features for linear in linears], dim=-1)


# ------------------------------------------------------------------------------------------------ key/value cache
class GrowingLayer(DynamicLayer):
    """transformers' `DynamicLayer` whose keys and values live in buffers with room to spare: an update writes the
    new positions in place, where `DynamicLayer.update` concatenates (a copy of the whole layer at every decoding
    step: quadratic in the length, and at batch 8 on CALM's benchmark model about a twelfth of a step). ``keys`` and
    ``values`` are views of the filled part, so whatever reads a `DynamicLayer` reads this one alike.

    A full buffer is replaced by one of about twice the filled length (``+ 256``), or of ``reserve`` positions when
    that is enough and smaller (`GrowingCacheMixin` passes generation's whole length), so the copies cost
    ``O(length)`` in all and the room never exceeds about twice what is filled. Keys that something else put in
    place (``crop``, beam search's reordering, offloading, ``reset``) are adopted, copied into new buffers, at the
    next update. While gradients flow into the new keys or values an update concatenates as `DynamicLayer` does
    (writing in place would overwrite what backward needs)."""

    def __init__(self, reserve: int = 0):
        super().__init__()
        self.reserve = reserve
        self._buffers: tuple[torch.Tensor, torch.Tensor] | None = None
        self._view: torch.Tensor | None = None  # the keys this layer last handed out (a view of its buffer)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if torch.is_grad_enabled() and (key_states.requires_grad or value_states.requires_grad):
            self._buffers = self._view = None
            return super().update(key_states, value_states, *args, **kwargs)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        past = self.get_seq_length()
        length = past + key_states.shape[-2]
        buffers = self._buffers
        if (
            buffers is None
            or self.keys is not self._view
            or buffers[0].shape[-2] < length
            or buffers[0].shape[:2] != key_states.shape[:2]
            or buffers[1].shape[-1] != value_states.shape[-1]
            or buffers[0].dtype != key_states.dtype
            or buffers[0].device != key_states.device
        ):
            capacity = max(2 * length, length + 256)
            if self.reserve >= length:
                capacity = min(capacity, self.reserve)
            batch, heads = key_states.shape[:2]
            buffers = (
                key_states.new_empty(batch, heads, capacity, key_states.shape[-1]),
                value_states.new_empty(batch, heads, capacity, value_states.shape[-1]),
            )
            if past:
                buffers[0][:, :, :past].copy_(self.keys)
                buffers[1][:, :, :past].copy_(self.values)
            self._buffers = buffers
        buffers[0][:, :, past:length].copy_(key_states)
        buffers[1][:, :, past:length].copy_(value_states)
        self.keys = self._view = buffers[0][:, :, :length]
        self.values = buffers[1][:, :, :length]
        return self.keys, self.values


class GrowingCache(DynamicCache):
    """A `transformers.DynamicCache` (same methods; ``isinstance`` checks hold) whose full-attention layers are
    `GrowingLayer`s. ``reserve``: how many positions a layer makes room for when first filled."""

    def __init__(self, config=None, reserve: int = 0):
        if not isinstance(reserve, int) or isinstance(reserve, bool) or reserve < 0:
            raise ValueError(f"reserve must be an int >= 0 (positions to make room for), got {reserve!r}.")
        super().__init__(config=config)
        self.layers = [GrowingLayer(reserve) if type(layer) is DynamicLayer else layer for layer in self.layers]
        if self.layer_class_to_replicate is DynamicLayer:  # no config: layers are made as they are first updated
            self.layer_class_to_replicate = functools.partial(GrowingLayer, reserve)


class GrowingCacheMixin:
    """``generate`` makes a `GrowingCache` with room for the whole generation where it would make a plain
    `DynamicCache` (same tokens, no copy of the cache at every step). A cache the caller passes is used as given."""

    def _prepare_cache_for_generation(
        self, generation_config, model_kwargs, generation_mode, batch_size: int, max_cache_length: int
    ):
        super()._prepare_cache_for_generation(
            generation_config, model_kwargs, generation_mode, batch_size, max_cache_length
        )
        made = model_kwargs.get("cache")
        if (
            type(made) is DynamicCache
            and not getattr(made, "_is_user_defined", False)
            and generation_config.cache_implementation in (None, "dynamic")
        ):
            reserve = max(int(max_cache_length), 0)
            model_kwargs["cache"] = GrowingCache(self.config.get_text_config(decoder=True), reserve=reserve)


__all__ = [
    "AdaptiveTokenEmbeddingsMixin",
    "FUSE_MIN_ROWS",
    "Dropout",
    "GrowingCache",
    "GrowingCacheMixin",
    "GrowingLayer",
    "RemoteCodeMixin",
    "build_activation",
    "decoding_step_inputs",
    "find_first_real_token",
    "fused_projections",
    "is_plain_linear",
]
