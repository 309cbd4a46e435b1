// Fused masked softmax attention with dropout for CPU training: tf_family's native kernel.
//
// Every (batch, head) pair is one tile: scores = q k^T * scale, masked, softmaxed, dropped out and multiplied by v,
// all while the tile's (T, S) scores stay in the core's cache. The unfused path (`_MaskedAttention` in dropout.py)
// runs each of these steps as a pass over the whole (..., T, S) tensor in memory, which on a 2-core machine costs
// about as much as the matrix products themselves.
//
// Dropout draws no random numbers ahead of time: element i of a call keeps its probability when a hash of
// (seed, i) is at least a threshold, so the backward regenerates the same mask from the seed; besides the inputs,
// only each row's log-sum-exp is saved. Tiles are independent, so the result does not depend on the number of
// threads.
//
// The products go through the BLAS that PyTorch itself links (sgemm_/dgemm_, exported by libtorch_cpu), single-
// threaded inside the tile loop, which at::parallel_for spreads over the cores.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include "blas.h"
#include "softmax.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

using tf_family::exp_nonpositive;
using tf_family::gemm_rm;

// 64-bit finaliser of MurmurHash3: a bijection that mixes every input bit into every output bit.
inline uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

// keep[j] = 1 for the kept elements among flat indices [first, first + count) of a call seeded with `seed`. One hash
// gives two 32-bit draws (elements 2i and 2i + 1); the element is kept when its draw is >= threshold.
inline void keep_row(uint64_t seed, int64_t first, int64_t count, uint32_t threshold, uint8_t* keep) {
  const uint64_t key = mix64(seed ^ 0x9e3779b97f4a7c15ULL);
  int64_t j = 0;
  if (first & 1) {  // odd start: the high half of the pair that began one element earlier
    const uint64_t h = mix64(key + static_cast<uint64_t>(first >> 1));
    keep[0] = static_cast<uint32_t>(h >> 32) >= threshold;
    j = 1;
  }
  const int64_t pair0 = (first + j) >> 1;
  const int64_t pairs = (count - j) >> 1;
  for (int64_t i = 0; i < pairs; ++i) {
    const uint64_t h = mix64(key + static_cast<uint64_t>(pair0 + i));
    keep[j + 2 * i] = static_cast<uint32_t>(h) >= threshold;
    keep[j + 2 * i + 1] = static_cast<uint32_t>(h >> 32) >= threshold;
  }
  if (j + 2 * pairs < count) {
    const uint64_t h = mix64(key + static_cast<uint64_t>(pair0 + pairs));
    keep[count - 1] = static_cast<uint32_t>(h) >= threshold;
  }
}

struct Geometry {
  int64_t heads, T, S, D;
  // mask strides in elements (0 where broadcast) for dims (outer, head, query row); the key dim has stride 1
  int64_t m_outer, m_head, m_row;
  bool has_mask;
};

// Rows [r0, r0 + rows) of a tile's probabilities softmax(q k^T * scale) under the mask, written to `probs`
// (rows x S). Forward: computes each row's log-sum-exp into `lse`; backward: recomputes the same probabilities from
// the saved `lse`.
template <typename scalar_t>
void tile_probs(const Geometry& g, int64_t tile, int64_t r0, int64_t rows, const scalar_t* q, const scalar_t* k,
                const uint8_t* mask, scalar_t* probs, scalar_t* lse, bool recompute) {
  const int64_t T = g.T, S = g.S, D = g.D;
  const scalar_t scale = static_cast<scalar_t>(1.0 / std::sqrt(static_cast<double>(D)));
  gemm_rm<scalar_t>(false, true, rows, S, D, scale, q + (tile * T + r0) * D, D, k + tile * S * D, D, scalar_t(0),
                    probs, S);
  const uint8_t* mask_tile = g.has_mask ? mask + (tile / g.heads) * g.m_outer + (tile % g.heads) * g.m_head : nullptr;
  const scalar_t neg_inf = -std::numeric_limits<scalar_t>::infinity();
  for (int64_t t = 0; t < rows; ++t) {
    scalar_t* row = probs + t * S;
    const uint8_t* allowed = mask_tile ? mask_tile + (r0 + t) * g.m_row : nullptr;
    if (recompute) {
      const scalar_t shift = lse[r0 + t];
      if (allowed) {
#pragma omp simd
        for (int64_t j = 0; j < S; ++j) row[j] = allowed[j] ? exp_nonpositive(row[j] - shift) : scalar_t(0);
      } else {
#pragma omp simd
        for (int64_t j = 0; j < S; ++j) row[j] = exp_nonpositive(row[j] - shift);
      }
      continue;
    }
    scalar_t top = neg_inf;
    if (allowed) {
#pragma omp simd reduction(max : top)
      for (int64_t j = 0; j < S; ++j) top = std::max(top, allowed[j] ? row[j] : neg_inf);
    } else {
#pragma omp simd reduction(max : top)
      for (int64_t j = 0; j < S; ++j) top = std::max(top, row[j]);
    }
    scalar_t total = 0;
    if (allowed) {
#pragma omp simd reduction(+ : total)
      for (int64_t j = 0; j < S; ++j) {
        const scalar_t e = allowed[j] ? exp_nonpositive(row[j] - top) : scalar_t(0);
        row[j] = e;
        total += e;
      }
    } else {
#pragma omp simd reduction(+ : total)
      for (int64_t j = 0; j < S; ++j) {
        const scalar_t e = exp_nonpositive(row[j] - top);
        row[j] = e;
        total += e;
      }
    }
    const scalar_t inv = scalar_t(1) / total;
#pragma omp simd
    for (int64_t j = 0; j < S; ++j) row[j] *= inv;
    lse[r0 + t] = top + std::log(total);
  }
}

struct Dropout {
  bool on;
  uint64_t seed;
  uint32_t threshold;
  double keep_scale;
};

// Query rows per block: a block's (rows x S) buffers stay within about 256 KiB, so they live in the core's L2 cache
// while the block is worked on (at least 16 rows, so the products keep a useful shape).
template <typename scalar_t>
int64_t rows_per_block(const Geometry& g) {
  const int64_t fit = (256 * 1024) / (std::max<int64_t>(g.S, 1) * static_cast<int64_t>(sizeof(scalar_t)));
  return std::max<int64_t>(1, std::min(g.T, std::max<int64_t>(16, fit)));
}

template <typename scalar_t>
void forward_block(const Geometry& g, int64_t tile, int64_t r0, int64_t rows, const scalar_t* q, const scalar_t* k,
                   const scalar_t* v, const uint8_t* mask, scalar_t* out, scalar_t* lse, scalar_t* probs,
                   uint8_t* keep, const Dropout& drop) {
  const int64_t T = g.T, S = g.S, D = g.D;
  tile_probs<scalar_t>(g, tile, r0, rows, q, k, mask, probs, lse + tile * T, false);
  if (drop.on) {
    for (int64_t t = 0; t < rows; ++t) {
      keep_row(drop.seed, (tile * T + r0 + t) * S, S, drop.threshold, keep);
      scalar_t* row = probs + t * S;
#pragma omp simd
      for (int64_t j = 0; j < S; ++j) row[j] = keep[j] ? row[j] : scalar_t(0);
    }
  }
  const scalar_t alpha = drop.on ? static_cast<scalar_t>(drop.keep_scale) : scalar_t(1);
  gemm_rm<scalar_t>(false, false, rows, D, S, alpha, probs, S, v + tile * S * D, D, scalar_t(0),
                    out + (tile * T + r0) * D, D);
}

// One tile's gradients, its query rows taken in blocks; the key and value gradients add up over the blocks.
template <typename scalar_t>
void backward_tile(const Geometry& g, int64_t tile, int64_t block_rows, const scalar_t* q, const scalar_t* k,
                   const scalar_t* v, const uint8_t* mask, const scalar_t* lse, const scalar_t* grad_out,
                   scalar_t* grad_q, scalar_t* grad_k, scalar_t* grad_v, scalar_t* probs, scalar_t* grad_p,
                   scalar_t* kept_p, uint8_t* keep, const Dropout& drop) {
  const int64_t T = g.T, S = g.S, D = g.D;
  const scalar_t scale = static_cast<scalar_t>(1.0 / std::sqrt(static_cast<double>(D)));
  const scalar_t keep_scale = static_cast<scalar_t>(drop.keep_scale);
  for (int64_t r0 = 0; r0 < T; r0 += block_rows) {
    const int64_t rows = std::min(block_rows, T - r0);
    const scalar_t beta = r0 == 0 ? scalar_t(0) : scalar_t(1);
    const scalar_t* got = grad_out + (tile * T + r0) * D;
    tile_probs<scalar_t>(g, tile, r0, rows, q, k, mask, probs, const_cast<scalar_t*>(lse) + tile * T, true);
    // dP = dO v^T (the gradient of the kept, scaled probabilities)
    gemm_rm<scalar_t>(false, true, rows, S, D, scalar_t(1), got, D, v + tile * S * D, D, scalar_t(0), grad_p, S);
    for (int64_t t = 0; t < rows; ++t) {
      const scalar_t* p = probs + t * S;
      scalar_t* dp = grad_p + t * S;
      if (drop.on) {
        keep_row(drop.seed, (tile * T + r0 + t) * S, S, drop.threshold, keep);
        scalar_t* kp = kept_p + t * S;
#pragma omp simd
        for (int64_t j = 0; j < S; ++j) {
          dp[j] = keep[j] ? dp[j] * keep_scale : scalar_t(0);
          kp[j] = keep[j] ? p[j] * keep_scale : scalar_t(0);
        }
      }
      scalar_t dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j < S; ++j) dot += p[j] * dp[j];
#pragma omp simd
      for (int64_t j = 0; j < S; ++j) dp[j] = p[j] * (dp[j] - dot);  // now the scores' gradient
    }
    // dV += P_kept^T dO; dQ = dS k * scale; dK += dS^T q * scale
    gemm_rm<scalar_t>(true, false, S, D, rows, scalar_t(1), drop.on ? kept_p : probs, S, got, D, beta,
                      grad_v + tile * S * D, D);
    gemm_rm<scalar_t>(false, false, rows, D, S, scale, grad_p, S, k + tile * S * D, D, scalar_t(0),
                      grad_q + (tile * T + r0) * D, D);
    gemm_rm<scalar_t>(true, false, S, D, rows, scale, grad_p, S, q + (tile * T + r0) * D, D, beta,
                      grad_k + tile * S * D, D);
  }
}

Geometry geometry(const at::Tensor& q, const at::Tensor& k, const c10::optional<at::Tensor>& mask) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4, "fused attention takes (A, H, T, Dh) tensors");
  Geometry g{q.size(1), q.size(2), k.size(2), q.size(3), 0, 0, 0, mask.has_value()};
  if (g.has_mask) {
    const at::Tensor& m = *mask;
    TORCH_CHECK(m.dim() == 4 && m.scalar_type() == at::kByte && m.stride(3) == 1, "mask: (A, H, T, S) uint8 view");
    g.m_outer = m.stride(0);
    g.m_head = m.stride(1);
    g.m_row = m.stride(2);
  }
  return g;
}

// `dropped` of every 65536 levels are dropped (the rounding of `dropout_mask` in dropout.py): an element is kept when
// its 32-bit draw is >= dropped * 2^16, and the kept values are scaled by 65536 / (65536 - dropped).
Dropout dropout_of(int64_t dropped, int64_t seed) {
  TORCH_CHECK(dropped >= -1 && dropped < 65536, "dropped levels must be in [0, 65536) or -1 (no dropout)");
  if (dropped < 0) return {false, 0, 0, 1.0};
  return {true, static_cast<uint64_t>(seed), static_cast<uint32_t>(dropped) << 16, 65536.0 / (65536.0 - dropped)};
}

// Returns (out (A, H, T, Dh), lse (A, H, T)).
std::vector<at::Tensor> forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const c10::optional<at::Tensor>& mask, int64_t dropped, int64_t seed) {
  const Geometry g = geometry(q, k, mask);
  const int64_t tiles = q.size(0) * g.heads;
  auto out = at::empty_like(q);
  auto lse = at::empty({q.size(0), g.heads, g.T}, q.options());
  const Dropout drop = dropout_of(dropped, seed);
  const uint8_t* mask_ptr = g.has_mask ? mask->data_ptr<uint8_t>() : nullptr;
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "fused_attention_forward", [&] {
    const scalar_t *qp = q.data_ptr<scalar_t>(), *kp = k.data_ptr<scalar_t>(), *vp = v.data_ptr<scalar_t>();
    scalar_t *op = out.data_ptr<scalar_t>(), *lp = lse.data_ptr<scalar_t>();
    const int64_t block_rows = rows_per_block<scalar_t>(g);
    const int64_t blocks = (g.T + block_rows - 1) / block_rows;
    at::parallel_for(0, tiles * blocks, 1, [&](int64_t begin, int64_t end) {
      const int previous = MKL_Set_Num_Threads_Local(1);
      std::vector<scalar_t> probs(block_rows * g.S);
      std::vector<uint8_t> keep(g.S);
      for (int64_t item = begin; item < end; ++item) {
        const int64_t tile = item / blocks, r0 = (item % blocks) * block_rows;
        forward_block<scalar_t>(g, tile, r0, std::min(block_rows, g.T - r0), qp, kp, vp, mask_ptr, op, lp,
                                probs.data(), keep.data(), drop);
      }
      MKL_Set_Num_Threads_Local(previous);
    });
  });
  return {out, lse};
}

// Returns (grad_q, grad_k, grad_v).
std::vector<at::Tensor> backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                 const at::Tensor& v, const c10::optional<at::Tensor>& mask, const at::Tensor& lse,
                                 int64_t dropped, int64_t seed) {
  const Geometry g = geometry(q, k, mask);
  const int64_t tiles = q.size(0) * g.heads;
  auto grad_q = at::empty_like(q);
  auto grad_k = at::empty_like(k);
  auto grad_v = at::empty_like(v);
  const Dropout drop = dropout_of(dropped, seed);
  const uint8_t* mask_ptr = g.has_mask ? mask->data_ptr<uint8_t>() : nullptr;
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "fused_attention_backward", [&] {
    const scalar_t *qp = q.data_ptr<scalar_t>(), *kp = k.data_ptr<scalar_t>(), *vp = v.data_ptr<scalar_t>();
    const scalar_t *lp = lse.data_ptr<scalar_t>(), *gp = grad_out.data_ptr<scalar_t>();
    scalar_t *gq = grad_q.data_ptr<scalar_t>(), *gk = grad_k.data_ptr<scalar_t>(), *gv = grad_v.data_ptr<scalar_t>();
    const int64_t block_rows = rows_per_block<scalar_t>(g);
    at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
      const int previous = MKL_Set_Num_Threads_Local(1);
      const int64_t size = block_rows * g.S;
      std::vector<scalar_t> probs(size), grad_p(size), kept_p(drop.on ? size : 0);
      std::vector<uint8_t> keep(g.S);
      for (int64_t tile = begin; tile < end; ++tile) {
        backward_tile<scalar_t>(g, tile, block_rows, qp, kp, vp, mask_ptr, lp, gp, gq, gk, gv, probs.data(),
                                grad_p.data(), kept_p.data(), keep.data(), drop);
      }
      MKL_Set_Num_Threads_Local(previous);
    });
  });
  return {grad_q, grad_k, grad_v};
}

// The dropout mask of a call, materialised (for tests and the dense twin): (numel,) uint8, 1 = kept.
at::Tensor keep_mask(int64_t numel, int64_t dropped, int64_t seed) {
  auto keep = at::empty({numel}, at::TensorOptions().dtype(at::kByte));
  keep_row(static_cast<uint64_t>(seed), 0, numel, dropout_of(dropped, seed).threshold, keep.data_ptr<uint8_t>());
  return keep;
}

}  // namespace

namespace tf_family {
std::vector<at::Tensor> knn_top_k(const at::Tensor& queries, const at::Tensor& keys, int64_t heads,
                                  const c10::optional<at::Tensor>& allowed,
                                  const c10::optional<at::Tensor>& expired_column,
                                  const c10::optional<at::Tensor>& gone, int64_t k);  // knn_top_k.cpp
at::Tensor knn_pair_scores(const at::Tensor& x, const at::Tensor& memory, const at::Tensor& slots,
                           const c10::optional<at::Tensor>& remap,
                           const c10::optional<at::Tensor>& stash);  // knn_pairs.cpp
at::Tensor knn_pair_mix(const at::Tensor& w, const at::Tensor& memory, const at::Tensor& slots,
                        const c10::optional<at::Tensor>& remap, const c10::optional<at::Tensor>& stash);
std::vector<at::Tensor> summary_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                        const at::Tensor& sk, const at::Tensor& sv, const at::Tensor& starts,
                                        const c10::optional<at::Tensor>& slopes, int64_t stride, int64_t size,
                                        int64_t block_rows);  // summary_attention.cpp
std::vector<at::Tensor> summary_backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                         const at::Tensor& v, const at::Tensor& sk, const at::Tensor& sv,
                                         const at::Tensor& starts, const c10::optional<at::Tensor>& slopes,
                                         const at::Tensor& lse, int64_t stride, int64_t size, int64_t block_rows);
std::vector<at::Tensor> factor_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       const c10::optional<at::Tensor>& slopes, int64_t kind, int64_t stride,
                                       int64_t chunk_rows);  // factor_attention.cpp
std::vector<at::Tensor> factor_backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v, const c10::optional<at::Tensor>& slopes,
                                        const at::Tensor& lse, int64_t kind, int64_t stride, int64_t chunk_rows);
}  // namespace tf_family

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "fused masked attention forward: (out, lse)");
  m.def("backward", &backward, "fused masked attention backward: (grad_q, grad_k, grad_v)");
  m.def("keep_mask", &keep_mask, "dropout keep mask of a call");
  m.def("knn_top_k", &tf_family::knn_top_k, "exact top-k of a kNN memory: (scores, slots)");
  m.def("knn_pair_scores", &tf_family::knn_pair_scores, "queries . memory rows by slot: (R, T, K)");
  m.def("summary_forward", &tf_family::summary_forward, "Sparse Transformer summary factor forward: (out, lse)");
  m.def("summary_backward", &tf_family::summary_backward,
        "Sparse Transformer summary factor backward: (grad_q, grad_k, grad_v, grad_summary_k, grad_summary_v)");
  m.def("factor_forward", &tf_family::factor_forward,
        "Sparse Transformer local / strided / block factor forward: (out, lse)");
  m.def("factor_backward", &tf_family::factor_backward,
        "Sparse Transformer local / strided / block factor backward: (grad_q, grad_k, grad_v)");
  m.def("knn_pair_mix", &tf_family::knn_pair_mix, "weighted sums of memory rows by slot: (R, T, D)");
}
