"""The kernelised models' generation cache: a `transformers.Cache` holding, per layer, the recurrent state of causal
kernelised attention (``sum phi(k) v^T`` ``(B, H, F, Dh)`` and ``sum phi(k)`` ``(B, H, F)``), whose size does not
grow with the length, plus how many positions were read and how many of them were real tokens per row (the next
position)."""

from __future__ import annotations

import torch
from transformers import Cache

from ...attention.kernelized import LinearAttentionState


class TffPerformerCache(Cache):
    """Per-layer `LinearAttentionState`, the number of positions read (`get_seq_length`, padding included) and
    ``real_tokens`` ``(B,)`` (real tokens read per row). Memory is constant in the length."""

    def __init__(self):
        super().__init__(layers=[])
        self.states: list[LinearAttentionState] = []
        self.seen = 0
        self.real_tokens: torch.Tensor | None = None

    def get_seq_length(self, layer_idx: int | None = 0) -> int:
        return self.seen

    def get_max_length(self) -> int | None:
        return None

    @property
    def is_compileable(self) -> bool:
        return False

    def layer_state(self, layer_idx: int) -> LinearAttentionState | None:
        """The state of layer ``layer_idx`` (``None`` before the first call)."""
        return self.states[layer_idx] if layer_idx < len(self.states) else None

    def set_layer_state(self, layer_idx: int, state: LinearAttentionState) -> None:
        if layer_idx < len(self.states):
            self.states[layer_idx] = state
        elif layer_idx == len(self.states):
            self.states.append(state)
        else:
            raise ValueError(f"layer {layer_idx} cached before layer {len(self.states)}; layers run in order.")

    def advance(self, key_valid: torch.Tensor) -> None:
        """Count the new positions ``key_valid`` ``(B, T)`` (bool) once every layer has read them."""
        counted = key_valid.sum(dim=1)
        self.real_tokens = counted if self.real_tokens is None else self.real_tokens + counted
        self.seen += key_valid.shape[1]

    def _map_rows(self, function) -> None:
        self.states = [LinearAttentionState(*(function(part) for part in state)) for state in self.states]
        if self.real_tokens is not None:
            self.real_tokens = function(self.real_tokens)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Reorder the rows for beam search."""
        self._map_rows(lambda tensor: tensor.index_select(0, beam_idx.to(tensor.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._map_rows(lambda tensor: tensor.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.reorder_cache(indices)

    def crop(self, max_length: int) -> None:
        if max_length < 0:
            max_length = self.seen + max_length
        if max_length != self.seen:
            raise NotImplementedError(
                f"A recurrent state cannot be cropped from {self.seen} to {max_length} positions (it keeps no "
                "per-position keys); generate without assisted decoding / prompt lookup, or without a cache."
            )

    def reset(self) -> None:
        self.states, self.seen, self.real_tokens = [], 0, None


__all__ = ["TffPerformerCache"]
