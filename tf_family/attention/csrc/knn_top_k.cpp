// Exact top-k search of the Memorizing Transformer's kNN memory: tf_family's native search kernel.
//
// Each query needs its k best allowed slots among N (inner products of L2-normalised vectors). The PyTorch path
// (`grouped_candidates` in memory/knn_search.py) writes the (queries x slots) scores of a block to memory, then
// passes over them again for group maxima, candidate gathers and selections: at 8k slots about as long again as the
// products themselves. Here a work item is one (row, head) pair and a block of its queries: the scores of a chunk of
// slots are computed into a buffer that stays in the core's cache, and each query keeps its k best so far and their
// least score, a threshold. Almost every score falls below its query's threshold after the first chunk, so the
// selection costs one vectorised comparison per score; only the few that
// pass are checked against the masks and inserted. Nothing of size (queries x slots) is ever allocated.
//
// Results are exact: the k largest allowed scores, sorted by decreasing score, with their slots; between equal scores
// the earlier slot comes first (torch.topk may keep another of equal scores at the k-th place). Ranks past
// the allowed slots hold -inf and slot 0. The products go through the BLAS that PyTorch links, single-threaded inside
// the items, which at::parallel_for spreads over the cores; the result does not depend on the number of threads.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "blas.h"

namespace tf_family {

namespace {

constexpr float kInfinity = std::numeric_limits<float>::infinity();
constexpr int64_t kBlock = 64;            // chunks of slots are multiples of this
constexpr int64_t kTileScores = 1 << 16;  // scores per (queries x slots) tile: 256 KiB of float32, in cache
constexpr int64_t kMaxQueryBlock = 128;   // queries per work item

// A (score, slot) pair as one integer whose order is the pairs' order: higher score first, then the earlier slot.
// The score's bits are mapped to an unsigned integer of the same order (negative floats flipped whole, positive ones
// with the sign bit set); the low half holds the slot's complement. Selections then compare plain integers.
inline uint64_t pack(float score, int64_t slot) {
  uint32_t bits;
  std::memcpy(&bits, &score, sizeof bits);
  bits = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  return (static_cast<uint64_t>(bits) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(slot));
}

inline float score_of(uint64_t key) {
  uint32_t bits = static_cast<uint32_t>(key >> 32);
  bits = (bits & 0x80000000u) ? (bits & 0x7FFFFFFFu) : ~bits;
  float score;
  std::memcpy(&score, &bits, sizeof score);
  return score;
}

inline int64_t slot_of(uint64_t key) { return 0xFFFFFFFFu - static_cast<uint32_t>(key); }

// One query's best pairs so far: up to 2k candidates above `threshold`, which holds the k-th best score once k have
// been kept. When the buffer is full the best k are kept (a partial selection over 2k pairs) and the threshold rises
// to the least of them: a few operations per admitted pair instead of a search for the new least at each.
struct Best {
  uint64_t* keys;
  int64_t count;
  float threshold;

  void insert(float score, int64_t slot, int64_t k) {
    if (count == 2 * k) keep_best(k);
    keys[count++] = pack(score, slot);
  }

  void keep_best(int64_t k) {
    if (count <= k) return;
    std::nth_element(keys, keys + k - 1, keys + count, std::greater<uint64_t>());
    count = k;
    threshold = score_of(keys[k - 1]);  // the least of the k kept
  }
};

struct Masks {
  const uint8_t* allowed;  // (B, H, T, N) view with any strides (0 where broadcast), or null
  int64_t outer, head, row;
  const int32_t* column;  // (N,): the column of `gone` of an expired slot, -1 otherwise; or null
  const uint8_t* gone;    // (T, C): the queries for which each expired slot is gone
  int64_t gone_columns;

  bool admits(int64_t b, int64_t h, int64_t t, int64_t slot) const {
    if (allowed != nullptr && !allowed[b * outer + h * head + t * row + slot]) return false;
    if (column != nullptr) {
      const int32_t c = column[slot];
      if (c >= 0 && gone[t * gone_columns + c]) return false;
    }
    return true;
  }
};

// Admits one score into a query's best pairs when it beats the threshold and the masks allow its slot.
inline void consider(float score, int64_t slot, Best& best, int64_t k, const Masks& masks, int64_t b, int64_t h,
                     int64_t t) {
  if (score > best.threshold && masks.admits(b, h, t, slot)) best.insert(score, slot, k);
}

// Scans one query's row of `width` scores (slots first, first + 1, ...) into its best pairs: vector comparisons
// against the threshold, the (few) passing lanes visited through their bit mask.
inline void scan_row(const float* row, int64_t width, int64_t first, Best& best, int64_t k, const Masks& masks,
                     int64_t b, int64_t h, int64_t t) {
  int64_t j = 0;
#if defined(__AVX512F__)
  for (; j + 64 <= width; j += 64) {
    const __m512 threshold = _mm512_set1_ps(best.threshold);
    const uint64_t passed = static_cast<uint64_t>(_mm512_cmp_ps_mask(_mm512_loadu_ps(row + j), threshold, _CMP_GT_OQ)) |
                            static_cast<uint64_t>(_mm512_cmp_ps_mask(_mm512_loadu_ps(row + j + 16), threshold, _CMP_GT_OQ)) << 16 |
                            static_cast<uint64_t>(_mm512_cmp_ps_mask(_mm512_loadu_ps(row + j + 32), threshold, _CMP_GT_OQ)) << 32 |
                            static_cast<uint64_t>(_mm512_cmp_ps_mask(_mm512_loadu_ps(row + j + 48), threshold, _CMP_GT_OQ)) << 48;
    for (uint64_t lanes = passed; lanes != 0; lanes &= lanes - 1) {
      const int lane = __builtin_ctzll(lanes);
      consider(row[j + lane], first + j + lane, best, k, masks, b, h, t);
    }
  }
#elif defined(__AVX2__)
  for (; j + 32 <= width; j += 32) {
    const __m256 threshold = _mm256_set1_ps(best.threshold);
    uint32_t passed = 0;
    for (int v = 0; v < 4; ++v) {
      const __m256 scores = _mm256_loadu_ps(row + j + 8 * v);
      passed |= static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(scores, threshold, _CMP_GT_OQ))) << (8 * v);
    }
    for (uint32_t lanes = passed; lanes != 0; lanes &= lanes - 1) {
      const int lane = __builtin_ctz(lanes);
      consider(row[j + lane], first + j + lane, best, k, masks, b, h, t);
    }
  }
#endif
  for (; j < width; ++j) consider(row[j], first + j, best, k, masks, b, h, t);
}

}  // namespace

// queries (R, T, D) and keys (R, N, D), float32 and contiguous, R = B * heads. `allowed`: uint8 (B, H, T, N) view
// (broadcast dimensions with stride 0, unit stride over N), True where a query may retrieve a slot; `expired_column`
// int32 (N,) and `gone` uint8 (T, C) remove a few more (query, slot) pairs. Returns the scores (R, T, K) float32
// and the slots (R, T, K) int64 of the K = min(k, N) best allowed slots, by decreasing score.
std::vector<at::Tensor> knn_top_k(const at::Tensor& queries, const at::Tensor& keys, int64_t heads,
                                  const c10::optional<at::Tensor>& allowed,
                                  const c10::optional<at::Tensor>& expired_column,
                                  const c10::optional<at::Tensor>& gone, int64_t k) {
  TORCH_CHECK(queries.dim() == 3 && keys.dim() == 3 && queries.size(0) == keys.size(0) &&
                  queries.size(2) == keys.size(2),
              "knn_top_k takes queries (R, T, D) and keys (R, N, D)");
  TORCH_CHECK(queries.scalar_type() == at::kFloat && keys.scalar_type() == at::kFloat, "knn_top_k: float32 only");
  TORCH_CHECK(queries.is_contiguous() && keys.is_contiguous(), "knn_top_k: contiguous queries and keys");
  TORCH_CHECK(heads >= 1 && queries.size(0) % heads == 0, "knn_top_k: R must be a multiple of heads");
  TORCH_CHECK(k >= 1, "knn_top_k: k must be >= 1");
  TORCH_CHECK(keys.size(1) < (int64_t{1} << 32), "knn_top_k: at most 2^32 - 1 slots");
  const int64_t R = queries.size(0), T = queries.size(1), N = keys.size(1), D = queries.size(2);
  const int64_t K = std::min(k, N);
  auto scores = at::full({R, T, K}, -kInfinity, queries.options());
  auto slots = at::zeros({R, T, K}, queries.options().dtype(at::kLong));
  if (R == 0 || T == 0 || K == 0) return {scores, slots};

  Masks masks{nullptr, 0, 0, 0, nullptr, nullptr, 0};
  if (allowed.has_value()) {
    const at::Tensor& a = *allowed;
    TORCH_CHECK(a.dim() == 4 && a.scalar_type() == at::kByte && a.size(0) * a.size(1) == R && a.size(1) == heads &&
                    a.size(2) == T && a.size(3) == N && a.stride(3) == 1,
                "knn_top_k: allowed must be a (B, H, T, N) uint8 view with unit stride over N");
    masks.allowed = a.data_ptr<uint8_t>();
    masks.outer = a.stride(0);
    masks.head = a.stride(1);
    masks.row = a.stride(2);
  }
  TORCH_CHECK(expired_column.has_value() == gone.has_value(), "knn_top_k: expired_column and gone go together");
  if (expired_column.has_value()) {
    const at::Tensor &c = *expired_column, &g = *gone;
    TORCH_CHECK(c.dim() == 1 && c.size(0) == N && c.scalar_type() == at::kInt && c.is_contiguous(),
                "knn_top_k: expired_column must be int32 (N,)");
    TORCH_CHECK(g.dim() == 2 && g.size(0) == T && g.scalar_type() == at::kByte && g.is_contiguous(),
                "knn_top_k: gone must be uint8 (T, C)");
    masks.column = c.data_ptr<int32_t>();
    masks.gone = g.data_ptr<uint8_t>();
    masks.gone_columns = g.size(1);
  }

  const int64_t query_block = std::min(T, kMaxQueryBlock);
  const int64_t query_blocks = (T + query_block - 1) / query_block;
  const int64_t chunk = std::max<int64_t>(kBlock, std::min(N, kTileScores / query_block) / kBlock * kBlock);
  const float* qp = queries.data_ptr<float>();
  const float* kp = keys.data_ptr<float>();
  float* sp = scores.data_ptr<float>();
  int64_t* ip = slots.data_ptr<int64_t>();

  at::parallel_for(0, R * query_blocks, 1, [&](int64_t begin, int64_t end) {
    const int previous = MKL_Set_Num_Threads_Local(1);
    std::vector<float> tile(query_block * chunk);
    std::vector<uint64_t> keys(query_block * 2 * K);
    std::vector<Best> best(query_block);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t r = item / query_blocks, t0 = (item % query_blocks) * query_block;
      const int64_t rows = std::min(query_block, T - t0);
      const int64_t b = r / heads, h = r % heads;
      for (int64_t i = 0; i < rows; ++i) best[i] = Best{keys.data() + i * 2 * K, 0, -kInfinity};
      const float* q = qp + (r * T + t0) * D;
      for (int64_t n0 = 0; n0 < N; n0 += chunk) {
        const int64_t width = std::min(chunk, N - n0);
        gemm_rm<float>(false, true, rows, width, D, 1.0f, q, D, kp + (r * N + n0) * D, D, 0.0f, tile.data(), width);
        for (int64_t i = 0; i < rows; ++i) scan_row(tile.data() + i * width, width, n0, best[i], K, masks, b, h, t0 + i);
      }
      for (int64_t i = 0; i < rows; ++i) {
        Best& found = best[i];
        found.keep_best(K);
        std::sort(found.keys, found.keys + found.count, std::greater<uint64_t>());
        float* out_score = sp + (r * T + t0 + i) * K;
        int64_t* out_slot = ip + (r * T + t0 + i) * K;
        for (int64_t j = 0; j < found.count; ++j) {
          out_score[j] = score_of(found.keys[j]);
          out_slot[j] = slot_of(found.keys[j]);
        }
      }
    }
    MKL_Set_Num_Threads_Local(previous);
  });
  return {scores, slots};
}

}  // namespace tf_family
