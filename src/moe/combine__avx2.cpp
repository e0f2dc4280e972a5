// Weighted combine of gathered rows, AVX2 + FMA + F16C: the AVX-512 design (combine__avx512.cpp) in
// 8 lanes. The output row is built 64 lanes at a time in eight fp32 registers (16 ymm registers: the
// other eight hold the weight and the loads), the rows are prefetched a few blocks ahead (into the
// next output's rows near the end), and whole output lines may be stored non-temporally. The sum is
// a fused multiply-add per row in row order, as the portable path's 8-lane groups (accumulate_f32 at
// the avx2 cap) do, so those lanes are bit-identical to it. Also the streaming row copy of init
// routing and permute.
#include <cstdint>
#include <cstring>

#include "src/core/cvt_avx2.h"
#include "src/moe/common.h"

namespace ot::moe::impl {
namespace {

inline __m256 load8(const void* p, DType t, int64_t i) {
  if (t == DType::f32) return _mm256_loadu_ps(static_cast<const float*>(p) + i);
  return simd::half8_to_f32(static_cast<const uint16_t*>(p) + i, t == DType::bf16);
}

// The last m < 8 lanes through a zeroed 8-lane buffer (AVX2 has no 16-bit masked loads or stores).
inline __m256 load_tail(const void* p, DType t, int64_t i, int64_t m) {
  alignas(32) char b[32] = {};
  const size_t es = dtype_size(t);
  std::memcpy(b, static_cast<const char*>(p) + i * int64_t(es), size_t(m) * es);
  return load8(b, t, 0);
}

inline __m128i to_half8(DType t, __m256 v) { return t == DType::bf16 ? simd::f32_to_bf16x8(v) : simd::f32_to_f16x8(v); }

inline void store8(void* p, DType t, int64_t i, __m256 v) {
  if (t == DType::f32) return _mm256_storeu_ps(static_cast<float*>(p) + i, v);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(p) + i), to_half8(t, v));
}

inline void store_tail(void* p, DType t, int64_t i, int64_t m, __m256 v) {
  alignas(32) char b[32];
  store8(b, t, 0, v);
  const size_t es = dtype_size(t);
  std::memcpy(static_cast<char*>(p) + i * int64_t(es), b, size_t(m) * es);
}

// Stores 16 lanes; `nt`: non-temporal (p + i 32-byte aligned: 16-bit outputs pair two vectors into
// one 32-byte store).
inline void store16(void* p, DType t, int64_t i, __m256 a, __m256 b, bool nt) {
  if (t == DType::f32) {
    float* q = static_cast<float*>(p) + i;
    if (nt) { _mm256_stream_ps(q, a); _mm256_stream_ps(q + 8, b); }
    else { _mm256_storeu_ps(q, a); _mm256_storeu_ps(q + 8, b); }
    return;
  }
  const __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(to_half8(t, a)), to_half8(t, b), 1);
  auto* q = reinterpret_cast<__m256i*>(static_cast<uint16_t*>(p) + i);
  if (nt) _mm256_stream_si256(q, h);
  else _mm256_storeu_si256(q, h);
}

// Prefetch distance: 512 lanes ahead, as the AVX-512 kernel's 4 blocks of 128 (1 KiB of each bf16
// row; Zen 3's L1 is 32 KiB, 8 KiB over K 8 rows still fits).
constexpr int64_t kAheadLanes = 512;

inline void prefetch_block(const WeightedRow* rows, int n, int64_t off, size_t bytes) {
  for (int j = 0; j < n; ++j)
    for (size_t o = 0; o < bytes; o += 64) _mm_prefetch(static_cast<const char*>(rows[j].p) + off + o, _MM_HINT_T0);
}

}  // namespace

void combine_rows_avx2(const WeightedRow* rows, int n, DType t, int64_t H, void* out, DType out_t, const WeightedRow* next, int n_next,
                       bool stream) {
  const size_t es = dtype_size(t);
  const bool nt = stream && (reinterpret_cast<uintptr_t>(out) & 63) == 0;
  int64_t h = 0;
  for (; h + 64 <= H; h += 64) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (int j = 0; j < n; ++j) {
      const void* p = rows[j].p;
      const __m256 w = _mm256_set1_ps(rows[j].w);
      a0 = _mm256_fmadd_ps(w, load8(p, t, h), a0);
      a1 = _mm256_fmadd_ps(w, load8(p, t, h + 8), a1);
      a2 = _mm256_fmadd_ps(w, load8(p, t, h + 16), a2);
      a3 = _mm256_fmadd_ps(w, load8(p, t, h + 24), a3);
      a4 = _mm256_fmadd_ps(w, load8(p, t, h + 32), a4);
      a5 = _mm256_fmadd_ps(w, load8(p, t, h + 40), a5);
      a6 = _mm256_fmadd_ps(w, load8(p, t, h + 48), a6);
      a7 = _mm256_fmadd_ps(w, load8(p, t, h + 56), a7);
    }
    // The block kAheadLanes on: in these rows, or past their end in the next output's rows.
    const int64_t at = h + kAheadLanes;
    if (at + 64 <= H) prefetch_block(rows, n, at * int64_t(es), 64 * es);
    else if (at >= H && at - H + 64 <= H) prefetch_block(next, n_next, (at - H) * int64_t(es), 64 * es);
    store16(out, out_t, h, a0, a1, nt);
    store16(out, out_t, h + 16, a2, a3, nt);
    store16(out, out_t, h + 32, a4, a5, nt);
    store16(out, out_t, h + 48, a6, a7, nt);
  }
  for (; h + 8 <= H; h += 8) {
    __m256 a = _mm256_setzero_ps();
    for (int j = 0; j < n; ++j) a = _mm256_fmadd_ps(_mm256_set1_ps(rows[j].w), load8(rows[j].p, t, h), a);
    store8(out, out_t, h, a);
  }
  if (h < H) {
    __m256 a = _mm256_setzero_ps();
    for (int j = 0; j < n; ++j) a = _mm256_fmadd_ps(_mm256_set1_ps(rows[j].w), load_tail(rows[j].p, t, h, H - h), a);
    store_tail(out, out_t, h, H - h, a);
  }
}

// Whole 64-byte lines, non-temporal (dst aligned), four lines loaded before they are stored; the next
// source row is prefetched line by line.
void copy_row_avx2(void* dst, const void* src, size_t bytes, const void* next) {
  const char* s = static_cast<const char*>(src);
  char* d = static_cast<char*>(dst);
  const char* nx = static_cast<const char*>(next);
  auto ld = [&](size_t o) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + o)); };
  auto st = [&](size_t o, __m256i v) { _mm256_stream_si256(reinterpret_cast<__m256i*>(d + o), v); };
  size_t o = 0;
  for (; o + 256 <= bytes; o += 256) {
    if (nx)
      for (size_t l = 0; l < 256; l += 64) _mm_prefetch(nx + o + l, _MM_HINT_T0);
    const __m256i v0 = ld(o), v1 = ld(o + 32), v2 = ld(o + 64), v3 = ld(o + 96), v4 = ld(o + 128), v5 = ld(o + 160), v6 = ld(o + 192),
                  v7 = ld(o + 224);
    st(o, v0); st(o + 32, v1); st(o + 64, v2); st(o + 96, v3); st(o + 128, v4); st(o + 160, v5); st(o + 192, v6); st(o + 224, v7);
  }
  for (; o < bytes; o += 64) {
    if (nx) _mm_prefetch(nx + o, _MM_HINT_T0);
    const __m256i v0 = ld(o), v1 = ld(o + 32);
    st(o, v0);
    st(o + 32, v1);
  }
}

}  // namespace ot::moe::impl
