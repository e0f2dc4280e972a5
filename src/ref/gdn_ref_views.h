// How the GDN references read the operators' tensors, written apart from the fast path's
// accessors: element (b, t, h, d) of a token tensor in either layout, element (n, h, i, j) of a
// state, and the sequences and chunks of a batch from cu_seqlens.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "ot/gdn.h"
#include "ot/numeric.h"
#include "ot/tensor.h"

namespace ot::gdn::refimpl {

// Token tensors as the operators take them. Vectors (q, k, v, w, u, A, ...): BTHD [B, T, H, D] or
// packed [T, H, D]; BHTD [B, H, T, D] or packed [H, T, D]. Scalars (g, beta, g_cumsum): the same
// without D. A packed tensor is one batch row.
struct Tokens {
  TensorView v;
  Layout layout = Layout::BTHD;
  bool scalar = false;
  int64_t B = 0, T = 0, H = 0, D = 1;

  Tokens() = default;
  Tokens(const TensorView& view, Layout l, bool is_scalar) : v(view), layout(l), scalar(is_scalar) {
    if (!v.defined() || !v.data) return;
    const bool packed = v.ndim == (scalar ? 2 : 3);
    const int o = packed ? 0 : 1;  // dims before (t, h)
    B = packed ? 1 : v.size(0);
    T = v.size(l == Layout::BTHD ? o : o + 1);
    H = v.size(l == Layout::BTHD ? o + 1 : o);
    D = scalar ? 1 : v.size(o + 2);
  }
  bool defined() const { return v.data != nullptr; }
  // Offset in elements of (b, t, h, d).
  int64_t offset(int64_t b, int64_t t, int64_t h, int64_t d) const {
    const bool packed = v.ndim == (scalar ? 2 : 3);
    const int o = packed ? 0 : 1;
    int64_t off = packed ? 0 : b * v.stride(0);
    off += t * v.stride(layout == Layout::BTHD ? o : o + 1) + h * v.stride(layout == Layout::BTHD ? o + 1 : o);
    if (!scalar) off += d * v.stride(o + 2);
    return off;
  }
  double get(int64_t b, int64_t t, int64_t h, int64_t d) const { return load(v.data, v.dtype, offset(b, t, h, d)); }
  void set(int64_t b, int64_t t, int64_t h, int64_t d, double x) const { store(v.data, v.dtype, offset(b, t, h, d), x); }

  static double load(const void* p, DType t, int64_t off) {
    switch (t) {
      case DType::f32: return static_cast<const float*>(p)[off];
      case DType::bf16: return bf16_to_f32(static_cast<const uint16_t*>(p)[off]);
      case DType::f16: return f16_to_f32(static_cast<const uint16_t*>(p)[off]);
      default: return 0.0;
    }
  }
  static void store(void* p, DType t, int64_t off, double x) {
    switch (t) {
      case DType::f32: static_cast<float*>(p)[off] = float(x); break;
      case DType::bf16: static_cast<uint16_t*>(p)[off] = f32_to_bf16(float(x)); break;
      case DType::f16: static_cast<uint16_t*>(p)[off] = f32_to_f16(float(x)); break;
      default: break;
    }
  }
};
inline Tokens vec(const TensorView& v, Layout l) { return Tokens(v, l, false); }
inline Tokens scal(const TensorView& v, Layout l) { return Tokens(v, l, true); }

// A state [N, HV, DK, DV] (fp32, bf16 or fp16; any strides); element (n, h, i, j), or (n, h, e) with
// e = i * DV + j.
struct State {
  TensorView v;
  State() = default;
  explicit State(const TensorView& view) : v(view) {}
  bool defined() const { return v.defined() && v.data; }
  int64_t offset(int64_t n, int64_t h, int64_t e) const {
    const int64_t DV = v.size(3);
    return n * v.stride(0) + h * v.stride(1) + (e / DV) * v.stride(2) + (e % DV) * v.stride(3);
  }
  double get(int64_t n, int64_t h, int64_t e) const { return Tokens::load(v.data, v.dtype, offset(n, h, e)); }
  void set(int64_t n, int64_t h, int64_t e, double x) const { Tokens::store(v.data, v.dtype, offset(n, h, e), x); }
};

// One chunk: sequence n, batch row b, first token t0, L tokens (at most kChunk).
struct Chunk {
  int64_t n, b, t0, L;
};
// The sequences of a batch: B rows of T tokens, or (B == 1) the spans of cu_seqlens [N+1]; each
// cut into chunks of kChunk tokens, numbered sequence by sequence (the row order of the per-chunk
// states h [num_chunks, HV, DK, DV]).
struct Sequences {
  std::vector<int64_t> row, bos, len, first_chunk;  // first_chunk: [N+1]
  std::vector<Chunk> chunks;
  Sequences(int64_t B, int64_t T, const std::vector<int64_t>& cu_seqlens) {
    if (cu_seqlens.empty())
      for (int64_t b = 0; b < B; ++b) row.push_back(b), bos.push_back(0), len.push_back(T);
    else
      for (size_t n = 0; n + 1 < cu_seqlens.size(); ++n)
        row.push_back(0), bos.push_back(cu_seqlens[n]), len.push_back(cu_seqlens[n + 1] - cu_seqlens[n]);
    for (size_t n = 0; n < len.size(); ++n) {
      first_chunk.push_back(int64_t(chunks.size()));
      for (int64_t t = 0; t < len[n]; t += kChunk) chunks.push_back({int64_t(n), row[n], bos[n] + t, std::min(kChunk, len[n] - t)});
    }
    first_chunk.push_back(int64_t(chunks.size()));
  }
  int64_t num_seqs() const { return int64_t(len.size()); }
};

}  // namespace ot::gdn::refimpl
