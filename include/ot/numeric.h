// bf16 / fp16 <-> fp32 conversion (round to nearest even; NaN stays NaN).
#pragma once
#include <cstdint>
#include <cstring>

#include "ot/tensor.h"

namespace ot {

struct bf16 { uint16_t bits; };
struct f16 { uint16_t bits; };

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Round a float through a storage dtype (for references that mimic bf16/fp16 storage).
float round_to(DType t, float x);

// Bulk conversions between float dtypes (f32, bf16, f16), vectorised where the ISA allows.
void convert_to_f32(const void* src, DType src_dtype, float* dst, int64_t n);
void convert_from_f32(const float* src, void* dst, DType dst_dtype, int64_t n);
// acc[i] += w * src[i] for a float-dtype row: the weighted combine of routing outputs, converted in
// registers (no fp32 copy of the row).
void accumulate_f32(const void* src, DType src_dtype, float w, float* acc, int64_t n);

}  // namespace ot
