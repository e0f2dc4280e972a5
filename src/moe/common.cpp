#include "src/moe/common.h"

#include <algorithm>
#include <numeric>

#include "ot/cpu.h"
#include "ot/workspace.h"
#include "src/core/knobs.h"

namespace ot::moe::impl {

void combine_rows_avx512(const WeightedRow* rows, int n, DType t, int64_t H, void* out, DType out_t, const WeightedRow* next,
                         int n_next, bool stream);
void combine_rows_avx2(const WeightedRow* rows, int n, DType t, int64_t H, void* out, DType out_t, const WeightedRow* next, int n_next,
                       bool stream);

void combine_rows(const WeightedRow* rows, int n, DType t, int64_t H, void* out, DType out_t, const WeightedRow* next, int n_next,
                  bool stream) {
  if (cpu::has(cpu::Isa::avx512)) return combine_rows_avx512(rows, n, t, H, out, out_t, next, n_next, stream);
  if (cpu::has(cpu::Isa::avx2)) return combine_rows_avx2(rows, n, t, H, out, out_t, next, n_next, stream);
  float* acc = static_cast<float*>(scratch(3, size_t(H) * 4));
  std::fill(acc, acc + H, 0.f);
  for (int j = 0; j < n; ++j) accumulate_f32(rows[j].p, t, rows[j].w, acc, H);
  convert_from_f32(acc, out, out_t, H);
}
void copy_row_avx512(void* dst, const void* src, size_t bytes, const void* next);
void copy_row_avx2(void* dst, const void* src, size_t bytes, const void* next);
void copy_row(void* dst, const void* src, size_t bytes, bool stream, const void* next) {
  if (stream && (reinterpret_cast<uintptr_t>(dst) & 63) == 0 && bytes % 64 == 0) {
    if (cpu::has(cpu::Isa::avx512)) return copy_row_avx512(dst, src, bytes, next);
    if (cpu::has(cpu::Isa::avx2)) return copy_row_avx2(dst, src, bytes, next);
  }
  if (next) prefetch_row(next, bytes);
  std::memcpy(dst, src, bytes);
}
// sfence is SSE (baseline x86-64): no per-ISA unit needed; cheap where no store was non-temporal.
void stream_fence() { __builtin_ia32_sfence(); }
// Outputs from 16 MiB on (well past the last-level cache share of a core) are stored
// non-temporally; the tests lower the bound to reach that path with small outputs.
static knobs::Knob g_stream_min_kib("moe.stream_min_kib", 16 << 10, 0, int64_t(1) << 30,
                                    "Outputs of at least this many KiB (routing copies, combines) take non-temporal stores");
bool stream_output(size_t bytes) { return bytes >= size_t(g_stream_min_kib.get()) << 10; }

void check_ids(const char* op, const char* arg, const TensorView& ids, int64_t lo, int64_t hi) {
  check_dtype(op, arg, ids, DType::i32);
  Tensor hold;
  TensorView c = contig(ids, hold);
  const int32_t* p = c.ptr<int32_t>();
  for (int64_t i = 0, n = c.numel(); i < n; ++i)
    OT_CHECK(p[i] >= lo && p[i] <= hi, op, arg, detail::cat("ids in [", lo, ", ", hi, "]"), p[i], " at flat index ", i);
}

void check_finite(const char* op, const char* arg, const TensorView& x) {
  Tensor hold;
  TensorView c = contig(x, hold);
  int64_t n = c.numel();
  bool ok = true;
  if (c.dtype == DType::f32) {
    ok = all_finite(c.ptr<float>(), n);
  } else {
    // bf16 / fp16: exponent all ones means Inf or NaN.
    const uint16_t* p = c.ptr<uint16_t>();
    uint16_t mask = c.dtype == DType::bf16 ? 0x7f80 : 0x7c00;
    for (int64_t i = 0; i < n; ++i) ok &= (p[i] & mask) != mask;
  }
  if (ok) return;
  for (int64_t i = 0; i < n; ++i)
    OT_CHECK(std::isfinite(load1(c, i)), op, arg, "finite router scores (no NaN or Inf)", load1(c, i), " at flat index ", i);
}

std::vector<int64_t> read_ints(const char* op, const char* arg, const TensorView& v) {
  OT_CHECK(v.dtype == DType::i32 || v.dtype == DType::i64, op, arg, "int32 or int64", dtype_name(v.dtype));
  std::vector<int64_t> r(static_cast<size_t>(v.numel()));
  for (int64_t i = 0; i < v.numel(); ++i) r[size_t(i)] = int64_t(get_as_double(v, i));
  return r;
}

void* scratch(int slot, size_t bytes) {
  struct Buf { void* p = nullptr; size_t n = 0; ~Buf() { aligned_free(p); } };
  thread_local Buf bufs[12];
  Buf& b = bufs[slot];
  bytes = bytes < 64 ? 64 : bytes;
  if (b.n < bytes) {
    aligned_free(b.p);
    b.p = aligned_alloc64(bytes);
    b.n = bytes;
  }
  return b.p;
}

std::vector<int32_t> stable_argsort(const int32_t* keys, int64_t n) {
  std::vector<int32_t> perm(static_cast<size_t>(n));
  if (n == 0) return perm;
  int32_t mx = *std::max_element(keys, keys + n);
  if (int64_t(mx) <= 4 * n + 4096) {
    std::vector<int64_t> start(static_cast<size_t>(mx) + 2, 0);
    for (int64_t j = 0; j < n; ++j) ++start[size_t(keys[j]) + 1];
    for (size_t e = 1; e < start.size(); ++e) start[e] += start[e - 1];
    for (int64_t j = 0; j < n; ++j) perm[size_t(start[size_t(keys[j])]++)] = int32_t(j);
    return perm;
  }
  std::iota(perm.begin(), perm.end(), 0);
  std::stable_sort(perm.begin(), perm.end(), [&](int32_t a, int32_t b) { return keys[a] < keys[b]; });
  return perm;
}

}  // namespace ot::moe::impl
