// Packing of B into column panels and of A blocks into row-major kernel dtype (see internal.h).
#include <cstring>
#include <vector>

#include "ot/numeric.h"
#include "src/gemm/internal.h"

namespace ot::gemm::detail {

int64_t panel_count(int64_t N, bool split) {
  if (split) return 2 * ((N / 2 + kNR - 1) / kNR);
  return (N + kNR - 1) / kNR;
}

static float elem_f32(const void* p, DType t, int64_t off) {
  switch (t) {
    case DType::bf16: return bf16_to_f32(static_cast<const uint16_t*>(p)[off]);
    case DType::f16: return f16_to_f32(static_cast<const uint16_t*>(p)[off]);
    default: return static_cast<const float*>(p)[off];
  }
}

// fp32 panels: [Kp][48].
static void pack_panel_f32(const void* data, DType dt, int64_t rs, int64_t cs, int64_t K, int64_t col0, int width, float* dst) {
  size_t es = dtype_size(dt);
  const char* base = static_cast<const char*>(data);
  if (width < kNR) std::memset(dst, 0, size_t(K) * kNR * 4);
  if (cs == 1) {  // rows of B contiguous: convert row pieces
    for (int64_t k = 0; k < K; ++k) convert_to_f32(base + size_t(k * rs + col0) * es, dt, dst + k * kNR, width);
  } else if (rs == 1) {  // columns contiguous ([N,K] storage): convert a column, scatter it
    thread_local std::vector<float> col;
    col.resize(size_t(K));
    for (int j = 0; j < width; ++j) {
      convert_to_f32(base + size_t((col0 + j) * cs) * es, dt, col.data(), K);
      for (int64_t k = 0; k < K; ++k) dst[k * kNR + j] = col[size_t(k)];
    }
  } else {
    for (int64_t k = 0; k < K; ++k)
      for (int j = 0; j < width; ++j) dst[k * kNR + j] = elem_f32(data, dt, k * rs + (col0 + j) * cs);
  }
}

// bf16 k-pair panels: [Kp/2][48][2]; the source is bf16 (bits copied, no rounding).
static void pack_panel_vnni(const void* data, int64_t rs, int64_t cs, int64_t K, int64_t Kp, int64_t col0, int width, uint16_t* dst) {
  const uint16_t* s = static_cast<const uint16_t*>(data);
  std::memset(dst, 0, size_t(Kp) * kNR * 2);
  if (rs == 1) {
    for (int j = 0; j < width; ++j) {
      const uint16_t* c = s + (col0 + j) * cs;
      for (int64_t k = 0; k < K; ++k) dst[(k >> 1) * 2 * kNR + 2 * j + (k & 1)] = c[k];
    }
  } else {
    for (int64_t k = 0; k < K; ++k) {
      const uint16_t* r = s + k * rs + col0 * cs;
      uint16_t* d = dst + (k >> 1) * 2 * kNR + (k & 1);
      for (int j = 0; j < width; ++j) d[2 * j] = r[j * cs];
    }
  }
}

void pack_b(const void* data, DType dt, int64_t rs, int64_t cs, const Panels& g, char* dst, int64_t p0, int64_t p1) {
  for (int64_t p = p0; p < p1; ++p) {
    int64_t col0;
    int width;
    g.cols(p, &col0, &width);
    char* d = dst + size_t(p) * g.panel_bytes();
    if (width <= 0) { std::memset(d, 0, g.panel_bytes()); continue; }
    if (g.layout == Layout::f32) pack_panel_f32(data, dt, rs, cs, g.K, col0, width, reinterpret_cast<float*>(d));
    else pack_panel_vnni(data, rs, cs, g.K, g.Kp, col0, width, reinterpret_cast<uint16_t*>(d));
  }
}

void unpack_b(const Panels& g, float* dst) {
  for (int64_t p = 0; p < g.npanels; ++p) {
    int64_t col0;
    int width;
    g.cols(p, &col0, &width);
    const char* src = g.panel(p);
    for (int64_t k = 0; k < g.K; ++k)
      for (int j = 0; j < width; ++j) {
        float v = g.layout == Layout::f32 ? reinterpret_cast<const float*>(src)[k * kNR + j]
                                          : bf16_to_f32(reinterpret_cast<const uint16_t*>(src)[(k >> 1) * 2 * kNR + 2 * j + (k & 1)]);
        dst[k * g.N + col0 + j] = v;
      }
  }
}

// int8 -> fp32 or bf16, exact (|q| <= 128 needs 8 significant bits: the low half of the fp32 is 0).
static void convert_i8(const int8_t* src, int64_t cs, int64_t K, Layout layout, void* dst) {
  if (layout == Layout::f32) {
    float* d = static_cast<float*>(dst);
    for (int64_t k = 0; k < K; ++k) d[k] = float(src[k * cs]);
    return;
  }
  uint16_t* d = static_cast<uint16_t*>(dst);
  for (int64_t k = 0; k < K; ++k) {
    float f = float(src[k * cs]);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    d[k] = uint16_t(bits >> 16);
  }
}

void pack_a(const ASource& a, int64_t m0, int64_t mc, int64_t mc_pad, int64_t K, Layout layout, void* dst, int64_t lda) {
  size_t es = dtype_size(a.dtype), de = layout_elt(layout);
  thread_local std::vector<float> tmp;
  for (int64_t i = 0; i < mc_pad; ++i) {
    char* d = static_cast<char*>(dst) + size_t(i * lda) * de;
    if (i >= mc) { std::memset(d, 0, size_t(lda) * de); continue; }
    int64_t r = a.rows ? a.rows[m0 + i] : m0 + i;
    const char* src = static_cast<const char*>(a.data) + size_t(r * a.rs) * es;
    if (a.dtype == DType::i8) {
      convert_i8(reinterpret_cast<const int8_t*>(src), a.cs, K, layout, d);
    } else if (a.cs != 1) {
      tmp.resize(size_t(K));
      for (int64_t k = 0; k < K; ++k) tmp[size_t(k)] = elem_f32(src, a.dtype, k * a.cs);
      if (layout == Layout::f32) std::memcpy(d, tmp.data(), size_t(K) * 4);
      else convert_from_f32(tmp.data(), d, DType::bf16, K);
    } else if (layout == Layout::f32) {
      convert_to_f32(src, a.dtype, reinterpret_cast<float*>(d), K);
    } else if (a.dtype == DType::bf16) {
      std::memcpy(d, src, size_t(K) * 2);
    } else if (a.dtype == DType::f32) {
      convert_from_f32(reinterpret_cast<const float*>(src), d, DType::bf16, K);
    } else {
      tmp.resize(size_t(K));
      convert_to_f32(src, a.dtype, tmp.data(), K);
      convert_from_f32(tmp.data(), d, DType::bf16, K);
    }
    if (lda > K) std::memset(d + size_t(K) * de, 0, size_t(lda - K) * de);
  }
}

}  // namespace ot::gemm::detail
