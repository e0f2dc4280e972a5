#include "ot/numeric.h"

#include <cmath>

#include "ot/cpu.h"

namespace ot {

namespace detail {
void convert_to_f32_avx512(const uint16_t* s, bool bf16, float* d, int64_t n);
void convert_from_f32_avx512(const float* s, uint16_t* d, bool bf16, int64_t n);
void accumulate_f32_avx512(const void* s, DType t, float w, float* acc, int64_t n);
// AVX2 + F16C: whole groups of 8; each returns how many elements it did (the scalar loop ends the row).
int64_t convert_to_f32_avx2(const uint16_t* s, bool bf16, float* d, int64_t n);
int64_t convert_from_f32_avx2(const float* s, uint16_t* d, bool bf16, int64_t n);
int64_t accumulate_f32_avx2(const void* s, DType t, float w, float* acc, int64_t n);
}  // namespace detail

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: renormalise
      int e = -1;
      do { man <<= 1; ++e; } while (!(man & 0x400u));
      u = sign | (uint32_t(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520: Inf
  if (abs < 0x38800000u) {                                   // below the smallest normal: subnormal
    // Scale so the fp16 subnormal unit (2^-24) becomes 1.0 and let the FPU round to nearest even.
    float a;
    std::memcpy(&a, &abs, 4);
    return uint16_t(sign | uint32_t(std::nearbyint(a * 16777216.0f)));
  }
  uint32_t r = abs + 0xfffu + ((abs >> 13) & 1u);  // round to nearest even at bit 13
  return uint16_t(sign | ((r - (uint32_t(127 - 15) << 23)) >> 13));
}

float round_to(DType t, float x) {
  switch (t) {
    case DType::bf16: return bf16_to_f32(f32_to_bf16(x));
    case DType::f16: return f16_to_f32(f32_to_f16(x));
    default: return x;
  }
}

void accumulate_f32(const void* src, DType t, float w, float* acc, int64_t n) {
  if (n >= 16 && cpu::has(cpu::Isa::avx512)) return detail::accumulate_f32_avx512(src, t, w, acc, n);
  int64_t i = n >= 8 && cpu::has(cpu::Isa::avx2) ? detail::accumulate_f32_avx2(src, t, w, acc, n) : 0;
  if (t == DType::f32) {
    auto* s = static_cast<const float*>(src);
    for (; i < n; ++i) acc[i] += w * s[i];
  } else {
    auto* s = static_cast<const uint16_t*>(src);
    for (; i < n; ++i) acc[i] += w * (t == DType::bf16 ? bf16_to_f32(s[i]) : f16_to_f32(s[i]));
  }
}

void convert_to_f32(const void* src, DType t, float* dst, int64_t n) {
  if (t == DType::f32) {
    if (n > 0) std::memcpy(dst, src, size_t(n) * 4);
  } else if (n >= 16 && cpu::has(cpu::Isa::avx512)) {
    detail::convert_to_f32_avx512(static_cast<const uint16_t*>(src), t == DType::bf16, dst, n);
  } else {
    auto* s = static_cast<const uint16_t*>(src);
    int64_t i = n >= 8 && cpu::has(cpu::Isa::avx2) ? detail::convert_to_f32_avx2(s, t == DType::bf16, dst, n) : 0;
    if (t == DType::bf16)
      for (; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
    else
      for (; i < n; ++i) dst[i] = f16_to_f32(s[i]);
  }
}

void convert_from_f32(const float* src, void* dst, DType t, int64_t n) {
  if (t == DType::f32) {
    if (n > 0) std::memcpy(dst, src, size_t(n) * 4);
  } else if (n >= 16 && cpu::has(cpu::Isa::avx512)) {
    detail::convert_from_f32_avx512(src, static_cast<uint16_t*>(dst), t == DType::bf16, n);
  } else {
    auto* d = static_cast<uint16_t*>(dst);
    int64_t i = n >= 8 && cpu::has(cpu::Isa::avx2) ? detail::convert_from_f32_avx2(src, d, t == DType::bf16, n) : 0;
    if (t == DType::bf16)
      for (; i < n; ++i) d[i] = f32_to_bf16(src[i]);
    else
      for (; i < n; ++i) d[i] = f32_to_f16(src[i]);
  }
}

}  // namespace ot
