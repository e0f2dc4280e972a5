// Portable row hooks of the GDN layer kernels (causal_conv1d_kernels.inc, rms_norm_gated_kernels.inc):
// dtype conversion of a row to / from fp32, SiLU and its derivative. Internal linkage: the per-ISA
// builds of the same kernels never share a copy.
#pragma once
#include <cmath>
#include <cstdint>

#include "ot/numeric.h"
#include "src/core/elem_at.h"

namespace ot::gdn::detail {
namespace {

inline void load_row(const void* p, DType t, int64_t n, float* dst) {
  if (t == DType::f32) {
    const float* s = static_cast<const float*>(p);
    for (int64_t i = 0; i < n; ++i) dst[i] = s[i];
  } else if (t == DType::bf16) {
    const uint16_t* s = static_cast<const uint16_t*>(p);
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
  } else {
    const uint16_t* s = static_cast<const uint16_t*>(p);
    for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
  }
}
inline void store_row(const float* src, void* p, DType t, int64_t n) {
  if (t == DType::f32) {
    float* d = static_cast<float*>(p);
    for (int64_t i = 0; i < n; ++i) d[i] = src[i];
  } else if (t == DType::bf16) {
    uint16_t* d = static_cast<uint16_t*>(p);
    for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
  } else {
    uint16_t* d = static_cast<uint16_t*>(p);
    for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
  }
}
inline float sigmoid1(float v) { return 1.f / (1.f + std::exp(-v)); }
// sig[i] = sigmoid(v[i]).
inline void sigmoid_row(const float* v, float* sig, int64_t n) {
  for (int64_t i = 0; i < n; ++i) sig[i] = sigmoid1(v[i]);
}
inline void silu_row(float* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) v[i] *= sigmoid1(v[i]);
}
// g[i] *= silu'(a[i]) = s (1 + a (1 - s)), s = sigmoid(a).
inline void silu_grad_row(const float* a, float* g, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float s = sigmoid1(a[i]);
    g[i] *= s * (1.f + a[i] * (1.f - s));
  }
}

}  // namespace
}  // namespace ot::gdn::detail
