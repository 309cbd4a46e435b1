// The softmax pieces shared by tf_family's native attention kernels (fused_attention.cpp, summary_attention.cpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace tf_family {

// exp for x <= 0 (softmax after subtracting the row maximum): 2^(x log2 e) split into 2^n * 2^f with a degree-6
// polynomial for 2^f on [-0.5, 0.5] (relative error < 2e-7); written so that the compiler vectorises the loop.
inline float exp_nonpositive(float x) {
  float y = x * 1.44269504088896341f;
  y = y < -126.0f ? -126.0f : y;
  const float n = (y + 12582912.0f) - 12582912.0f;  // round to nearest (1.5 * 2^23 trick; vectorises)
  const float f = y - n;
  float p = 1.535336188319500e-4f;
  p = p * f + 1.339887440266574e-3f;
  p = p * f + 9.618437357674640e-3f;
  p = p * f + 5.550332471162809e-2f;
  p = p * f + 2.402264791363012e-1f;
  p = p * f + 6.931472028550421e-1f;
  p = p * f + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

inline double exp_nonpositive(double x) { return std::exp(x); }

}  // namespace tf_family
