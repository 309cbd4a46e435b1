// The Sparse Transformer's "fixed" summary factor for CPU training (factorized.py's "summary" kernel, natively):
// each query attends to the summary keys of the blocks before it (the last `size` columns, from `start`, of every
// block of `stride` positions, gathered per head into (B, H, N c, Dh)) and to its own key, under one softmax.
//
// Every (batch, head) pair is a tile; its queries are taken in blocks of rows, each block scored against the summary
// keys up to the block's last query only (the causal prefix: the later keys' scores, half of a T x N c product, are
// never computed), with the block's (rows x keys) scores kept in the core's cache. The heads of one call may read
// different summary columns (`starts`, one per head: the paper's per-head sub-blocks), so both summary heads of a
// layer are one call. Optional ALiBi slopes add -m_h (i - j) to the scores. Only each row's log-sum-exp is saved;
// the backward recomputes the probabilities. No dropout: the Python side keeps plain autograd for that.
//
// Work is spread as (tile, part) items: a tile's query blocks are dealt round-robin to `parts` items, so that the
// early blocks (few keys) and the late ones (many) mix in every item; each part accumulates its own summary-key
// gradients, summed at the end. The result does not depend on the number of threads beyond float summation order of
// those partial sums, and `parts` is chosen from the thread count only.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include "blas.h"
#include "softmax.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

using tf_family::exp_nonpositive;
using tf_family::gemm_rm;

struct Summary {
  int64_t heads, T, keys, D, stride, size, block_rows, blocks, parts;
  const int64_t* starts;  // (H,) first summary column of each head
  const double* slopes;   // (H,) ALiBi slopes, or nullptr
};

// Position of summary key u of head h: column start + u % size of block u / size.
inline int64_t key_position(const Summary& g, int64_t head, int64_t u) {
  return (u / g.size) * g.stride + g.starts[head] + u % g.size;
}

// The number of summary keys a block of queries [r0, r1) can see: those strictly before its last query.
inline int64_t visible_keys(const Summary& g, int64_t head, int64_t r1) {
  int64_t count = std::min(g.keys, ((r1 - 1) / g.stride + 1) * g.size);
  while (count > 0 && key_position(g, head, count - 1) >= r1 - 1) --count;
  return count;
}

// Rows [r0, r0 + rows) of a tile's probabilities over its first `s1` summary keys, written to `probs` (rows x s1),
// and each row's probability of its own key, to `own` (rows). Forward: computes each row's log-sum-exp into `lse`;
// backward (`recompute`): the same probabilities from the saved `lse`.
template <typename scalar_t>
void block_probs(const Summary& g, int64_t tile, int64_t r0, int64_t rows, int64_t s1, const scalar_t* q,
                 const scalar_t* k, const scalar_t* sk, const int64_t* positions, scalar_t* probs, scalar_t* own,
                 scalar_t* lse, bool recompute) {
  const int64_t T = g.T, D = g.D, head = tile % g.heads;
  const scalar_t scale = static_cast<scalar_t>(1.0 / std::sqrt(static_cast<double>(D)));
  const scalar_t* q_rows = q + (tile * T + r0) * D;
  if (s1 > 0) {
    gemm_rm<scalar_t>(false, true, rows, s1, D, scale, q_rows, D, sk + tile * g.keys * D, D, scalar_t(0), probs, s1);
  }
  const scalar_t slope = g.slopes ? static_cast<scalar_t>(g.slopes[head]) : scalar_t(0);
  const scalar_t neg_inf = -std::numeric_limits<scalar_t>::infinity();
  for (int64_t t = 0; t < rows; ++t) {
    const int64_t i = r0 + t;
    scalar_t* row = probs + t * s1;
    const scalar_t* qi = q_rows + t * D;
    const scalar_t* ki = k + (tile * T + i) * D;
    scalar_t self = 0;
#pragma omp simd reduction(+ : self)
    for (int64_t d = 0; d < D; ++d) self += qi[d] * ki[d];
    self *= scale;
    if (g.slopes) {
#pragma omp simd
      for (int64_t j = 0; j < s1; ++j) row[j] -= slope * static_cast<scalar_t>(i - positions[j]);
    }
    if (recompute) {
      const scalar_t shift = lse[i];
#pragma omp simd
      for (int64_t j = 0; j < s1; ++j) row[j] = positions[j] < i ? exp_nonpositive(row[j] - shift) : scalar_t(0);
      own[t] = exp_nonpositive(self - shift);
      continue;
    }
    scalar_t top = self;
#pragma omp simd reduction(max : top)
    for (int64_t j = 0; j < s1; ++j) top = std::max(top, positions[j] < i ? row[j] : neg_inf);
    scalar_t total = 0;
#pragma omp simd reduction(+ : total)
    for (int64_t j = 0; j < s1; ++j) {
      const scalar_t e = positions[j] < i ? exp_nonpositive(row[j] - top) : scalar_t(0);
      row[j] = e;
      total += e;
    }
    const scalar_t self_e = exp_nonpositive(self - top);
    total += self_e;
    const scalar_t inv = scalar_t(1) / total;
#pragma omp simd
    for (int64_t j = 0; j < s1; ++j) row[j] *= inv;
    own[t] = self_e * inv;
    lse[i] = top + std::log(total);
  }
}

// One (tile, part) item of the forward: the part's query blocks of the tile (module notes).
template <typename scalar_t>
void forward_item(const Summary& g, int64_t tile, int64_t part, const scalar_t* qp, const scalar_t* kp,
                  const scalar_t* vp, const scalar_t* skp, const scalar_t* svp, scalar_t* op, scalar_t* lp,
                  scalar_t* probs_buffer, scalar_t* own_buffer, int64_t* positions_buffer) {
  const int64_t head = tile % g.heads;
  for (int64_t u = 0; u < g.keys; ++u) positions_buffer[u] = key_position(g, head, u);
  for (int64_t block = part; block < g.blocks; block += g.parts) {
    const int64_t r0 = block * g.block_rows, rows = std::min(g.block_rows, g.T - r0);
    const int64_t s1 = visible_keys(g, head, r0 + rows);
    block_probs<scalar_t>(g, tile, r0, rows, s1, qp, kp, skp, positions_buffer, probs_buffer, own_buffer,
                          lp + tile * g.T, false);
    scalar_t* out_rows = op + (tile * g.T + r0) * g.D;
    if (s1 > 0) {
      gemm_rm<scalar_t>(false, false, rows, g.D, s1, scalar_t(1), probs_buffer, s1, svp + tile * g.keys * g.D,
                        g.D, scalar_t(0), out_rows, g.D);
    } else {
      std::fill(out_rows, out_rows + rows * g.D, scalar_t(0));
    }
    for (int64_t t = 0; t < rows; ++t) {  // + p_own v_i
      const scalar_t* vi = vp + (tile * g.T + r0 + t) * g.D;
      scalar_t* oi = out_rows + t * g.D;
      const scalar_t p = own_buffer[t];
#pragma omp simd
      for (int64_t d = 0; d < g.D; ++d) oi[d] += p * vi[d];
    }
  }
}

// One (tile, part) item of the backward: the part's query blocks of the tile, its summary-key gradients into the
// part's own rows (module notes).
template <typename scalar_t>
void backward_item(const Summary& g, int64_t tiles, int64_t tile, int64_t part, const scalar_t* qp,
                   const scalar_t* kp, const scalar_t* vp, const scalar_t* skp, const scalar_t* svp,
                   const scalar_t* gp, scalar_t* lp, scalar_t* gq, scalar_t* gk, scalar_t* gv, scalar_t* gsk,
                   scalar_t* gsv, scalar_t* probs_buffer, scalar_t* grad_p_buffer, scalar_t* own_buffer,
                   scalar_t* own_ds_buffer, int64_t* positions_buffer) {
  const int64_t head = tile % g.heads;
  const scalar_t scale = static_cast<scalar_t>(1.0 / std::sqrt(static_cast<double>(g.D)));
  const int64_t summary = (part * tiles + tile) * g.keys * g.D;  // this part's gradient rows of this tile
  for (int64_t u = 0; u < g.keys; ++u) positions_buffer[u] = key_position(g, head, u);
  for (int64_t block = part; block < g.blocks; block += g.parts) {
    const int64_t r0 = block * g.block_rows, rows = std::min(g.block_rows, g.T - r0);
    const int64_t s1 = visible_keys(g, head, r0 + rows);
    const int64_t first = (tile * g.T + r0) * g.D;
    block_probs<scalar_t>(g, tile, r0, rows, s1, qp, kp, skp, positions_buffer, probs_buffer, own_buffer,
                          lp + tile * g.T, true);
    const scalar_t* got = gp + first;
    if (s1 > 0) {  // dP = dO sv^T
      gemm_rm<scalar_t>(false, true, rows, s1, g.D, scalar_t(1), got, g.D, svp + tile * g.keys * g.D, g.D,
                        scalar_t(0), grad_p_buffer, s1);
    }
    for (int64_t t = 0; t < rows; ++t) {
      const scalar_t* p = probs_buffer + t * s1;
      scalar_t* dp = grad_p_buffer + t * s1;
      const scalar_t* dout = got + t * g.D;
      const scalar_t* vi = vp + first + t * g.D;
      const scalar_t* qi = qp + first + t * g.D;
      scalar_t own_dp = 0;
#pragma omp simd reduction(+ : own_dp)
      for (int64_t d = 0; d < g.D; ++d) own_dp += dout[d] * vi[d];
      scalar_t dot = own_buffer[t] * own_dp;
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j < s1; ++j) dot += p[j] * dp[j];
#pragma omp simd
      for (int64_t j = 0; j < s1; ++j) dp[j] = p[j] * (dp[j] - dot);  // now the scores' gradient
      own_ds_buffer[t] = own_buffer[t] * (own_dp - dot) * scale;  // the own key's score gradient, times the scale
      scalar_t* gvi = gv + first + t * g.D;
      scalar_t* gki = gk + first + t * g.D;
      const scalar_t p_own = own_buffer[t];
#pragma omp simd
      for (int64_t d = 0; d < g.D; ++d) {
        gvi[d] = p_own * dout[d];
        gki[d] = own_ds_buffer[t] * qi[d];
      }
    }
    scalar_t* gq_rows = gq + first;
    if (s1 > 0) {
      // d sv += P^T dO; dQ = dS sk * scale; d sk += dS^T q * scale
      gemm_rm<scalar_t>(true, false, s1, g.D, rows, scalar_t(1), probs_buffer, s1, got, g.D, scalar_t(1),
                        gsv + summary, g.D);
      gemm_rm<scalar_t>(false, false, rows, g.D, s1, scale, grad_p_buffer, s1, skp + tile * g.keys * g.D, g.D,
                        scalar_t(0), gq_rows, g.D);
      gemm_rm<scalar_t>(true, false, s1, g.D, rows, scale, grad_p_buffer, s1, qp + first, g.D, scalar_t(1),
                        gsk + summary, g.D);
    } else {
      std::fill(gq_rows, gq_rows + rows * g.D, scalar_t(0));
    }
    for (int64_t t = 0; t < rows; ++t) {  // + dS_own k_i * scale
      const scalar_t* ki = kp + first + t * g.D;
      scalar_t* gqi = gq_rows + t * g.D;
      const scalar_t ds = own_ds_buffer[t];
#pragma omp simd
      for (int64_t d = 0; d < g.D; ++d) gqi[d] += ds * ki[d];
    }
  }
}

Summary geometry(const at::Tensor& q, const at::Tensor& sk, const at::Tensor& starts,
                 const c10::optional<at::Tensor>& slopes, int64_t stride, int64_t size, int64_t block_rows) {
  TORCH_CHECK(q.dim() == 4 && sk.dim() == 4, "summary attention takes (B, H, T, Dh) and (B, H, N c, Dh) tensors");
  TORCH_CHECK(starts.dim() == 1 && starts.size(0) == q.size(1) && starts.scalar_type() == at::kLong,
              "starts: (H,) int64");
  TORCH_CHECK(!slopes.has_value() || (slopes->dim() == 1 && slopes->size(0) == q.size(1) &&
                                      slopes->scalar_type() == at::kDouble),
              "slopes: (H,) float64");
  TORCH_CHECK(stride >= 1 && size >= 1 && size <= stride && block_rows >= 1, "stride >= size >= 1, block_rows >= 1");
  const int64_t tiles = q.size(0) * q.size(1), T = q.size(2);
  const int64_t blocks = (T + block_rows - 1) / block_rows;
  const int64_t threads = at::get_num_threads();
  const int64_t parts = std::max<int64_t>(1, std::min(blocks, (threads + tiles - 1) / tiles));
  return {q.size(1), T, sk.size(2), q.size(3), stride, size, block_rows, blocks, parts,
          starts.data_ptr<int64_t>(), slopes.has_value() ? slopes->data_ptr<double>() : nullptr};
}

}  // namespace

namespace tf_family {

// Returns (out (B, H, T, Dh), lse (B, H, T)). Every tensor contiguous, one floating dtype.
std::vector<at::Tensor> summary_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                        const at::Tensor& sk, const at::Tensor& sv, const at::Tensor& starts,
                                        const c10::optional<at::Tensor>& slopes, int64_t stride, int64_t size,
                                        int64_t block_rows) {
  const Summary g = geometry(q, sk, starts, slopes, stride, size, block_rows);
  const int64_t tiles = q.size(0) * g.heads;
  auto out = at::empty_like(q);
  auto lse = at::empty({q.size(0), g.heads, g.T}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "summary_attention_forward", [&] {
    const scalar_t *qp = q.data_ptr<scalar_t>(), *kp = k.data_ptr<scalar_t>(), *vp = v.data_ptr<scalar_t>();
    const scalar_t *skp = sk.data_ptr<scalar_t>(), *svp = sv.data_ptr<scalar_t>();
    scalar_t *op = out.data_ptr<scalar_t>(), *lp = lse.data_ptr<scalar_t>();
    at::parallel_for(0, tiles * g.parts, 1, [&](int64_t begin, int64_t end) {
      const int previous = MKL_Set_Num_Threads_Local(1);
      std::vector<scalar_t> probs(g.block_rows * std::max<int64_t>(g.keys, 1)), own(g.block_rows);
      std::vector<int64_t> positions(g.keys);
      for (int64_t item = begin; item < end; ++item) {
        forward_item<scalar_t>(g, item / g.parts, item % g.parts, qp, kp, vp, skp, svp, op, lp, probs.data(),
                               own.data(), positions.data());
      }
      MKL_Set_Num_Threads_Local(previous);
    });
  });
  return {out, lse};
}

// Returns (grad_q, grad_k, grad_v, grad_sk, grad_sv).
std::vector<at::Tensor> summary_backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                         const at::Tensor& v, const at::Tensor& sk, const at::Tensor& sv,
                                         const at::Tensor& starts, const c10::optional<at::Tensor>& slopes,
                                         const at::Tensor& lse, int64_t stride, int64_t size, int64_t block_rows) {
  const Summary g = geometry(q, sk, starts, slopes, stride, size, block_rows);
  const int64_t tiles = q.size(0) * g.heads;
  auto grad_q = at::empty_like(q);
  auto grad_k = at::empty_like(k);
  auto grad_v = at::empty_like(v);
  // each part's own summary-key gradients: (parts, B, H, N c, Dh), summed below
  auto grad_sk_parts = at::zeros({g.parts, q.size(0), g.heads, g.keys, g.D}, q.options());
  auto grad_sv_parts = at::zeros({g.parts, q.size(0), g.heads, g.keys, g.D}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "summary_attention_backward", [&] {
    const scalar_t *qp = q.data_ptr<scalar_t>(), *kp = k.data_ptr<scalar_t>(), *vp = v.data_ptr<scalar_t>();
    const scalar_t *skp = sk.data_ptr<scalar_t>(), *svp = sv.data_ptr<scalar_t>();
    const scalar_t *gp = grad_out.data_ptr<scalar_t>();
    scalar_t* lp = const_cast<scalar_t*>(lse.data_ptr<scalar_t>());  // read only (recompute)
    scalar_t *gq = grad_q.data_ptr<scalar_t>(), *gk = grad_k.data_ptr<scalar_t>(), *gv = grad_v.data_ptr<scalar_t>();
    scalar_t *gsk = grad_sk_parts.data_ptr<scalar_t>(), *gsv = grad_sv_parts.data_ptr<scalar_t>();
    at::parallel_for(0, tiles * g.parts, 1, [&](int64_t begin, int64_t end) {
      const int previous = MKL_Set_Num_Threads_Local(1);
      const int64_t buffer = g.block_rows * std::max<int64_t>(g.keys, 1);
      std::vector<scalar_t> probs(buffer), grad_p(buffer), own(g.block_rows), own_ds(g.block_rows);
      std::vector<int64_t> positions(g.keys);
      for (int64_t item = begin; item < end; ++item) {
        backward_item<scalar_t>(g, tiles, item / g.parts, item % g.parts, qp, kp, vp, skp, svp, gp, lp, gq, gk, gv,
                                gsk, gsv, probs.data(), grad_p.data(), own.data(), own_ds.data(), positions.data());
      }
      MKL_Set_Num_Threads_Local(previous);
    });
  });
  return {grad_q, grad_k, grad_v, grad_sk_parts.sum(0), grad_sv_parts.sum(0)};
}

}  // namespace tf_family
