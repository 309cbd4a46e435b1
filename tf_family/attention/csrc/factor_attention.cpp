// The Sparse Transformer's "local", "strided" and "block" factors for CPU training (factorized.py's grouped kernels,
// natively), read in place from the (B, H, T, Dh) tensors: no padding, no regrouping copy, no transposed grid.
//
// Each factor cuts the sequence into groups that attend only within themselves, and a group's rows sit at a fixed
// step in memory, so the matrix products read them through the BLAS leading dimension:
//
// - "local" (kind 0): group n = the queries of block n (rows n l .. n l + l - 1) against the keys from the start of
//   block n - 1 to the group's last query, allowed when 0 <= i - j < l;
// - "strided" (kind 1): group a = column a of the (T / l, l) grid (rows a, a + l, a + 2 l, ...: step l) against the
//   same rows, allowed when j <= i;
// - "block" (kind 2): group n = block n against itself, allowed when j <= i.
//
// Every (batch, head, group) is a work item; its queries are taken in chunks of `chunk_rows`, each against the keys
// that any of its rows may see, with the chunk's (rows x keys) scores kept in the core's cache. Optional ALiBi slopes
// add -m_h (i - j) to the scores. Only each row's log-sum-exp is saved; the backward recomputes the probabilities.
// The groups of "strided" and "block" share no key, so their key gradients are written by one item each; those of
// "local" overlap with their neighbours', so the backward runs the even groups, then the odd ones. No dropout: the
// Python side keeps `backend.attend` for that. The result does not depend on the number of threads.

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

enum Kind : int64_t { kLocal = 0, kStrided = 1, kBlock = 2 };

// Element strides of a (B, H, T, Dh) tensor whose last dim is contiguous.
struct Strides {
  int64_t batch, head, row;
};

struct Factor {
  int64_t kind, heads, T, D, stride, groups, chunk_rows;
  const double* slopes;  // (H,) ALiBi slopes, or nullptr
  Strides q, k, v, grad_out;
};

// Group g of a tile: its queries are rows first + t * step (t < rows), its keys rows key_first + c * step (c < keys).
struct Group {
  int64_t first, key_first, step, rows, keys, window;
};

inline Group group_of(const Factor& f, int64_t g) {
  const int64_t l = f.stride, T = f.T;
  if (f.kind == kStrided) {
    const int64_t rows = (T - g + l - 1) / l;
    return {g, g, l, rows, rows, std::numeric_limits<int64_t>::max()};
  }
  const int64_t first = g * l, rows = std::min(l, T - first);
  if (f.kind == kBlock) return {first, first, 1, rows, rows, std::numeric_limits<int64_t>::max()};
  const int64_t key_first = std::max<int64_t>(0, first - l);
  return {first, key_first, 1, rows, first + rows - key_first, l};
}

// The most keys any group has (the width of the score buffers).
inline int64_t max_keys(const Factor& f) {
  if (f.kind == kLocal) return 2 * f.stride;
  return f.kind == kBlock ? f.stride : (f.T + f.stride - 1) / f.stride;
}

// Of the keys at base, base + step, ... (a group's rows): the first one within the window of the query at row i, and
// one past the last one at or before it (the query's own key).
inline int64_t first_seen(const Group& grp, int64_t i, int64_t base) {
  const int64_t lowest = grp.window == std::numeric_limits<int64_t>::max() ? 0 : i - grp.window + 1;
  return lowest <= base ? 0 : (lowest - base + grp.step - 1) / grp.step;
}

inline int64_t past_last_seen(const Group& grp, int64_t i, int64_t base) { return (i - base) / grp.step + 1; }

// The keys [c0, c1) that rows [t0, t1) of a group may see: from the first row's first key to the last row's own key.
inline void key_range(const Group& grp, int64_t t0, int64_t t1, int64_t* c0, int64_t* c1) {
  *c0 = first_seen(grp, grp.first + t0 * grp.step, grp.key_first);
  *c1 = std::min(grp.keys, past_last_seen(grp, grp.first + (t1 - 1) * grp.step, grp.key_first));
}

inline int64_t offset(const Strides& s, int64_t batch, int64_t head, int64_t row) {
  return batch * s.batch + head * s.head + row * s.row;
}

// The probabilities of rows [t0, t0 + rows) of a group over its keys [c0, c0 + keys), into `probs` (rows x keys).
// Forward: each row's log-sum-exp into `lse` (indexed by position); backward (`recompute`): from the saved `lse`.
template <typename scalar_t>
void chunk_probs(const Factor& f, const Group& grp, int64_t batch, int64_t head, int64_t t0, int64_t rows, int64_t c0,
                 int64_t keys, const scalar_t* q, const scalar_t* k, scalar_t* probs, scalar_t* lse, bool recompute) {
  const int64_t D = f.D, step = grp.step;
  const scalar_t scale = static_cast<scalar_t>(1.0 / std::sqrt(static_cast<double>(D)));
  const int64_t row0 = grp.first + t0 * step, key0 = grp.key_first + c0 * step;
  gemm_rm<scalar_t>(false, true, rows, keys, D, scale, q + offset(f.q, batch, head, row0), step * f.q.row,
                    k + offset(f.k, batch, head, key0), step * f.k.row, scalar_t(0), probs, keys);
  const scalar_t slope = f.slopes ? static_cast<scalar_t>(f.slopes[head]) : scalar_t(0);
  const scalar_t neg_inf = -std::numeric_limits<scalar_t>::infinity();
  for (int64_t t = 0; t < rows; ++t) {
    const int64_t i = row0 + t * step;
    scalar_t* row = probs + t * keys;
    // key c of the chunk sits at key0 + c * step; it is allowed when 0 <= i - j < window: c in [begin, last)
    const int64_t last = std::min(keys, past_last_seen(grp, i, key0));
    const int64_t begin = std::min(last, first_seen(grp, i, key0));
    if (f.slopes) {
#pragma omp simd
      for (int64_t c = begin; c < last; ++c) row[c] -= slope * static_cast<scalar_t>(i - key0 - c * step);
    }
    std::fill(row, row + begin, scalar_t(0));
    std::fill(row + last, row + keys, scalar_t(0));
    if (recompute) {
      const scalar_t shift = lse[i];
#pragma omp simd
      for (int64_t c = begin; c < last; ++c) row[c] = exp_nonpositive(row[c] - shift);
      continue;
    }
    scalar_t top = neg_inf;
#pragma omp simd reduction(max : top)
    for (int64_t c = begin; c < last; ++c) top = std::max(top, row[c]);
    scalar_t total = 0;
#pragma omp simd reduction(+ : total)
    for (int64_t c = begin; c < last; ++c) {
      const scalar_t e = exp_nonpositive(row[c] - top);
      row[c] = e;
      total += e;
    }
    const scalar_t inv = scalar_t(1) / total;
#pragma omp simd
    for (int64_t c = begin; c < last; ++c) row[c] *= inv;
    lse[i] = top + std::log(total);
  }
}

// One (batch, head, group) item of the forward; `out` is contiguous (B, H, T, Dh).
template <typename scalar_t>
void forward_item(const Factor& f, int64_t batch, int64_t head, int64_t g, const scalar_t* q, const scalar_t* k,
                  const scalar_t* v, scalar_t* out, scalar_t* lse, scalar_t* probs) {
  const Group grp = group_of(f, g);
  const int64_t D = f.D, tile = batch * f.heads + head;
  for (int64_t t0 = 0; t0 < grp.rows; t0 += f.chunk_rows) {
    const int64_t rows = std::min(f.chunk_rows, grp.rows - t0);
    int64_t c0, c1;
    key_range(grp, t0, t0 + rows, &c0, &c1);
    chunk_probs<scalar_t>(f, grp, batch, head, t0, rows, c0, c1 - c0, q, k, probs, lse + tile * f.T, false);
    const int64_t row0 = grp.first + t0 * grp.step, key0 = grp.key_first + c0 * grp.step;
    gemm_rm<scalar_t>(false, false, rows, D, c1 - c0, scalar_t(1), probs, c1 - c0,
                      v + offset(f.v, batch, head, key0), grp.step * f.v.row, scalar_t(0),
                      out + (tile * f.T + row0) * D, grp.step * D);
  }
}

// One (batch, head, group) item of the backward: its query gradients written, its key and value gradients added
// (`grad_k`, `grad_v` start at zero; all three contiguous (B, H, T, Dh)).
template <typename scalar_t>
void backward_item(const Factor& f, int64_t batch, int64_t head, int64_t g, const scalar_t* q, const scalar_t* k,
                   const scalar_t* v, const scalar_t* grad_out, scalar_t* lse, scalar_t* gq, scalar_t* gk,
                   scalar_t* gv, scalar_t* probs, scalar_t* grad_p) {
  const Group grp = group_of(f, g);
  const int64_t D = f.D, tile = batch * f.heads + head, step = grp.step;
  const scalar_t scale = static_cast<scalar_t>(1.0 / std::sqrt(static_cast<double>(D)));
  for (int64_t t0 = 0; t0 < grp.rows; t0 += f.chunk_rows) {
    const int64_t rows = std::min(f.chunk_rows, grp.rows - t0);
    int64_t c0, c1;
    key_range(grp, t0, t0 + rows, &c0, &c1);
    const int64_t keys = c1 - c0;
    chunk_probs<scalar_t>(f, grp, batch, head, t0, rows, c0, keys, q, k, probs, lse + tile * f.T, true);
    const int64_t row0 = grp.first + t0 * step, key0 = grp.key_first + c0 * step;
    const scalar_t* got = grad_out + offset(f.grad_out, batch, head, row0);
    const int64_t ld_got = step * f.grad_out.row;
    // dP = dO v^T
    gemm_rm<scalar_t>(false, true, rows, keys, D, scalar_t(1), got, ld_got, v + offset(f.v, batch, head, key0),
                      step * f.v.row, scalar_t(0), grad_p, keys);
    for (int64_t t = 0; t < rows; ++t) {
      const scalar_t* p = probs + t * keys;
      scalar_t* dp = grad_p + t * keys;
      scalar_t dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t c = 0; c < keys; ++c) dot += p[c] * dp[c];
#pragma omp simd
      for (int64_t c = 0; c < keys; ++c) dp[c] = p[c] * (dp[c] - dot);  // now the scores' gradient
    }
    const int64_t dense_rows = (tile * f.T + row0) * D, dense_keys = (tile * f.T + key0) * D;
    // dV += P^T dO; dQ = dS k * scale; dK += dS^T q * scale
    gemm_rm<scalar_t>(true, false, keys, D, rows, scalar_t(1), probs, keys, got, ld_got, scalar_t(1),
                      gv + dense_keys, step * D);
    gemm_rm<scalar_t>(false, false, rows, D, keys, scale, grad_p, keys, k + offset(f.k, batch, head, key0),
                      step * f.k.row, scalar_t(0), gq + dense_rows, step * D);
    gemm_rm<scalar_t>(true, false, keys, D, rows, scale, grad_p, keys, q + offset(f.q, batch, head, row0),
                      step * f.q.row, scalar_t(1), gk + dense_keys, step * D);
  }
}

Strides strides_of(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() == 4 && t.stride(3) == 1, name, ": a (B, H, T, Dh) tensor with a contiguous last dim");
  return {t.stride(0), t.stride(1), t.stride(2)};
}

Factor factor_of(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const c10::optional<at::Tensor>& slopes,
                 int64_t kind, int64_t stride, int64_t chunk_rows) {
  TORCH_CHECK(kind == kLocal || kind == kStrided || kind == kBlock, "kind: 0 (local), 1 (strided) or 2 (block)");
  TORCH_CHECK(stride >= 1 && chunk_rows >= 1, "stride >= 1, chunk_rows >= 1");
  TORCH_CHECK(k.sizes() == q.sizes() && v.sizes() == q.sizes(), "query, key and value: one (B, H, T, Dh) shape");
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(), "one floating dtype");
  TORCH_CHECK(!slopes.has_value() || (slopes->dim() == 1 && slopes->size(0) == q.size(1) &&
                                      slopes->scalar_type() == at::kDouble && slopes->is_contiguous()),
              "slopes: (H,) float64");
  const int64_t T = q.size(2);
  const int64_t groups = kind == kStrided ? std::min(stride, T) : (T + stride - 1) / stride;
  return {kind, q.size(1), T, q.size(3), stride, groups, chunk_rows,
          slopes.has_value() ? slopes->data_ptr<double>() : nullptr,
          strides_of(q, "query"), strides_of(k, "key"), strides_of(v, "value"), {0, 0, 0}};
}

}  // namespace

namespace tf_family {

// Returns (out (B, H, T, Dh) contiguous, lse (B, H, T)).
std::vector<at::Tensor> factor_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       const c10::optional<at::Tensor>& slopes, int64_t kind, int64_t stride,
                                       int64_t chunk_rows) {
  const Factor f = factor_of(q, k, v, slopes, kind, stride, chunk_rows);
  auto out = at::empty(q.sizes(), q.options());
  auto lse = at::empty({q.size(0), f.heads, f.T}, q.options());
  const int64_t items = q.size(0) * f.heads * f.groups;
  if (items == 0 || f.D == 0) return {out.zero_(), lse.zero_()};
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "factor_attention_forward", [&] {
    const scalar_t *qp = q.data_ptr<scalar_t>(), *kp = k.data_ptr<scalar_t>(), *vp = v.data_ptr<scalar_t>();
    scalar_t *op = out.data_ptr<scalar_t>(), *lp = lse.data_ptr<scalar_t>();
    const int64_t width = max_keys(f);
    at::parallel_for(0, items, 1, [&](int64_t begin, int64_t end) {
      const int previous = MKL_Set_Num_Threads_Local(1);
      std::vector<scalar_t> probs(std::min(f.chunk_rows, width) * width);
      for (int64_t item = begin; item < end; ++item) {
        const int64_t tile = item / f.groups;
        forward_item<scalar_t>(f, tile / f.heads, tile % f.heads, item % f.groups, qp, kp, vp, op, lp, probs.data());
      }
      MKL_Set_Num_Threads_Local(previous);
    });
  });
  return {out, lse};
}

// Returns (grad_q, grad_k, grad_v), each contiguous (B, H, T, Dh).
std::vector<at::Tensor> factor_backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v, const c10::optional<at::Tensor>& slopes,
                                        const at::Tensor& lse, int64_t kind, int64_t stride, int64_t chunk_rows) {
  Factor f = factor_of(q, k, v, slopes, kind, stride, chunk_rows);
  TORCH_CHECK(grad_out.sizes() == q.sizes() && grad_out.scalar_type() == q.scalar_type(), "grad_out: like query");
  TORCH_CHECK(lse.is_contiguous() && lse.numel() == q.size(0) * f.heads * f.T, "lse: (B, H, T) contiguous");
  f.grad_out = strides_of(grad_out, "grad_out");
  auto grad_q = at::empty(q.sizes(), q.options());
  auto grad_k = at::zeros(q.sizes(), q.options());
  auto grad_v = at::zeros(q.sizes(), q.options());
  const int64_t tiles = q.size(0) * f.heads;
  if (tiles * f.groups == 0 || f.D == 0) return {grad_q.zero_(), grad_k, grad_v};
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "factor_attention_backward", [&] {
    const scalar_t *qp = q.data_ptr<scalar_t>(), *kp = k.data_ptr<scalar_t>(), *vp = v.data_ptr<scalar_t>();
    const scalar_t* gp = grad_out.data_ptr<scalar_t>();
    scalar_t* lp = const_cast<scalar_t*>(lse.data_ptr<scalar_t>());  // read only (recompute)
    scalar_t *gq = grad_q.data_ptr<scalar_t>(), *gk = grad_k.data_ptr<scalar_t>(), *gv = grad_v.data_ptr<scalar_t>();
    const int64_t width = max_keys(f);
    // "local": a group's keys reach into the previous block, so neighbours never run at once (even, then odd groups)
    const int64_t passes = f.kind == kLocal ? 2 : 1;
    const int64_t per_pass = (f.groups + passes - 1) / passes;
    for (int64_t pass = 0; pass < passes; ++pass) {
      at::parallel_for(0, tiles * per_pass, 1, [&](int64_t begin, int64_t end) {
        const int previous = MKL_Set_Num_Threads_Local(1);
        const int64_t size = std::min(f.chunk_rows, width) * width;
        std::vector<scalar_t> probs(size), grad_p(size);
        for (int64_t item = begin; item < end; ++item) {
          const int64_t tile = item / per_pass, g = (item % per_pass) * passes + pass;
          if (g >= f.groups) continue;
          backward_item<scalar_t>(f, tile / f.heads, tile % f.heads, g, qp, kp, vp, gp, lp, gq, gk, gv, probs.data(),
                                  grad_p.data());
        }
        MKL_Set_Num_Threads_Local(previous);
      });
    }
  });
  return {grad_q, grad_k, grad_v};
}

}  // namespace tf_family
