"""Key/value caches for tf_family's models: `GrowingCache`, a `transformers.DynamicCache` whose decoding steps are
written in place (`GrowingLayer`), and `GrowingCacheGenerationMixin`, the generation mixin whose ``generate`` uses
it."""

from __future__ import annotations

import functools

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .validation import ValidatedGenerationMixin


class GrowingLayer(DynamicLayer):
    """transformers' `DynamicLayer` whose keys and values live in buffers with room to spare: an update writes the
    new positions in place, where `DynamicLayer.update` concatenates (a copy of the whole layer at every decoding
    step: quadratic in the length; measured in ``bench/bench_kv_cache.py``). ``keys`` and
    ``values`` are views of the filled part, so whatever reads a `DynamicLayer` reads this one alike.

    A full buffer is replaced by one of about twice the filled length (``+ 256``), or of ``reserve`` positions when
    that is enough and smaller (`GrowingCacheGenerationMixin` passes generation's whole length), so the copies cost
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


class GrowingCacheGenerationMixin(ValidatedGenerationMixin):
    """`ValidatedGenerationMixin` whose ``generate`` makes a `GrowingCache` with room for the whole generation where it
    would make a plain `DynamicCache` (same tokens, no copy of the cache at every step). A cache the caller passes is
    used as given. A model lists it in place of `ValidatedGenerationMixin` (transformers' ``can_generate`` looks for
    a base whose name holds ``GenerationMixin``)."""

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


__all__ = ["GrowingCache", "GrowingCacheGenerationMixin", "GrowingLayer"]
