"""The Reformer's generation cache: a `transformers.Cache` holding, per layer, the normalised inputs of its
attention (LSH layers hash and attend over them again; local layers read the last chunks), plus which cached
positions are real tokens and their positions (real tokens counted, so left padding does not shift them)."""

from __future__ import annotations

import torch
from transformers import Cache


class TffReformerCache(Cache):
    """Per-layer attention inputs ``(B, P, D)`` of every earlier call, ``key_valid`` ``(B, P)`` and ``position_ids``
    ``(B, P)``. `get_seq_length` is ``P``."""

    def __init__(self):
        super().__init__(layers=[])
        self.states: list[torch.Tensor] = []
        self.key_valid: torch.Tensor | None = None
        self.position_ids: torch.Tensor | None = None

    def get_seq_length(self, layer_idx: int | None = 0) -> int:
        return 0 if self.key_valid is None else self.key_valid.shape[1]

    def get_max_length(self) -> int | None:
        return None

    @property
    def is_compileable(self) -> bool:
        return False

    def layer_states(self, layer_idx: int) -> torch.Tensor | None:
        """The cached inputs of layer ``layer_idx`` (``None`` before the first call)."""
        return self.states[layer_idx] if layer_idx < len(self.states) else None

    def append_states(self, layer_idx: int, states: torch.Tensor) -> None:
        """Append the new tokens' normalised attention inputs ``(B, T, D)`` of layer ``layer_idx``."""
        if layer_idx < len(self.states):
            self.states[layer_idx] = torch.cat([self.states[layer_idx], states], dim=1)
        elif layer_idx == len(self.states):
            self.states.append(states)
        else:
            raise ValueError(f"layer {layer_idx} cached before layer {len(self.states)}; layers run in order.")

    def extend(self, key_valid: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Record the new tokens' ``key_valid`` / ``position_ids`` ``(B, T)``; returns both over ``P + T``."""
        if self.key_valid is None:
            self.key_valid, self.position_ids = key_valid, position_ids
        else:
            self.key_valid = torch.cat([self.key_valid, key_valid], dim=1)
            self.position_ids = torch.cat([self.position_ids, position_ids], dim=1)
        return self.key_valid, self.position_ids

    def next_position(self) -> torch.Tensor:
        """``(B, 1)`` the position of the next real token (real tokens so far)."""
        return self.key_valid.sum(dim=1, keepdim=True)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Reorder the rows for beam search."""
        self.states = [states.index_select(0, beam_idx.to(states.device)) for states in self.states]
        if self.key_valid is not None:
            self.key_valid = self.key_valid.index_select(0, beam_idx.to(self.key_valid.device))
            self.position_ids = self.position_ids.index_select(0, beam_idx.to(self.position_ids.device))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.states = [states.repeat_interleave(repeats, dim=0) for states in self.states]
        if self.key_valid is not None:
            self.key_valid = self.key_valid.repeat_interleave(repeats, dim=0)
            self.position_ids = self.position_ids.repeat_interleave(repeats, dim=0)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.reorder_cache(indices)

    def crop(self, max_length: int) -> None:
        if max_length < 0:
            max_length = self.get_seq_length() + max_length
        self.states = [states[:, :max_length] for states in self.states]
        if self.key_valid is not None:
            self.key_valid, self.position_ids = self.key_valid[:, :max_length], self.position_ids[:, :max_length]

    def reset(self) -> None:
        self.states, self.key_valid, self.position_ids = [], None, None


__all__ = ["TffReformerCache"]
