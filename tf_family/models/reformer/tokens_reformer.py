"""How a Reformer call's inputs are checked (`check_inputs`) and its new tokens laid out before the embeddings read
them: left padding moved to the right (every row's chunks then start at its first real token, so a left-padded row
gives the row's own outputs), positions counted over real tokens, and transformers' padding to a chunk multiple
(``chunk_wrap_around``). `TffReformerModel` calls these in its forward and undoes the roll at the end (`roll_rows`
with the negated shift)."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from transformers.utils import logging

from ...modeling.utils import find_first_real_token
from ...modeling.validation import check_memory_states, check_positive_int, check_seed, refuse_key_value_cache
from .cache_reformer import TffReformerCache
from .configuration_reformer import TffReformerConfig

logger = logging.get_logger(__name__)


class ReformerTokens(NamedTuple):
    """A call's new tokens as the embeddings read them (``(B, T)`` each; ``inputs_embeds`` ``(B, T, D)``)."""

    input_ids: torch.Tensor | None
    inputs_embeds: torch.Tensor | None
    valid: torch.Tensor  # bool: real tokens
    position_ids: torch.Tensor | None


def check_inputs(
    model, *, input_ids, inputs_embeds, attention_mask, position_ids, num_hashes, hash_seed, cache, use_cache
) -> tuple[int, int]:
    """`TffReformerModel.forward`'s inputs checked once, at the edge (``model``: the model, for its config and
    `TffPreTrainedModel` checks); returns ``(B, T)``. Nine parameters: the model and the eight inputs of `forward`
    it checks, by name."""
    config = model.config
    batch, length = model._check_token_inputs(input_ids, inputs_embeds)
    model._check_mask("attention_mask", attention_mask, batch, length, at_least=True)
    model._check_index_inputs("position_ids", position_ids, batch, length, config.max_positions, "positions")
    if num_hashes is not None:
        check_positive_int("num_hashes", num_hashes, maximum=1024)
    if hash_seed is not None:
        check_seed("hash_seed", hash_seed)
    if (cache is not None or use_cache) and not config.causal:
        raise ValueError("cache / use_cache need a causal model (TffReformerForCausalLM).")
    if not isinstance(cache, TffReformerCache):
        refuse_key_value_cache("cache", cache, "Reformer", "the hidden states its LSH attention rehashes")
    if cache is not None and not isinstance(cache, TffReformerCache):
        raise TypeError(f"cache must be a TffReformerCache, got {type(cache).__name__}.")
    cached_rows = getattr(cache, "key_valid", None)
    if cached_rows is not None and cached_rows.shape[0] != batch:
        raise ValueError(
            f"cache holds {cached_rows.shape[0]} rows but the input has {batch}; pass the cache returned "
            "for this batch, or None."
        )
    if cache is not None:
        check_memory_states("cache", cache.states, config.hidden_size)
    past = cache.get_seq_length() if cache is not None else 0
    if attention_mask is not None and attention_mask.shape[1] not in (length, past + length):
        raise ValueError(
            f"attention_mask has {attention_mask.shape[1]} columns; expected {length} (the input) or "
            f"{past + length} (cached positions + input)."
        )
    return batch, length


def roll_rows(tensor: torch.Tensor | None, shift: torch.Tensor) -> torch.Tensor | None:
    """Row ``b`` rotated left by ``shift[b]`` along dim 1 (``shift`` negative: back)."""
    if tensor is None:
        return None
    length = tensor.shape[1]
    index = torch.arange(length, device=tensor.device)[None, :] + shift[:, None]  # (B, T), in (-T, 2T)
    # wrapped without a remainder by the length, which ONNX converters lack when the length is dynamic
    index = torch.where(index >= length, index - length, torch.where(index < 0, index + length, index))
    index = index.view(*index.shape, *([1] * (tensor.dim() - 2))).expand(*index.shape, *tensor.shape[2:])
    return tensor.gather(1, index)


def align_tokens(
    input_ids, inputs_embeds, attention_mask, position_ids, cache: TffReformerCache | None
) -> tuple[ReformerTokens, torch.Tensor | None]:
    """The new tokens as `ReformerTokens`, with left padding moved to the right (the chunks then start at the
    first real token) and positions counted over real tokens when not given; and each row's shift (``None``
    when nothing moved), which the model's forward undoes at the end."""
    source = input_ids if input_ids is not None else inputs_embeds
    batch, length = source.shape[:2]
    past = cache.get_seq_length() if cache is not None else 0
    valid = (
        torch.ones(batch, length, dtype=torch.bool, device=source.device)
        if attention_mask is None
        else attention_mask[:, -length:].to(torch.bool)
    )
    tokens = ReformerTokens(input_ids, inputs_embeds, valid, position_ids)
    shift = None
    # (an exported or compiled graph rolls every row: a shift of 0 leaves it as it is, and a graph cannot branch
    # on data)
    tracing = torch.compiler.is_exporting() or torch.compiler.is_compiling()
    if past == 0 and attention_mask is not None and (tracing or bool((~valid[:, 0] & valid.any(dim=1)).any())):
        shift = find_first_real_token(valid, batch, valid.device)
        tokens = ReformerTokens(*(roll_rows(tensor, shift) for tensor in tokens))
    if tokens.position_ids is None:
        start = cache.next_position() if past else torch.zeros(batch, 1, dtype=torch.long, device=source.device)
        tokens = tokens._replace(position_ids=(start + tokens.valid.long().cumsum(dim=1) - 1).clamp(min=0))
    return tokens, shift


def pad_to_chunk_multiple(
    tokens: ReformerTokens, config: TffReformerConfig, word_embeddings: nn.Module
) -> ReformerTokens:
    """transformers' padding of the input to a multiple of the chunk lengths' LCM (pad tokens, masked, positions
    continuing), which ``chunk_wrap_around`` reproduces without a cache; an input within the shortest chunk is left
    as it is."""
    batch, length = tokens.valid.shape
    padding = 0 if length <= config.min_chunk_length() else -length % config.chunk_multiple()
    if not padding:
        return tokens
    logger.warning_once(f"Padding the input from {length} to {length + padding} tokens (chunk_wrap_around).")
    device = tokens.valid.device
    pad_ids = torch.full((batch, padding), config.pad_token_id or 0, dtype=torch.long, device=device)
    input_ids, inputs_embeds = tokens.input_ids, tokens.inputs_embeds
    if input_ids is not None:
        input_ids = torch.cat([input_ids, pad_ids], dim=1)
    else:
        inputs_embeds = torch.cat([inputs_embeds, word_embeddings(pad_ids)], dim=1)
    tail = torch.arange(length, length + padding, device=device).expand(batch, -1)
    return ReformerTokens(
        input_ids,
        inputs_embeds,
        F.pad(tokens.valid, (0, padding), value=False),
        torch.cat([tokens.position_ids, tail], dim=1),
    )
