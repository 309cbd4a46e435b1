"""Adaptive attention span (Sukhbaatar et al. 2019, arXiv:1905.07799) for Transformer-XL's relative attention: a
learned span per head, the soft ramp mask on the attention weights (renormalised), and the key range trimmed to what
the spans reach. Reimplemented from the paper's equations (the authors' code is CC-BY-NC and was not read).

* `AdaptiveSpan`: the per-head span parameter and the mask it makes (`tf_family.attention.adaptive_span`).
* `AdaptiveSpanAttention`: `RelativeMultiHeadAttention` with that mask; it reads as many of the most recent keys as
  its caller gives it (the model trims its memory to `AdaptiveSpan.key_limit`), and within the segment each chunk of
  queries reads only the keys its spans reach (`AdaptiveSpanAttention.banded_attention`; the dense twin is
  `dense_attention`), so the saving is real in time and memory.

The span in range, without a call the user must remember. The parameter ``span`` is the fraction ``z / S`` of the
largest span ``S``. Two things keep it in ``[0, 1]``:

1. every use reads ``span + (clamp(span, 0, 1) - span).detach()``: the value is always the clamped one (also in
   eval, in a model just loaded, or between an optimiser step and the next forward), while the gradient is the
   identity, so it flows at the boundary too: a span at 0 whose loss gradient says "longer" gets that gradient
   (a plain ``clamp`` would give it 0 there, and a sigmoid parametrisation would shrink it near both ends and change
   the L1 penalty's constant pull);
2. in training, each forward first clamps the parameter itself in place (under ``torch.no_grad``), so it never
   drifts more than one optimiser step out of range: this is the paper's "clamp after every step" (projected
   gradient descent), applied at the next use of the parameter rather than by a call after ``optimizer.step()``.
   The parameter is never saved for backward (the mask is affine in it before the clamp), so the in-place clamp
   does not invalidate a graph still waiting for its backward pass.

A saved state dict always holds the clamped value (a state-dict hook), so a checkpoint never holds a span out of
range.
"""

from __future__ import annotations

import torch
from torch import nn

from ..attention import attend, relative_position_scores
from ..attention.adaptive_span import segment_distances, span_key_limit, span_log_mask
from .relative_attention import _ATTENTION_FIELDS, RelativeAttentionInputs, RelativeMultiHeadAttention


class AdaptiveSpan(nn.Module):
    """The learned spans of ``n_head`` heads and the soft mask they make.

    Args:
        n_head: heads H.
        max_span: ``S``, the largest span in tokens.
        ramp: ``R``, the width of the mask's linear ramp in tokens.
        init: initial ``z / S`` of every head, in ``[0, 1]``.
    """

    def __init__(self, n_head: int, max_span: int, ramp: int, init: float):
        super().__init__()
        self.max_span, self.ramp, self.init = max_span, ramp, init
        self.span = nn.Parameter(torch.full((n_head,), float(init)))  # z / S per head
        self.register_state_dict_post_hook(_save_clamped)

    def fractions(self) -> torch.Tensor:
        """``(H,)`` ``z / S`` clamped to ``[0, 1]`` in value, with the identity's gradient (see the module
        docstring)."""
        span = self.span
        return span + (span.detach().clamp(0, 1) - span.detach())

    def spans(self) -> torch.Tensor:
        """``(H,)`` spans ``z`` in tokens (``fractions() * S``)."""
        return self.fractions() * self.max_span

    @torch.no_grad()
    def clamp_(self) -> None:
        """Put the parameter back in ``[0, 1]`` (done by every training forward; callable by hand too)."""
        self.span.clamp_(0, 1)

    def key_limit(self, multiple: int) -> int:
        """How many of the most recent memory slots these spans reach, rounded up to ``multiple``
        (`tf_family.attention.adaptive_span.span_key_limit`; reads one number from the device)."""
        return span_key_limit(float(self.spans().detach().max()), self.ramp, multiple)

    def forward(self, query_length: int, key_length: int, device: torch.device) -> torch.Tensor:
        """``(H, T, S)`` log mask for ``T`` queries that are the last of ``S`` keys; clamps the parameter first in
        training."""
        if self.training:
            self.clamp_()
        distances = segment_distances(query_length, key_length, device)  # (T, S)
        return span_log_mask(distances, self.spans(), self.ramp)  # (H, T, S)


def _save_clamped(module: AdaptiveSpan, state_dict: dict, prefix: str, local_metadata: dict) -> None:
    """State-dict hook: a span out of range (an optimiser step since the last forward) is saved clamped. A span in
    range is left as the object it is (a ``keep_vars=True`` caller gets the parameter); a meta or wrapped tensor
    (loading, sharding) is left alone."""
    value = state_dict.get(prefix + "span")
    if type(value) not in (torch.Tensor, nn.Parameter) or value.is_meta:
        return
    with torch.no_grad():
        if bool(((value < 0) | (value > 1)).any()):
            state_dict[prefix + "span"] = value.detach().clamp(0, 1)


class AdaptiveSpanAttention(RelativeMultiHeadAttention):
    """Transformer-XL's relative attention with a learned span per head (``adaptive_span``, an `AdaptiveSpan`).

    The log of the span mask is added to the scores (equal to masking the softmax weights and renormalising,
    `tf_family.attention.adaptive_span`). The keys are the last ``S'`` of what ``inputs`` describes: a caller that
    trims the memory to `AdaptiveSpan.key_limit` slots gets the same output as with the whole memory (the trimmed
    keys have weight 0), and attention maps (``output_attentions``) still come back over all ``S`` keys.

    Args: those of `RelativeMultiHeadAttention`, then ``max_span`` (``S``), ``ramp`` (``R``) and ``span_init``
    (the initial ``z / S``), by keyword.
    """

    def __init__(self, *args, max_span: int, ramp: int, span_init: float, **kwargs):
        super().__init__(*args, **kwargs)
        self.adaptive_span = AdaptiveSpan(self.num_heads, max_span, ramp, span_init)

    @classmethod
    def from_config(cls, config) -> AdaptiveSpanAttention:
        """The attention a Transformer-XL config with ``adaptive_span_*`` fields describes."""
        return cls(
            **{name: getattr(config, name) for name in _ATTENTION_FIELDS},
            max_span=config.adaptive_span_max,
            ramp=config.adaptive_span_ramp,
            span_init=config.adaptive_span_init,
        )

    band_multiple = 32  # the band's reach is rounded up to this many keys, so its shapes change only in steps
    banded: bool | None = None  # None: banded where it reads fewer keys; False: the dense twin; True: banded

    def local_attention(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, inputs: RelativeAttentionInputs
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """As `RelativeMultiHeadAttention.local_attention`, with the span mask, over the last ``S'`` keys of
        ``inputs`` (``S' = key.shape[-2]``). Banded (`banded_attention`) where that reads fewer keys and no attention
        map is asked for; the dense twin (`dense_attention`) otherwise. ``self.banded``: None chooses so, False
        always takes the dense twin, True the banded path (except for attention maps)."""
        full_length, key_length = inputs.allowed.shape[-1], key.shape[-2]
        trimmed = inputs
        if key_length != full_length:
            # the last S' distances (the embedding runs from distance S - 1 down to 0) and the last S' keys' mask
            trimmed = RelativeAttentionInputs(
                position_embedding=inputs.position_embedding[-key_length:],
                allowed=inputs.allowed[..., -key_length:],
                shared_biases=inputs.shared_biases,
                output_attentions=inputs.output_attentions,
                implementation=inputs.implementation,
            )
        if not inputs.output_attentions and self.banded is not False:
            reach = self.adaptive_span.key_limit(self.band_multiple)
            if self.banded or 2 * reach < key_length:
                return self.banded_attention(query, key, value, trimmed, reach), None
        attended, probs = self.dense_attention(query, key, value, trimmed)
        if probs is not None and key_length != full_length:
            probs = nn.functional.pad(probs, (full_length - key_length, 0))  # (B, H, T, S): 0 beyond the span
        return attended, probs

    def dense_attention(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, inputs: RelativeAttentionInputs
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Every query against every key of ``inputs`` (the queries are the last ``T`` of the ``S'`` keys), the span
        mask's log added to the scores: ``(B, H, T, Dh)`` and, with ``inputs.output_attentions``, the probabilities
        ``(B, H, T, S')``. The dense twin of `banded_attention`."""
        bias, content_bias = self.position_scores(query, inputs)  # (B, H, T, S')
        log_mask = self.adaptive_span(query.shape[-2], key.shape[-2], query.device)  # (H, T, S')
        return attend(
            query + content_bias[:, None, :].to(query.dtype),
            key,
            value,
            None,
            (bias + log_mask.to(bias.dtype)).to(query.dtype),
            self.attention_dropout.p if self.training else 0.0,
            "eager" if inputs.output_attentions else inputs.implementation,
        )  # (B, H, T, Dh), (B, H, T, S') or None

    def banded_attention(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        inputs: RelativeAttentionInputs,
        reach: int,
    ) -> torch.Tensor:
        """`dense_attention`'s output ``(B, H, T, Dh)``, reading for each query only the ``reach`` keys behind it
        (and the chunk's own): the queries go in chunks of ``reach``, each against the ``2 * reach`` keys that end
        at its last query, so time and memory scale with ``T * reach`` instead of ``T * S'``.

        Exact where ``reach`` covers the spans (`AdaptiveSpan.key_limit`): a key at distance ``>= z + R`` has weight
        0 in the dense twin, so leaving it out changes neither the output nor a gradient. Each chunk is the dense
        problem on its window (its queries are the window's last ones), so the relative positions are the last rows
        of the distance embedding. A query none of whose keys in the window is allowed (padding) attends uniformly
        over the window rather than over every key; its output is not used.
        """
        query_length, key_length = query.shape[-2], key.shape[-2]
        memory_length = key_length - query_length
        position_keys = self.position_proj(inputs.position_embedding)  # (S', H*Dh), projected once per call
        content_bias, position_bias = inputs.shared_biases or (self.content_bias, self.position_bias)
        content_query = query + content_bias[:, None, :].to(query.dtype)  # the content term's u folded in
        chunk = max(reach, 1)
        outputs = []
        for start in range(0, query_length, chunk):
            stop = min(start + chunk, query_length)
            key_stop = memory_length + stop
            key_start = max(key_stop - (stop - start) - reach, 0)
            window = key_stop - key_start
            keys_of_window = position_keys[-window:].view(window, self.num_heads, self.head_dim).transpose(0, 1)
            position = relative_position_scores(
                query[..., start:stop, :], keys_of_window, position_bias
            )  # (B, H, C, K)
            allowed = inputs.allowed[..., start:stop, key_start:key_stop]  # (B or 1, 1, C, K)
            bias = (position * self.scale).masked_fill(~allowed, torch.finfo(position.dtype).min)
            log_mask = self.adaptive_span(stop - start, window, query.device)  # (H, C, K)
            attended, _ = attend(
                content_query[..., start:stop, :],
                key[..., key_start:key_stop, :],
                value[..., key_start:key_stop, :],
                None,
                (bias + log_mask.to(bias.dtype)).to(query.dtype),
                self.attention_dropout.p if self.training else 0.0,
                inputs.implementation,
            )  # (B, H, C, Dh)
            outputs.append(attended)
        return torch.cat(outputs, dim=-2)  # (B, H, T, Dh)


__all__ = ["AdaptiveSpan", "AdaptiveSpanAttention"]
