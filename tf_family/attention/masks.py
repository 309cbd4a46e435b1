"""Boolean attention masks. Convention: ``True`` means "may attend", ``False`` means "masked"."""

from __future__ import annotations

import torch


def build_causal_memory_mask(
    query_length: int,
    memory_length: int,
    max_span: int | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Causal mask for a segment of ``query_length`` tokens that follows ``memory_length`` remembered positions.

    Keys are laid out as ``[memory, segment]``, so query ``i`` sits at key index ``memory_length + i`` and may
    attend to every key ``j <= memory_length + i``. With ``max_span`` (Transformer-XL's ``same_length``), query
    ``i`` sees only the ``max_span`` most recent keys, itself included, so that every query attends to the same
    number of positions once the memory is full.

    Returns:
        ``(T, S)`` bool tensor with ``S = memory_length + query_length``.
    """
    if max_span is not None and max_span < 1:
        raise ValueError(f"max_span must be >= 1 or None, got {max_span}.")
    query_index = torch.arange(query_length, device=device)[:, None] + memory_length  # (T, 1)
    key_index = torch.arange(memory_length + query_length, device=device)[None, :]  # (1, S)
    allowed = key_index <= query_index  # (T, S)
    if max_span is not None:
        allowed &= key_index > query_index - max_span
    return allowed


def build_key_padding_mask(
    batch_size: int,
    query_length: int,
    memory_mask: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    device: torch.device | str | None = None,
) -> torch.Tensor | None:
    """Which keys hold real tokens, as a ``(B, S)`` bool tensor, or ``None`` when every key is real.

    Args:
        memory_mask: ``(B, M)`` bool, ``True`` where a memory slot holds a real (not reset, not padded) position.
        attention_mask: ``(B, T)`` or ``(B, >= M + T)`` 0/1 mask in the transformers convention. When it is longer
            than the segment, its last ``M + T`` columns cover ``[memory, segment]`` (this is what ``generate``
            passes: the mask of the whole sequence so far) and are combined with ``memory_mask``.
    """
    memory_length = 0 if memory_mask is None else memory_mask.shape[1]
    if attention_mask is None and memory_mask is None:
        return None
    if memory_mask is None:
        memory_mask = torch.ones(batch_size, 0, dtype=torch.bool, device=device)
    if attention_mask is None:
        segment = torch.ones(batch_size, query_length, dtype=torch.bool, device=memory_mask.device)
        return torch.cat([memory_mask, segment], dim=1)
    if attention_mask.dim() != 2 or attention_mask.shape[0] != batch_size:
        raise ValueError(
            f"attention_mask must have shape (batch, length) with batch={batch_size}, got "
            f"{tuple(attention_mask.shape)}."
        )
    attention_mask = attention_mask.to(torch.bool)
    key_length = memory_length + query_length
    if attention_mask.shape[1] == query_length:
        return torch.cat([memory_mask, attention_mask], dim=1)
    if attention_mask.shape[1] >= key_length:
        memory_columns = attention_mask[
            :, attention_mask.shape[1] - key_length : attention_mask.shape[1] - query_length
        ]
        return torch.cat([memory_mask & memory_columns, attention_mask[:, -query_length:]], dim=1)
    raise ValueError(
        f"attention_mask has {attention_mask.shape[1]} columns; expected {query_length} (the segment) or at least "
        f"{key_length} (memory of {memory_length} + segment of {query_length})."
    )
