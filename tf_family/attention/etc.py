"""Global-local attention of ETC (Ainslie et al. 2020, "ETC: Encoding Long and Structured Inputs in Transformers",
arXiv:2004.08483, section 3), with relative-position labels.

The input is two sequences in one tensor: ``G`` *global* tokens first, then ``T`` *long* tokens (``S = G + T`` rows).
Four pieces of attention (the paper's g2g, g2l, l2g, l2l):

- a global query attends to every global key and to every real long key (g2g and g2l, full);
- a long query attends to every global key (l2g, full) and to the real long keys within ``radius`` of it
  (l2l, ``|j - i| <= radius``, a token-level band).

Each (query, key) pair carries a relative label ``l``, and the score gains ``q . a_l / sqrt(Dh)`` with ``a_l`` a
learned per-head vector (`relative_keys`, ``(V, H, Dh)``: Shaw et al. 2018's relative keys, as ETC uses them). The
labels (our convention; ETC's reference orders the same position labels differently, which only permutes the table):

- g2g and l2l: ``clamp(j - i, -K, K) + K`` (``K`` = `EtcPattern.max_distance`), i.e. ``0 .. 2K``, positions counted
  inside each sequence (the global tokens relative to each other, the long tokens relative to each other);
- l2g: the one label ``2K + 1``; g2l: the one label ``2K + 2``. Without sentence structure (ETC's ``sentence_ids``)
  no long token belongs to one global token more than to another, so ETC's l2g / g2l "same sentence" label reduces
  to one constant label per direction.

`etc_attention` never materialises ``S x S``: the global rows are one dense ``(G, S)`` call, the long rows go in
chunks whose keys are the ``G`` global keys plus the chunk's band of long keys (the sliding window's key spans,
`sliding_window._KeySpans`), so time and memory grow as ``T * (G + chunk + 2 * radius)``. Its dense twin
(`etc_attention_reference`) builds the ``(B, S, S)`` mask (`build_etc_mask`) and labels (`build_etc_relative_labels`).

Conventions: tensors are ``(B, H, S, Dh)`` with the global rows first; ``long_valid`` is ``(B, T)`` bool, True at
real long tokens (global tokens are always real). A padded long query attends like a real one (the global keys keep
its row non-empty); its output is meaningless but finite.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .backend import attend, preferred_chunk
from .dense import dense_attention
from .sliding_window import _KeySpans, _unfold


@dataclass(frozen=True)
class EtcPattern:
    """The shape of ETC's attention.

    Attributes:
        num_global: global tokens ``G`` (the first ``G`` rows), at least 1.
        radius: one-sided long-to-long radius ``r`` (ETC's ``local_radius``), at least 0.
        max_distance: relative positions are clipped to ``[-K, K]`` (ETC's ``relative_pos_max_distance``), at least 0.
    """

    num_global: int
    radius: int
    max_distance: int

    def __post_init__(self) -> None:
        for name, low in (("num_global", 1), ("radius", 0), ("max_distance", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"EtcPattern.{name} must be an int >= {low}, got {value!r}.")

    @property
    def num_labels(self) -> int:
        """``V = 2K + 3``: the clipped relative positions, then the l2g and the g2l label."""
        return 2 * self.max_distance + 3

    @property
    def long_to_global_label(self) -> int:
        return 2 * self.max_distance + 1

    @property
    def global_to_long_label(self) -> int:
        return 2 * self.max_distance + 2


def _long_valid(long_valid: torch.Tensor | None, batch: int, length: int, device) -> torch.Tensor:
    if long_valid is None:
        return torch.ones(batch, length, dtype=torch.bool, device=device)
    if long_valid.shape != (batch, length):
        raise ValueError(f"long_valid must have shape {(batch, length)}, got {tuple(long_valid.shape)}.")
    return long_valid.to(torch.bool)


def _clipped_labels(offset: torch.Tensor, max_distance: int) -> torch.Tensor:
    """Label ``clamp(offset, -K, K) + K`` of a key ``offset`` positions after its query."""
    return offset.clamp(-max_distance, max_distance) + max_distance


# ------------------------------------------------------------------------------------------------ dense reference
def build_etc_relative_labels(pattern: EtcPattern, long_length: int, device=None) -> torch.Tensor:
    """``(S, S)`` long: the relative label of every (query, key) pair (the module's notes give the rule)."""
    num_global = pattern.num_global
    position = torch.arange(num_global + long_length, device=device)
    labels = _clipped_labels(position[None, :] - position[:, None], pattern.max_distance)  # (S, S)
    labels[num_global:, :num_global] = pattern.long_to_global_label
    labels[:num_global, num_global:] = pattern.global_to_long_label
    return labels


def build_etc_mask(pattern: EtcPattern, long_valid: torch.Tensor) -> torch.Tensor:
    """``(B, S, S)`` bool: which key each query attends to (global rows: every real key; long rows: every global key
    and the real long keys within the radius)."""
    batch, long_length = long_valid.shape
    num_global = pattern.num_global
    device = long_valid.device
    key_valid = torch.cat([torch.ones(batch, num_global, dtype=torch.bool, device=device), long_valid], dim=1)
    position = torch.arange(num_global + long_length, device=device)
    near = (position[None, :] - position[:, None]).abs() <= pattern.radius  # (S, S)
    is_global = position < num_global
    structure = is_global[:, None] | is_global[None, :] | near  # (S, S)
    return structure[None] & key_valid[:, None, :]  # (B, S, S)


def relative_key_bias(query: torch.Tensor, relative_keys: torch.Tensor) -> torch.Tensor:
    """``(B, H, S, V)``: each query's score against each label's relative key, scaled by ``1 / sqrt(Dh)`` (to be
    added to the scaled ``q . k`` scores)."""
    return torch.einsum("bhsd,vhd->bhsv", query, relative_keys.to(query.dtype)) * query.shape[-1] ** -0.5


def etc_attention_reference(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    relative_keys: torch.Tensor | None,
    pattern: EtcPattern,
    long_valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense twin of `etc_attention` (quadratic time and memory): ``(B, H, S, Dh)`` outputs and ``(B, H, S, S)``
    probabilities. ``relative_keys``: ``(V, H, Dh)`` or ``None`` (no relative term)."""
    batch, _, total, _ = query.shape
    long_length = total - pattern.num_global
    valid = _long_valid(long_valid, batch, long_length, query.device)
    allowed = build_etc_mask(pattern, valid)[:, None]  # (B, 1, S, S)
    bias = None
    if relative_keys is not None:
        labels = build_etc_relative_labels(pattern, long_length, query.device)  # (S, S)
        scores = relative_key_bias(query, relative_keys)  # (B, H, S, V)
        bias = scores.gather(-1, labels.expand(*scores.shape[:2], total, total))  # (B, H, S, S)
    return dense_attention(query, key, value, allowed, key_bias=bias)


# ------------------------------------------------------------------------------------------------------ fast path
def _global_rows(query, key, value, label_scores, pattern, key_valid, dropout_p, implementation) -> torch.Tensor:
    """The ``G`` global queries against all ``S`` keys (one dense ``(G, S)`` call): ``(B, H, G, Dh)``."""
    batch, heads, total, _ = key.shape
    num_global = pattern.num_global
    bias = None
    if label_scores is not None:
        # the global rows of `build_etc_relative_labels`, built alone (the whole table is S x S)
        position = torch.arange(num_global, device=key.device)
        to_global = _clipped_labels(position[None, :] - position[:, None], pattern.max_distance)  # (G, G)
        to_long = to_global.new_full((num_global, total - num_global), pattern.global_to_long_label)  # (G, T)
        labels = torch.cat([to_global, to_long], dim=1)  # (G, S)
        bias = label_scores[:, :, :num_global].gather(-1, labels.expand(batch, heads, num_global, total))
    allowed = key_valid[:, None, None, :]  # (B, 1, 1, S)
    return attend(query[:, :, :num_global], key, value, allowed, bias, dropout_p, implementation)[0]


def _long_rows(query, key, value, label_scores, pattern, long_valid, dropout_p, implementation) -> torch.Tensor:
    """The ``T`` long queries, chunk by chunk, against the global keys and their band of long keys:
    ``(B, H, T, Dh)``."""
    batch, heads, total, head_dim = query.shape
    num_global, radius = pattern.num_global, pattern.radius
    length = total - num_global
    long_query, long_key, long_value = (t[:, :, num_global:].transpose(1, 2) for t in (query, key, value))
    global_key, global_value = (t[:, :, :num_global].transpose(1, 2) for t in (key, value))  # (B, G, H, Dh)
    chunk = preferred_chunk(radius, long_query, long_key, long_value, dropout_p, implementation)
    if not torch.compiler.is_compiling():
        chunk = min(chunk, length)  # a short input attends in one piece of its own length
    num_chunks = -(-length // chunk)
    tail = num_chunks * chunk - length
    span = chunk + 2 * radius

    query_chunks = F.pad(long_query, (0, 0, 0, 0, 0, tail)).view(batch, num_chunks, chunk, heads, head_dim)
    query_chunks = query_chunks.transpose(2, 3).reshape(batch * num_chunks, heads, chunk, head_dim)
    key_spans = _KeySpans.apply(long_key, global_key, radius, radius + tail, span, chunk)  # (B*N, H, G + span, Dh)
    value_spans = _KeySpans.apply(long_value, global_value, radius, radius + tail, span, chunk)

    # key k of a chunk's span sits `k - radius - t` positions after the chunk's query t
    offset = (
        torch.arange(span, device=query.device)[None, :] - radius - torch.arange(chunk, device=query.device)[:, None]
    )
    band = offset.abs() <= radius  # (c, span)
    usable = _unfold(long_valid, radius, radius + tail, span, chunk)  # (B, N, span)
    allowed = band & usable[:, :, None, :]  # (B, N, c, span)
    see_global = torch.ones(batch, num_chunks, chunk, num_global, dtype=torch.bool, device=query.device)
    allowed = torch.cat([see_global, allowed], dim=-1).reshape(batch * num_chunks, 1, chunk, num_global + span)

    bias = None
    if label_scores is not None:
        scores = F.pad(label_scores[:, :, num_global:], (0, 0, 0, tail))  # (B, H, N*c, V)
        scores = scores.view(batch, heads, num_chunks, chunk, -1)
        labels = _clipped_labels(offset.clamp(-radius, radius), pattern.max_distance)  # (c, span)
        band_bias = scores.gather(-1, labels.expand(batch, heads, num_chunks, chunk, span))
        global_bias = scores[..., pattern.long_to_global_label, None].expand(-1, -1, -1, -1, num_global)
        bias = torch.cat([global_bias, band_bias], dim=-1)  # (B, H, N, c, G + span)
        bias = bias.transpose(1, 2).reshape(batch * num_chunks, heads, chunk, num_global + span)

    out = attend(query_chunks, key_spans, value_spans, allowed, bias, dropout_p, implementation)[0]  # (B*N, H, c, Dh)
    out = out.view(batch, num_chunks, heads, chunk, head_dim).transpose(1, 2)
    return out.reshape(batch, heads, num_chunks * chunk, head_dim)[:, :, :length]


def etc_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    relative_keys: torch.Tensor | None,
    pattern: EtcPattern,
    long_valid: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    implementation: str | None = "sdpa",
) -> torch.Tensor:
    """ETC's global-local attention in time and memory linear in the long length ``T``.

    Eight parameters: the three tensors, the relative keys, the pattern and the padding (the dense twin's six),
    then the dispatch: dropout and the implementation.

    Args:
        query, key, value: ``(B, H, S, Dh)``, the ``G`` global rows first, then the ``T`` long rows.
        relative_keys: ``(V, H, Dh)`` learned relative keys (``V = pattern.num_labels``), or ``None``.
        pattern: global length, radius, clipping distance.
        long_valid: ``(B, T)`` bool/0-1, True at real long tokens (``None``: nothing padded).
        dropout_p: dropout on the attention probabilities.
        implementation: how each piece attends (`backend.attend`: ``"sdpa"``, ``"eager"``; with a relative term,
            the CPU kernels' calls stay on PyTorch's SDPA; ``"flex_attention"`` is PyTorch's SDPA here).

    Returns:
        ``(B, H, S, Dh)``, equal to `etc_attention_reference` up to float rounding.
    """
    batch, heads, total, _ = query.shape
    num_global = pattern.num_global
    if total <= num_global:
        raise ValueError(f"etc_attention needs long rows after the {num_global} global rows, got {total} rows.")
    if relative_keys is not None and relative_keys.shape[:2] != (pattern.num_labels, heads):
        raise ValueError(
            f"relative_keys must have shape ({pattern.num_labels}, {heads}, Dh) for this pattern, got "
            f"{tuple(relative_keys.shape)}."
        )
    long_valid = _long_valid(long_valid, batch, total - num_global, query.device)
    global_valid = torch.ones(batch, num_global, dtype=torch.bool, device=query.device)
    key_valid = torch.cat([global_valid, long_valid], dim=1)  # (B, S)
    label_scores = None if relative_keys is None else relative_key_bias(query, relative_keys)  # (B, H, S, V)
    global_out = _global_rows(query, key, value, label_scores, pattern, key_valid, dropout_p, implementation)
    long_out = _long_rows(query, key, value, label_scores, pattern, long_valid, dropout_p, implementation)
    return torch.cat([global_out, long_out], dim=2)


__all__ = [
    "EtcPattern",
    "build_etc_mask",
    "build_etc_relative_labels",
    "etc_attention",
    "etc_attention_reference",
    "relative_key_bias",
]
