// Helpers shared by the MoE entry points, fast paths and references: argument checks that name
// the argument, contiguous copies of strided inputs, and row loads/stores in fp32.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ot/error.h"
#include "ot/numeric.h"
#include "ot/output_pool.h"
#include "ot/tensor.h"

namespace ot::moe::impl {

// Returns a contiguous view of v, copying into `hold` only when v is strided.
inline TensorView contig(const TensorView& v, Tensor& hold) {
  if (!v.defined() || v.is_contiguous()) return v;
  hold = Tensor::copy_of(v);
  return hold.view();
}

inline void check_ndim(const char* op, const char* arg, const TensorView& v, int ndim) {
  OT_CHECK(v.ndim == ndim, op, arg, detail::cat("a ", ndim, "-D tensor"), v.shape_str());
}
inline void check_float(const char* op, const char* arg, const TensorView& v) {
  OT_CHECK(is_float(v.dtype), op, arg, "bf16, fp16 or fp32", dtype_name(v.dtype));
}
inline void check_dtype(const char* op, const char* arg, const TensorView& v, DType t) {
  OT_CHECK(v.dtype == t, op, arg, dtype_name(t), dtype_name(v.dtype));
}
inline void check_dim(const char* op, const char* arg, const TensorView& v, int d, int64_t want) {
  OT_CHECK(v.size(d) == want, op, arg, detail::cat("size ", want, " in dim ", d), v.shape_str());
}
// Every element of an int32 tensor in [lo, hi].
void check_ids(const char* op, const char* arg, const TensorView& ids, int64_t lo, int64_t hi);
// Every element finite (router scores).
void check_finite(const char* op, const char* arg, const TensorView& x);
// Reads an int32/int64 tensor into int64 values.
std::vector<int64_t> read_ints(const char* op, const char* arg, const TensorView& v);

// No element is Inf or NaN: an integer test of the exponent bits (all ones carries into bit 31),
// which the compiler vectorises; a std::isfinite loop is not (~9 instructions an element).
inline bool all_finite(const float* p, int64_t n) {
  uint32_t acc = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, p + i, 4);
    acc |= (u & 0x7f800000u) + 0x00800000u;
  }
  return !(acc & 0x80000000u);
}

// fp32 row access of a contiguous float tensor.
inline void load_f32(const TensorView& v, int64_t elem_off, float* dst, int64_t n) {
  convert_to_f32(static_cast<const char*>(v.data) + elem_off * int64_t(dtype_size(v.dtype)), v.dtype, dst, n);
}
inline void store_f32(const TensorView& v, int64_t elem_off, const float* src, int64_t n) {
  convert_from_f32(src, static_cast<char*>(v.data) + elem_off * int64_t(dtype_size(v.dtype)), v.dtype, n);
}
inline float load1(const TensorView& v, int64_t i) {
  switch (v.dtype) {
    case DType::f32: return v.ptr<float>()[i];
    case DType::bf16: return bf16_to_f32(v.ptr<uint16_t>()[i]);
    case DType::f16: return f16_to_f32(v.ptr<uint16_t>()[i]);
    case DType::i32: return float(v.ptr<int32_t>()[i]);
    case DType::i64: return float(v.ptr<int64_t>()[i]);
    case DType::u8: return float(v.ptr<uint8_t>()[i]);
    case DType::i8: return float(v.ptr<int8_t>()[i]);
  }
  return 0;
}
// Gathers of whole rows from scattered places: ask for the next row while this one is summed,
// since the hardware prefetcher only ramps up inside a row.
inline void prefetch_row(const void* p, size_t bytes) {
  for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(static_cast<const char*>(p) + o);
}
inline const char* row_ptr(const TensorView& v, int64_t row, int64_t row_elems) {
  return static_cast<const char*>(v.data) + row * row_elems * int64_t(dtype_size(v.dtype));
}

// The weighted combine of gathered rows (unpermute, finalize routing): out = sum_j w_j * rows_j, in
// fp32 registers, cast (RNE) to out's dtype. All rows share one float dtype; n = 0 writes zeros.
// `next` (optional) are the rows of the following output, whose first blocks are prefetched while
// this one's last blocks are summed.
// stream: non-temporal stores of whole 64-byte lines (call stream_fence() before the results are
// read by another thread); for outputs far larger than the caches.
struct WeightedRow {
  const void* p;
  float w;
};
void combine_rows(const WeightedRow* rows, int n, DType t, int64_t H, void* out, DType out_t, const WeightedRow* next = nullptr,
                  int n_next = 0, bool stream = false);
void stream_fence();
// One row copy of `bytes` (row gathers of init routing and permute). stream: non-temporal stores when
// dst is 64-byte aligned and bytes a multiple of 64 (call stream_fence() before the results are read
// by another thread), so an output far larger than the caches is not read for ownership first.
// `next` (optional): the source row copied after this one, prefetched line by line meanwhile.
void copy_row(void* dst, const void* src, size_t bytes, bool stream, const void* next = nullptr);
// Whether non-temporal stores pay off for an output of this many bytes.
bool stream_output(size_t bytes);

// Stable sort of flat expert keys: perm[i] = source index placed at i. Counting sort when keys are
// dense, std::stable_sort otherwise. Keys must be >= 0.
std::vector<int32_t> stable_argsort(const int32_t* keys, int64_t n);

// Grow-only per-thread scratch (slots 0..11) reused across calls, so hot paths (moe_ffn's h and
// fp32 accumulator: 0, 1; the quantised down output: 2; combine_rows: 3; the training paths: 4..11) do not pay fresh page faults
// on every call. Valid until the next call with the same slot on the same thread.
void* scratch(int slot, size_t bytes);

// Static int8 quantisation (quant_mode 0): round half to even, saturate (so +-Inf give 127 / -128).
// NaN gives 0: static mode has no per-row scale that could carry the NaN the way dynamic mode's does,
// and converting a NaN float to int8_t is undefined behaviour.
inline int8_t quant_i8(float v) {
  if (v != v) return 0;
  float r = std::nearbyint(v);
  r = r < -128.f ? -128.f : (r > 127.f ? 127.f : r);
  return int8_t(r);
}

}  // namespace ot::moe::impl
