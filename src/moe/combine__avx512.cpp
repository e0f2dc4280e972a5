// Weighted combine of gathered rows, AVX-512: the output row is built 128 lanes at a time in eight
// fp32 registers (no accumulator round trip through memory per input row), the rows are prefetched
// a few blocks ahead (into the next output's rows near the end), and whole output lines may be
// stored non-temporally. Also the streaming row copy of init routing and permute.
#include <cstdint>

#include "src/core/cvt_avx512.h"
#include "src/moe/common.h"

namespace ot::moe::impl {
namespace {

inline __m512 load16(const void* p, DType t, int64_t i, __mmask16 m) {
  if (t == DType::f32) return _mm512_maskz_loadu_ps(m, static_cast<const float*>(p) + i);
  __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + i);
  return t == DType::bf16 ? simd::bf16x16_to_f32(h) : simd::f16x16_to_f32(h);
}
inline __m512 load16(const void* p, DType t, int64_t i) {
  if (t == DType::f32) return _mm512_loadu_ps(static_cast<const float*>(p) + i);
  __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(p) + i));
  return t == DType::bf16 ? simd::bf16x16_to_f32(h) : simd::f16x16_to_f32(h);
}

// Stores 16 lanes; `nt`: non-temporal (16-bit outputs pair two vectors into one 64-byte line).
inline void store16(void* p, DType t, int64_t i, __m512 v, __mmask16 m) {
  if (t == DType::f32) return _mm512_mask_storeu_ps(static_cast<float*>(p) + i, m, v);
  __m256i h = t == DType::bf16 ? simd::f32_to_bf16x16(v) : simd::f32_to_f16x16(v);
  _mm256_mask_storeu_epi16(static_cast<uint16_t*>(p) + i, m, h);
}
inline void store32(void* p, DType t, int64_t i, __m512 a, __m512 b, bool nt) {
  if (t == DType::f32) {
    float* q = static_cast<float*>(p) + i;
    if (nt) { _mm512_stream_ps(q, a); _mm512_stream_ps(q + 16, b); }
    else { _mm512_storeu_ps(q, a); _mm512_storeu_ps(q + 16, b); }
    return;
  }
  bool bf = t == DType::bf16;
  __m512i h = _mm512_inserti64x4(_mm512_castsi256_si512(bf ? simd::f32_to_bf16x16(a) : simd::f32_to_f16x16(a)),
                                 bf ? simd::f32_to_bf16x16(b) : simd::f32_to_f16x16(b), 1);
  void* q = static_cast<uint16_t*>(p) + i;
  if (nt) _mm512_stream_si512(static_cast<__m512i*>(q), h);
  else _mm512_storeu_si512(q, h);
}

// Prefetch distance of the combine: 4 blocks of 128 lanes (1 KiB of each bf16 row, 8 KiB over K 8
// rows) ahead. A whole output ahead (the next output's block h, 32 KiB at K 8, H 2048) let the
// prefetched lines leave the 48 KiB L1 before use: 4-5% slower (AMD Zen 5 VM, 2026-12-01).
constexpr int64_t kAheadLanes = 4 * 128;

inline void prefetch_block(const WeightedRow* rows, int n, int64_t off, size_t bytes) {
  for (int j = 0; j < n; ++j)
    for (size_t o = 0; o < bytes; o += 64) _mm_prefetch(static_cast<const char*>(rows[j].p) + off + o, _MM_HINT_T0);
}

}  // namespace

void combine_rows_avx512(const WeightedRow* rows, int n, DType t, int64_t H, void* out, DType out_t, const WeightedRow* next,
                         int n_next, bool stream) {
  const size_t es = dtype_size(t);
  const bool nt = stream && (reinterpret_cast<uintptr_t>(out) & 63) == 0;
  int64_t h = 0;
  for (; h + 128 <= H; h += 128) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (int j = 0; j < n; ++j) {
      const void* p = rows[j].p;
      const __m512 w = _mm512_set1_ps(rows[j].w);
      a0 = _mm512_fmadd_ps(w, load16(p, t, h), a0);
      a1 = _mm512_fmadd_ps(w, load16(p, t, h + 16), a1);
      a2 = _mm512_fmadd_ps(w, load16(p, t, h + 32), a2);
      a3 = _mm512_fmadd_ps(w, load16(p, t, h + 48), a3);
      a4 = _mm512_fmadd_ps(w, load16(p, t, h + 64), a4);
      a5 = _mm512_fmadd_ps(w, load16(p, t, h + 80), a5);
      a6 = _mm512_fmadd_ps(w, load16(p, t, h + 96), a6);
      a7 = _mm512_fmadd_ps(w, load16(p, t, h + 112), a7);
    }
    // The block kAheadLanes on: in these rows, or past their end in the next output's rows.
    const int64_t at = h + kAheadLanes;
    if (at + 128 <= H) prefetch_block(rows, n, at * int64_t(es), 128 * es);
    else if (at >= H && at - H + 128 <= H) prefetch_block(next, n_next, (at - H) * int64_t(es), 128 * es);
    store32(out, out_t, h, a0, a1, nt);
    store32(out, out_t, h + 32, a2, a3, nt);
    store32(out, out_t, h + 64, a4, a5, nt);
    store32(out, out_t, h + 96, a6, a7, nt);
  }
  for (; h < H; h += 16) {
    __mmask16 m = H - h >= 16 ? __mmask16(0xffff) : __mmask16((1u << (H - h)) - 1);
    __m512 a = _mm512_setzero_ps();
    for (int j = 0; j < n; ++j) a = _mm512_fmadd_ps(_mm512_set1_ps(rows[j].w), load16(rows[j].p, t, h, m), a);
    store16(out, out_t, h, a, m);
  }
}

// Whole 64-byte lines, non-temporal (dst aligned), four lines loaded before they are stored; the next
// source row is prefetched line by line.
void copy_row_avx512(void* dst, const void* src, size_t bytes, const void* next) {
  const char* s = static_cast<const char*>(src);
  char* d = static_cast<char*>(dst);
  const char* n = static_cast<const char*>(next);
  size_t o = 0;
  for (; o + 256 <= bytes; o += 256) {
    if (n)
      for (size_t l = 0; l < 256; l += 64) _mm_prefetch(n + o + l, _MM_HINT_T0);
    const __m512i a = _mm512_loadu_si512(s + o), b = _mm512_loadu_si512(s + o + 64), c = _mm512_loadu_si512(s + o + 128),
                  e = _mm512_loadu_si512(s + o + 192);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d + o), a);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d + o + 64), b);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d + o + 128), c);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d + o + 192), e);
  }
  for (; o < bytes; o += 64) {
    if (n) _mm_prefetch(n + o, _MM_HINT_T0);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d + o), _mm512_loadu_si512(s + o));
  }
}

}  // namespace ot::moe::impl
