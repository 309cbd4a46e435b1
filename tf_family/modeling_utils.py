"""Small pieces of modeling code shared by several tf_family models."""

from __future__ import annotations

import functools
import importlib
import os

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN

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


class RemoteCodeMixin:
    """``save_pretrained(..., remote_code=True)``: save, then add the model's code to the folder
    (`tf_family.remote_code.export_remote_code`), so that plain transformers loads it with ``trust_remote_code=True``
    where tf_family is not installed. Listed first among the bases of every tf_family ``PreTrainedModel``, it is also
    where ``from_pretrained`` checks a local folder's files first (`tf_family.files.check_checkpoint_folder`)."""

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """transformers' ``from_pretrained``, after checking a local folder's ``config.json`` and safetensors files:
        a damaged or truncated file, or a shard named outside the folder, is a `ValueError` naming it."""
        if pretrained_model_name_or_path is not None and os.path.isdir(pretrained_model_name_or_path):
            check_checkpoint_folder(os.path.join(pretrained_model_name_or_path, kwargs.get("subfolder") or ""))
        return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)

    def save_pretrained(self, save_directory: str | os.PathLike, *args, remote_code: bool = False, **kwargs):
        super().save_pretrained(save_directory, *args, **kwargs)
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


__all__ = [
    "AdaptiveTokenEmbeddingsMixin",
    "FUSE_MIN_ROWS",
    "Dropout",
    "RemoteCodeMixin",
    "build_activation",
    "decoding_step_inputs",
    "find_first_real_token",
    "fused_projections",
    "is_plain_linear",
]
