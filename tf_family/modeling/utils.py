"""Small pieces of modeling code shared by several tf_family models: the `Dropout` module, activations, pooling,
decoding-step inputs, fused projections and `torch.export` helpers.

What has a concern of its own lives elsewhere: key/value caches in `tf_family.modeling.cache`, the names of the
state a model carries (and their aliases) in `tf_family.modeling.state_names`, adaptive-embedding resizing in
`tf_family.layers.adaptive`, ``save_pretrained(remote_code=True)`` and the one ``from_pretrained`` hook in
`tf_family.modeling.pretrained` (foreign formats in `tf_family.conversion.foreign`).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN

from ..attention.dropout import _check_p, dropout
from .state_names import GENERATION_CACHE_KEY


class Dropout(nn.Dropout):
    """`torch.nn.Dropout` computed by `tf_family.attention.dropout` (cheaper on CPU; same ``p``, no state;
    ``inplace`` is not supported)."""

    def __init__(self, p: float = 0.5):
        _check_p(p)
        super().__init__(p)

    def forward(self, tensor: torch.Tensor) -> torch.Tensor:
        return dropout(tensor, self.p, self.training)


def build_activation(name: str) -> nn.Module:
    """transformers' activation ``name``; its Python tanh-approximate GELU (``gelu_new``) becomes PyTorch's fused
    one (the same function in one kernel instead of several)."""
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return nn.GELU(approximate="tanh")
    return ACT2FN[name]


def find_first_real_token(attention_mask: torch.Tensor | None, batch: int, device) -> torch.Tensor:
    """``(B,)`` index of each row's first real token (1 in ``attention_mask``; 0 without a mask), so that a model
    pools the same token under left and right padding."""
    if attention_mask is None:
        return torch.zeros(batch, dtype=torch.long, device=device)
    return attention_mask.to(torch.int).argmax(dim=1)  # (B,)


def max_input_length(config) -> int | None:
    """The longest input the model's position table allows (RoBERTa-style offsets counted), or None when it has
    no absolute positions."""
    names = ("max_position_embeddings", "n_positions", "n_ctx")
    positions = next((v for v in (getattr(config, n, None) for n in names) if isinstance(v, int) and v > 0), None)
    if positions is None:
        return None
    if getattr(config, "model_type", "").endswith("longformer") or "roberta" in getattr(config, "model_type", ""):
        return positions - (config.pad_token_id or 0) - 1
    return positions


def decoding_past_length(
    cache, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None, inputs_embeds, next_sequence_length
) -> int:
    """How many positions of the sequence (prompt and generated tokens) the cache has seen at one `generate` step.

    transformers (5.24 on) says how many positions are new (``next_sequence_length``); that is trusted over the
    cache's own length, which can also count positions that are not in the sequence: the prefix that PEFT's prefix
    tuning puts in the cache before the first step."""
    if cache is None:
        return 0
    if next_sequence_length is None:
        return cache.get_seq_length()
    if attention_mask is not None:
        total = attention_mask.shape[1]
    else:
        total = input_ids.shape[1] + (inputs_embeds.shape[1] if inputs_embeds is not None else 0)
    return total - next_sequence_length


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


def key_value_generation_inputs(
    model, input_ids, cache, attention_mask, inputs_embeds, use_cache: bool, next_sequence_length: int | None
) -> dict:
    """One `generate` step's inputs for a causal LM with a key/value cache (its ``prepare_inputs_for_generation``):
    with a cache (the default), only the tokens it has not seen; without, the whole sequence every step.
    ``attention_mask`` always covers the whole sequence. The cache goes under `GENERATION_CACHE_KEY`, where PEFT's
    prefix tuning finds it, and the positions it has seen are counted by `decoding_past_length`, which leaves out
    a prefix put in it before the first step."""
    past_length = decoding_past_length(
        cache if use_cache else None, input_ids, attention_mask, inputs_embeds, next_sequence_length
    )
    model_inputs = {"attention_mask": attention_mask, "use_cache": bool(use_cache)}
    if use_cache:
        model_inputs[GENERATION_CACHE_KEY] = cache
    model_inputs.update(
        decoding_step_inputs(input_ids, past_length, attention_mask, inputs_embeds, model.get_input_embeddings())
    )
    return model_inputs


@contextlib.contextmanager
def real_tensors_while_exporting():
    """Inside, tensor code runs on real tensors even while `torch.export` traces the model: what it computes (random
    blocks or rotations drawn from a seeded `torch.Generator`, which no exported graph can redraw) enters the graph
    as a constant. Outside an export it changes nothing."""
    if not torch.compiler.is_exporting():
        yield
        return
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing

    with disable_proxy_modes_tracing(), unset_fake_temporarily(), torch.no_grad():
        yield


def is_plain_linear(module: nn.Module) -> bool:
    """A `torch.nn.Linear` itself (not a LoRA or quantised wrapper, nor a subclass) with no forward hooks."""
    return type(module) is nn.Linear and not (module._forward_hooks or module._forward_pre_hooks)


# below this many input rows (tokens), `fused_projections` calls the projections one by one: concatenating the
# weights copies every one of them, which costs more than the wider product saves when it multiplies only a few rows
# (a decoding step)
FUSE_MIN_ROWS = 64


def fused_projections(hidden: torch.Tensor, *linears: nn.Module) -> tuple[torch.Tensor, ...]:
    """``tuple(linear(hidden) for linear in linears)``, computed as one matrix product when it can be.

    Several projections of the same input (query, key, value) cost less as one wide product than as separate
    narrow ones (forward and backward). The parameters stay separate
    modules, so checkpoints, LoRA targets and `from_pretrained` see the usual names. When a module is not a plain
    ``nn.Linear`` (a LoRA or quantised wrapper) or carries hooks, each one is called as usual; so they are when
    ``hidden`` holds fewer than `FUSE_MIN_ROWS` rows (decoding), where copying the weights into one matrix would
    cost more than the one product saves.
    """
    if len(linears) < 2 or not all(is_plain_linear(linear) for linear in linears):
        return tuple(linear(hidden) for linear in linears)
    # an exported graph takes the separate products: the choice would otherwise be a branch on the input's size
    if torch.compiler.is_exporting() or hidden.numel() < FUSE_MIN_ROWS * hidden.shape[-1]:
        return tuple(linear(hidden) for linear in linears)
    biases = [linear.bias for linear in linears]
    if any(bias is None for bias in biases) and not all(bias is None for bias in biases):
        return tuple(linear(hidden) for linear in linears)
    weight = torch.cat([linear.weight for linear in linears])
    bias = None if biases[0] is None else torch.cat(biases)
    return F.linear(hidden, weight, bias).split([linear.out_features for linear in linears], dim=-1)


__all__ = [
    "real_tensors_while_exporting",
    "FUSE_MIN_ROWS",
    "Dropout",
    "build_activation",
    "decoding_step_inputs",
    "key_value_generation_inputs",
    "find_first_real_token",
    "fused_projections",
    "is_plain_linear",
    "max_input_length",
]
