// In-register 8x8 transpose of fp32 / dword lanes on ymm (the router's 8-tokens-in-lanes blocks,
// the backward forms' W^T pack). Only for translation units built with the AVX2 flags; internal
// linkage (anonymous namespace) so no other ISA's translation unit can share a copy.
#pragma once
#include <immintrin.h>

namespace ot::simd {
namespace {

// v[j] lane i <- v[i] lane j: unpack 32, shuffle 64, then swap 128-bit halves (24 shuffles).
__attribute__((always_inline)) inline void transpose8x8(__m256* v) {
  __m256 t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {  // u[4i + c], 128-bit half h: rows 4i..4i+3 of column c + 4h
    u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int c = 0; c < 4; ++c) {
    v[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
    v[4 + c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
  }
}

}  // namespace
}  // namespace ot::simd
