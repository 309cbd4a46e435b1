// Products of queries with the kNN memory pairs they retrieved, read by slot: tf_family's native pair kernels.
//
// The attention over retrieved pairs (`_RetrievedAttention` in memory/knn_memory.py) needs, per query, its k
// retrieved keys and values: the PyTorch path gathers copies of them, (B, H, T, k, Dh) twice (64 MiB per training
// step at 8k entries, batch 2 x 256 tokens, 8 heads x 64), kept for the backward. Here each product reads the
// memory's rows by slot instead, so nothing is copied:
//
//   knn_pair_scores: out[r, t, j] = x[r, t] . memory[r, slot[r, t, j]]        (R, T, K)
//   knn_pair_mix:    out[r, t]    = sum_j w[r, t, j] * memory[r, slot[r, t, j]] (R, T, D)
//
// A write in place into the memory after the retrieval (the model writes the segment at the end of its forward,
// before the backward runs) first copies the rows it overwrites aside (`MemoryReader` in knn_memory.py): `remap`
// (N,) gives, for such a slot, its row in `stash` (R, C, D), so the products see the memory as it was retrieved.
// A slot outside [0, N) reads as a zero row. Items are (row, query) pairs, spread over the cores by
// at::parallel_for; the result does not depend on the number of threads.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace tf_family {

namespace {

struct Rows {
  const float* memory;   // (R, N, D)
  const float* stash;    // (R, C, D) or null
  const int32_t* remap;  // (N,) or null
  int64_t N, C, D;

  // Row `slot` of (row, head) pair r as it was retrieved, or null for a slot outside the memory.
  const float* row(int64_t r, int64_t slot) const {
    if (slot < 0 || slot >= N) return nullptr;
    if (remap != nullptr && remap[slot] >= 0) return stash + (r * C + remap[slot]) * D;
    return memory + (r * N + slot) * D;
  }
};

Rows rows_of(const at::Tensor& memory, const c10::optional<at::Tensor>& remap, const c10::optional<at::Tensor>& stash) {
  TORCH_CHECK(memory.dim() == 3 && memory.scalar_type() == at::kFloat && memory.is_contiguous(),
              "knn pairs: memory must be (R, N, D) contiguous float32");
  Rows rows{memory.data_ptr<float>(), nullptr, nullptr, memory.size(1), 0, memory.size(2)};
  TORCH_CHECK(remap.has_value() == stash.has_value(), "knn pairs: remap and stash go together");
  if (remap.has_value()) {
    TORCH_CHECK(remap->dim() == 1 && remap->size(0) == rows.N && remap->scalar_type() == at::kInt &&
                    remap->is_contiguous(),
                "knn pairs: remap must be int32 (N,)");
    TORCH_CHECK(stash->dim() == 3 && stash->size(0) == memory.size(0) && stash->size(2) == rows.D &&
                    stash->scalar_type() == at::kFloat && stash->is_contiguous(),
                "knn pairs: stash must be (R, C, D) contiguous float32");
    rows.remap = remap->data_ptr<int32_t>();
    rows.stash = stash->data_ptr<float>();
    rows.C = stash->size(1);
  }
  return rows;
}

void check_slots(const at::Tensor& slots, const at::Tensor& memory) {
  TORCH_CHECK(slots.dim() == 3 && slots.size(0) == memory.size(0) && slots.scalar_type() == at::kLong &&
                  slots.is_contiguous(),
              "knn pairs: slots must be (R, T, K) contiguous int64");
}

}  // namespace

// x (R, T, D), memory (R, N, D), slots (R, T, K) -> (R, T, K): x . memory[slot].
at::Tensor knn_pair_scores(const at::Tensor& x, const at::Tensor& memory, const at::Tensor& slots,
                           const c10::optional<at::Tensor>& remap, const c10::optional<at::Tensor>& stash) {
  const Rows rows = rows_of(memory, remap, stash);
  check_slots(slots, memory);
  TORCH_CHECK(x.dim() == 3 && x.size(0) == memory.size(0) && x.size(1) == slots.size(1) && x.size(2) == rows.D &&
                  x.scalar_type() == at::kFloat && x.is_contiguous(),
              "knn_pair_scores: x must be (R, T, D) contiguous float32");
  const int64_t R = x.size(0), T = x.size(1), K = slots.size(2), D = rows.D;
  auto out = at::empty({R, T, K}, x.options());
  const float* xp = x.data_ptr<float>();
  const int64_t* sp = slots.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, R * T, 16, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t r = item / T;
      const float* query = xp + item * D;
      for (int64_t j = 0; j < K; ++j) {
        const float* row = rows.row(r, sp[item * K + j]);
        float dot = 0.0f;
        if (row != nullptr) {
#pragma omp simd reduction(+ : dot)
          for (int64_t d = 0; d < D; ++d) dot += query[d] * row[d];
        }
        op[item * K + j] = dot;
      }
    }
  });
  return out;
}

// w (R, T, K), memory (R, N, D), slots (R, T, K) -> (R, T, D): sum over j of w[j] * memory[slot[j]].
at::Tensor knn_pair_mix(const at::Tensor& w, const at::Tensor& memory, const at::Tensor& slots,
                        const c10::optional<at::Tensor>& remap, const c10::optional<at::Tensor>& stash) {
  const Rows rows = rows_of(memory, remap, stash);
  check_slots(slots, memory);
  TORCH_CHECK(w.sizes() == slots.sizes() && w.scalar_type() == at::kFloat && w.is_contiguous(),
              "knn_pair_mix: weights must be (R, T, K) contiguous float32 like the slots");
  const int64_t R = w.size(0), T = w.size(1), K = w.size(2), D = rows.D;
  auto out = at::empty({R, T, D}, w.options());
  const float* wp = w.data_ptr<float>();
  const int64_t* sp = slots.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, R * T, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> sum(D);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t r = item / T;
      std::fill(sum.begin(), sum.end(), 0.0f);
      for (int64_t j = 0; j < K; ++j) {
        const float weight = wp[item * K + j];
        const float* row = rows.row(r, sp[item * K + j]);
        if (row == nullptr) continue;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) sum[d] += weight * row[d];
      }
      std::copy(sum.begin(), sum.end(), op + item * D);
    }
  });
  return out;
}

}  // namespace tf_family
