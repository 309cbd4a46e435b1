"""Kernelised (linear-time) attention: feature maps, non-causal and causal attention, and the recurrent step.

Softmax attention ``softmax(q k^T) v`` is replaced by ``phi(q) (phi(k)^T v) / phi(q) (phi(k)^T 1)`` for a feature
map ``phi`` with ``F`` features, so the cost is ``O(T F Dh)`` instead of ``O(T S Dh)``:

- `elu_features`: ``elu(x) + 1`` (the Linear Transformer, Katharopoulos et al. 2020, arXiv:2006.16236);
- `favor_query_features` / `favor_key_features` / `favor_causal_key_features`: FAVOR+ positive random features
  ``exp(w x - |x|^2 / 2) / sqrt(F)`` of ``x = d^-1/4 q`` (Performer, Choromanski et al. 2021, arXiv:2009.14794), an
  unbiased estimate of ``exp(q k / sqrt(d))``; rows of ``w`` from `draw_random_projection` (orthogonal blocks or
  i.i.d. Gaussian);
- `random_fourier_features`: ``[sin(w x), cos(w x)] / sqrt(F)`` of the l2-normalised ``x`` (Random Feature
  Attention, Peng et al. 2021, arXiv:2103.02143), an estimate of the Gaussian kernel of unit vectors.

The attentions take features (computed by the caller), never a feature map name:

- `linear_attention` (non-causal) and its dense twin `linear_attention_reference`;
- `causal_linear_attention`: prefix sums computed chunk by chunk (a chunk's own keys as a small dense block, earlier
  chunks through the carried state), with an optional per-position decay (RFA-Gate's ``g``), starting from and
  returning the recurrent state ``(sum phi(k) v^T, sum phi(k))``; its dense twin `causal_linear_attention_reference`
  builds the ``(T, T)`` weight matrix. One new token with a state is the recurrent step of generation.

Everything is computed in float32 (prefix sums over thousands of positions lose their low bits in bfloat16 / float16)
and the result is cast back to the values' dtype.

Shapes: ``B`` batch, ``H`` heads, ``T`` query length, ``S`` key length, ``Dh`` head width, ``F`` features.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

FAVOR_EPS = 1e-4  # added to every FAVOR+ feature (performer-pytorch's and the JAX reference's numerical floor)
DENOMINATOR_EPS = 1e-6  # normalisers with a smaller magnitude are replaced by it (no division by ~0)


class LinearAttentionState(NamedTuple):
    """The recurrent state of causal kernelised attention after some positions: ``kv = sum_s w_s phi(k_s) v_s^T``
    ``(B, H, F, Dh)`` and ``normalizer = sum_s w_s phi(k_s)`` ``(B, H, F)`` (float32; ``w_s`` the decay products of
    RFA-Gate, 1 without a gate)."""

    kv: torch.Tensor
    normalizer: torch.Tensor


# ------------------------------------------------------------------------------------------------------ projections
def draw_random_projection(
    num_features: int, head_dim: int, generator: torch.Generator, orthogonal: bool = True
) -> torch.Tensor:
    """``(F, Dh)`` Gaussian random projection: i.i.d. ``N(0, 1)`` rows, or (``orthogonal``) blocks of ``Dh``
    exactly orthogonal rows (QR of a Gaussian matrix) whose norms are redrawn from the chi distribution of a Gaussian
    row (performer-pytorch's ``gaussian_orthogonal_random_matrix(scaling=0)``, the paper's ORF), so each row is still
    marginally ``N(0, I)``. Drawn from ``generator`` only (no global RNG), in float32 on the CPU."""
    if num_features <= 0 or head_dim <= 0:
        raise ValueError(f"num_features and head_dim must be > 0, got {num_features} and {head_dim}.")
    if not orthogonal:
        return torch.randn(num_features, head_dim, generator=generator)
    blocks = []
    for _ in range(math.ceil(num_features / head_dim)):
        gaussian = torch.randn(head_dim, head_dim, generator=generator)
        q, r = torch.linalg.qr(gaussian)
        # signs of R's diagonal folded into Q: Q is then Haar-distributed (LAPACK's Q alone is not, and its rows
        # are not isotropic, which biases the estimate)
        q = q * torch.sign(torch.diagonal(r))[None, :]
        blocks.append(q.T)  # rows orthonormal
    rows = torch.cat(blocks)[:num_features]  # (F, Dh)
    norms = torch.randn(num_features, head_dim, generator=generator).norm(dim=1)  # (F,)
    return rows * norms[:, None]


# ---------------------------------------------------------------------------------------------------- feature maps
def elu_features(x: torch.Tensor) -> torch.Tensor:
    """``elu(x) + 1`` (positive), in float32: ``(..., Dh) -> (..., Dh)``."""
    return F.elu(x.float()) + 1.0


def _favor_projection(x: torch.Tensor, projection: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w x'`` ``(B, H, T, F)`` and ``|x'|^2 / 2`` ``(B, H, T, 1)`` for ``x' = Dh^-1/4 x``, float32."""
    x = x.float() * x.shape[-1] ** -0.25
    projected = torch.einsum("bhtd,fd->bhtf", x, projection.float())  # (B, H, T, F)
    return projected, x.pow(2).sum(-1, keepdim=True) / 2


def _favor_from_projection(
    projected: torch.Tensor, half_norm: torch.Tensor, stabilizer: torch.Tensor | float
) -> torch.Tensor:
    return (torch.exp(projected - half_norm - stabilizer) + FAVOR_EPS) * projected.shape[-1] ** -0.5


def favor_query_features(query: torch.Tensor, projection: torch.Tensor) -> torch.Tensor:
    """FAVOR+ features of queries ``(B, H, T, Dh) -> (B, H, T, F)``, each row stabilised by its own max of ``w x'``
    (a factor per query that cancels between numerator and normaliser; the references' convention)."""
    projected, half_norm = _favor_projection(query, projection)
    return _favor_from_projection(projected, half_norm, projected.amax(dim=-1, keepdim=True).detach())


def favor_key_features(
    key: torch.Tensor, projection: torch.Tensor, key_valid: torch.Tensor | None = None
) -> torch.Tensor:
    """FAVOR+ features of keys ``(B, H, S, Dh) -> (B, H, S, F)`` for non-causal attention, stabilised by one max of
    ``w x'`` per (batch, head) over the real keys (``key_valid`` ``(B, S)``; padding neither sets it nor gets
    features: its rows are zero). Never a max over the batch, which would couple the rows of a batch."""
    projected, half_norm = _favor_projection(key, projection)
    if key_valid is None:
        stabilizer = projected.amax(dim=(-1, -2), keepdim=True)
    else:
        valid = key_valid[:, None, :, None]
        stabilizer = projected.masked_fill(~valid, float("-inf")).amax(dim=(-1, -2), keepdim=True)
        stabilizer = stabilizer.clamp_min(torch.finfo(projected.dtype).min)  # a row without any real key
    features = _favor_from_projection(projected, half_norm, stabilizer.detach())
    return features if key_valid is None else mask_key_features(features, key_valid)


def favor_causal_key_features(key: torch.Tensor, projection: torch.Tensor) -> torch.Tensor:
    """FAVOR+ features of keys for causal attention and generation: ``exp(w x' - |x'|^2 / 2 - c) / sqrt(F)`` with
    the data-independent bound ``c = max_f |w_f|^2 / 2`` of the exponent (``w x - |x|^2 / 2 <= |w|^2 / 2``: no
    overflow), and without the ``+eps``. A key's features then do not depend on later keys (a max over the sequence
    would leak them through the ``+eps``), a cached state equals the full forward, and ``c`` cancels exactly between
    numerator and normaliser. The ``+eps`` is left out because next to ``exp(-c)``-sized features it would dominate
    them and bias the estimate towards uniform attention; the queries keep theirs, so normalisers stay positive."""
    projected, half_norm = _favor_projection(key, projection)
    bound = projection.float().pow(2).sum(-1).amax(dim=0) / 2  # (an explicit dim: ONNX needs one)
    return torch.exp(projected - half_norm - bound) * projected.shape[-1] ** -0.5


def random_fourier_features(
    x: torch.Tensor, projection: torch.Tensor, scale: torch.Tensor | None = None
) -> torch.Tensor:
    """RFA's random Fourier features ``[sin(w x'), cos(w x')] / sqrt(F)`` of ``x' = scale * x / |x|`` (``scale``
    ``(H,)``: a learned inverse kernel width per head, or 1): ``(B, H, T, Dh) -> (B, H, T, 2 F)`` for a projection
    of ``F`` rows; ``phi(x) . phi(y)`` estimates ``exp(-|x' - y'|^2 / 2)``."""
    x = F.normalize(x.float(), dim=-1)
    if scale is not None:
        x = x * scale.float()[None, :, None, None]
    projected = torch.einsum("bhtd,fd->bhtf", x, projection.float())  # (B, H, T, F)
    return torch.cat([projected.sin(), projected.cos()], dim=-1) * projection.shape[0] ** -0.5


def mask_key_features(features: torch.Tensor, key_valid: torch.Tensor) -> torch.Tensor:
    """Zero the features of padded keys (``key_valid`` ``(B, S)``): they then add nothing to any sum. A ``where``,
    not a product, so that a non-finite value at a padded position cannot leak."""
    return torch.where(key_valid[:, None, :, None], features, torch.zeros((), dtype=features.dtype))


def _divide(numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    """``numerator / denominator[..., None]`` with denominators of magnitude below `DENOMINATOR_EPS` replaced by it
    (a query with no real key gets 0; random Fourier features can sum to about 0)."""
    safe = torch.where(denominator.abs() < DENOMINATOR_EPS, DENOMINATOR_EPS, denominator)
    return numerator / safe[..., None]


# ------------------------------------------------------------------------------------------------------ non-causal
def linear_attention(query_features: torch.Tensor, key_features: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """Non-causal kernelised attention: ``(B, H, T, F), (B, H, S, F), (B, H, S, Dh) -> (B, H, T, Dh)``. Padded keys
    must already have zero features (`mask_key_features`)."""
    kv = torch.einsum("bhsf,bhsd->bhfd", key_features, value.float())  # (B, H, F, Dh)
    numerator = torch.einsum("bhtf,bhfd->bhtd", query_features, kv)  # (B, H, T, Dh)
    denominator = torch.einsum("bhtf,bhf->bht", query_features, key_features.sum(dim=2))  # (B, H, T)
    return _divide(numerator, denominator).to(value.dtype)


def linear_attention_weights(query_features: torch.Tensor, key_features: torch.Tensor) -> torch.Tensor:
    """The ``(B, H, T, S)`` attention matrix kernelised attention implies (rows sum to 1): what
    ``output_attentions=True`` returns; quadratic."""
    scores = torch.einsum("bhtf,bhsf->bhts", query_features, key_features)  # (B, H, T, S)
    return _divide(scores, scores.sum(-1))


def linear_attention_reference(
    query_features: torch.Tensor, key_features: torch.Tensor, value: torch.Tensor
) -> torch.Tensor:
    """Dense twin of `linear_attention`: the explicit ``(T, S)`` weights times the values."""
    weights = linear_attention_weights(query_features, key_features)
    return torch.einsum("bhts,bhsd->bhtd", weights, value.float()).to(value.dtype)


# ---------------------------------------------------------------------------------------------------------- causal
def empty_state(batch: int, heads: int, num_features: int, head_dim: int, device=None) -> LinearAttentionState:
    """The state before any position: zeros, float32."""
    return LinearAttentionState(
        torch.zeros(batch, heads, num_features, head_dim, device=device),
        torch.zeros(batch, heads, num_features, device=device),
    )


def causal_linear_attention(
    query_features: torch.Tensor,
    key_features: torch.Tensor,
    value: torch.Tensor,
    log_decay: torch.Tensor | None = None,
    state: LinearAttentionState | None = None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, LinearAttentionState]:
    """Causal kernelised attention by prefix sums, chunk by chunk, from (and returning) the recurrent state.

    Position ``t`` reads ``S_t = g_t S_{t-1} + phi(k_t) v_t^T`` and ``z_t = g_t z_{t-1} + phi(k_t)``:
    ``out_t = phi(q_t) S_t / phi(q_t) z_t``. ``log_decay`` ``(B, H, T)``: ``log g_t <= 0`` (RFA-Gate; ``None``: no
    decay, the Linear Transformer's and Performer's prefix sums); RFA-Gate's ``(1 - g_t)`` on the new term is the
    caller's, folded into ``key_features``. Within a chunk the weights are a ``(C, C)`` lower-triangular block of
    decay ratios ``exp(G_t - G_s) <= 1``; earlier chunks arrive through the state, so memory is ``O(T F Dh / C)``
    and the decays never overflow. Shapes ``(B, H, T, F), (B, H, T, F), (B, H, T, Dh) -> (B, H, T, Dh)``; float32
    inside. With one position and a state, this is generation's recurrent step."""
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be > 0, got {chunk_size}.")
    batch, heads, length, num_features = key_features.shape
    if state is None:
        state = empty_state(batch, heads, num_features, value.shape[-1], value.device)
    kv, normalizer = state.kv.float(), state.normalizer.float()
    values = value.float()
    outputs = []
    for start in range(0, length, chunk_size):
        end = min(start + chunk_size, length)
        q, k, v = query_features[:, :, start:end], key_features[:, :, start:end], values[:, :, start:end]
        size = end - start
        lower = torch.ones(size, size, dtype=torch.bool, device=q.device).tril()
        if log_decay is None:
            weights = lower.float()  # (C, C)
            carried = q  # (B, H, C, F): phi(q_t), the state undecayed
            kept_total = None
        else:
            cumulative = log_decay[:, :, start:end].float().cumsum(-1)  # (B, H, C): G_t within the chunk
            ratio = cumulative[..., :, None] - cumulative[..., None, :]  # (B, H, C, C): G_t - G_s
            weights = torch.where(lower, ratio, float("-inf")).exp()
            carried = q * cumulative.exp()[..., None]  # the state decays by exp(G_t) before position t
            kept_total = cumulative[..., -1].exp()  # (B, H)
        scores = torch.einsum("bhtf,bhsf->bhts", q, k) * weights  # (B, H, C, C)
        numerator = torch.einsum("bhts,bhsd->bhtd", scores, v) + torch.einsum("bhtf,bhfd->bhtd", carried, kv)
        denominator = scores.sum(-1) + torch.einsum("bhtf,bhf->bht", carried, normalizer)
        outputs.append(_divide(numerator, denominator))
        if kept_total is None:
            kv = kv + torch.einsum("bhsf,bhsd->bhfd", k, v)
            normalizer = normalizer + k.sum(dim=2)
        else:
            to_end = (cumulative[..., -1:] - cumulative).exp()[..., None]  # (B, H, C, 1): exp(G_end - G_s)
            kv = kept_total[..., None, None] * kv + torch.einsum("bhsf,bhsd->bhfd", k * to_end, v)
            normalizer = kept_total[..., None] * normalizer + (k * to_end).sum(dim=2)
    out = torch.cat(outputs, dim=2) if outputs else values.new_zeros(values.shape)
    return out.to(value.dtype), LinearAttentionState(kv, normalizer)


def causal_linear_attention_weights(
    query_features: torch.Tensor, key_features: torch.Tensor, log_decay: torch.Tensor | None = None
) -> torch.Tensor:
    """The ``(B, H, T, T)`` lower-triangular attention matrix of causal kernelised attention (rows sum to 1; with a
    decay, weight ``exp(G_t - G_s)`` on key ``s``): the dense twin's weights, and ``output_attentions``."""
    length = query_features.shape[2]
    scores = torch.einsum("bhtf,bhsf->bhts", query_features, key_features)  # (B, H, T, T)
    lower = torch.ones(length, length, dtype=torch.bool, device=scores.device).tril()
    if log_decay is not None:
        cumulative = log_decay.float().cumsum(-1)
        scores = scores * torch.where(lower, cumulative[..., :, None] - cumulative[..., None, :], float("-inf")).exp()
    scores = scores.masked_fill(~lower, 0.0)
    return _divide(scores, scores.sum(-1))


def causal_linear_attention_reference(
    query_features: torch.Tensor,
    key_features: torch.Tensor,
    value: torch.Tensor,
    log_decay: torch.Tensor | None = None,
) -> torch.Tensor:
    """Dense twin of `causal_linear_attention` (from an empty state): explicit weights times values."""
    weights = causal_linear_attention_weights(query_features, key_features, log_decay)
    return torch.einsum("bhts,bhsd->bhtd", weights, value.float()).to(value.dtype)


__all__ = [
    "DENOMINATOR_EPS",
    "FAVOR_EPS",
    "LinearAttentionState",
    "causal_linear_attention",
    "causal_linear_attention_reference",
    "causal_linear_attention_weights",
    "draw_random_projection",
    "elu_features",
    "empty_state",
    "favor_causal_key_features",
    "favor_key_features",
    "favor_query_features",
    "linear_attention",
    "linear_attention_reference",
    "linear_attention_weights",
    "mask_key_features",
    "random_fourier_features",
]
