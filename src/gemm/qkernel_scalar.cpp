// Portable kernels of the quantised grouped GEMM (layout: quant_internal.h). Any row count.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "src/gemm/quant_internal.h"

namespace ot::gemm::qdetail {

namespace {

template <bool I4>
void qkernel_scalar(int rows, const float* a, int64_t lda, const float* asum, int64_t ldas, const char* panel, int64_t groups, int64_t len,
                    float* c) {
  const WeightFormat f = I4 ? WeightFormat::int4 : WeightFormat::int8;
  const size_t pb = pair_bytes(f);
  std::memset(c, 0, sizeof(float) * size_t(rows) * kQNR);
  for (int64_t j = 0; j < groups; ++j) {
    const float* s = reinterpret_cast<const float*>(panel);
    const float* m = s + kQNR;
    const unsigned char* codes = reinterpret_cast<const unsigned char*>(panel + kQHeader);
    for (int r = 0; r < rows; ++r) {
      float part[kQNR] = {};
      const float* ar = a + r * lda + j * len;
      for (int64_t k = 0; k < len; ++k) {
        const unsigned char* pair = codes + size_t(k / 2) * pb;
        for (int n = 0; n < kQNR; ++n) part[n] += ar[k] * float(code_at(pair, I4, int(k % 2), n));
      }
      for (int n = 0; n < kQNR; ++n) c[r * kQNR + n] += s[n] * part[n] + m[n] * asum[r * ldas + j];
    }
    panel += group_bytes(f, len);
  }
}

}  // namespace

void qkernel_scalar_int8(int rows, const float* a, int64_t lda, const float* asum, int64_t ldas, const char* panel, int64_t groups, int64_t len,
                         float* c) {
  qkernel_scalar<false>(rows, a, lda, asum, ldas, panel, groups, len, c);
}
void qkernel_scalar_int4(int rows, const float* a, int64_t lda, const float* asum, int64_t ldas, const char* panel, int64_t groups, int64_t len,
                         float* c) {
  qkernel_scalar<true>(rows, a, lda, asum, ldas, panel, groups, len, c);
}

template <bool I4> void qdequant_scalar(const char* group, int64_t k0, int64_t kc, float* w) {
  const size_t pb = pair_bytes(I4 ? WeightFormat::int4 : WeightFormat::int8);
  const float* s = reinterpret_cast<const float*>(group);
  const float* m = s + kQNR;
  const unsigned char* codes = reinterpret_cast<const unsigned char*>(group + kQHeader);
  for (int64_t k = 0; k < kc; ++k)
    for (int n = 0; n < kQNR; ++n) {
      const unsigned char* pair = codes + size_t((k0 + k) / 2) * pb;
      w[k * kQNR + n] = s[n] * float(code_at(pair, I4, int((k0 + k) % 2), n)) + m[n];
    }
}
void qdequant_scalar_int8(const char* group, int64_t k0, int64_t kc, float* w) { qdequant_scalar<false>(group, k0, kc, w); }
void qdequant_scalar_int4(const char* group, int64_t k0, int64_t kc, float* w) { qdequant_scalar<true>(group, k0, kc, w); }

void qtile_scalar(int rows, int64_t kc, const float* a, int64_t lda, const float* w, float* c) {
  for (int r = 0; r < rows; ++r)
    for (int64_t k = 0; k < kc; ++k)
      for (int n = 0; n < kQNR; ++n) c[r * kQNR + n] += a[r * lda + k] * w[k * kQNR + n];
}

// The activations' int16 blocks (QActI16Fn, quant_internal.h).
float qact_i16_scalar(const float* a, int64_t len, int16_t* q, float* scale) {
  double total = 0;
  for (int64_t k0 = 0, b = 0; k0 < len; k0 += kQABlock, ++b) {
    const int64_t n = std::min<int64_t>(kQABlock, len - k0);
    float amax = 0;
    bool finite = true;
    for (int64_t k = 0; k < n; ++k) {
      finite = finite && std::isfinite(a[k0 + k]);
      amax = std::max(amax, std::fabs(a[k0 + k]));
    }
    const float inv = finite && amax > 0 ? 32767.f / amax : 0.f;
    scale[b] = finite ? amax / 32767.f : std::numeric_limits<float>::quiet_NaN();
    int64_t isum = 0;
    for (int64_t k = 0; k < kQABlock; ++k) {
      const long v = k < n && finite ? std::clamp(std::lrint(a[k0 + k] * inv), -32767l, 32767l) : 0;
      q[k0 + k] = int16_t(v);
      isum += v;
    }
    total += double(isum) * scale[b];
  }
  return float(total);
}

}  // namespace ot::gemm::qdetail

namespace ot::gemm::qdetail {

// W8A8 (QA8Args, quant_internal.h): the integer sums the vector kernel forms, then the same scaling
// in the same order, so the results are the same bits.
void qkernel_scalar_a8(const QA8Args& g) {
  const int64_t lenp = a8_len(g.len);
  for (int p = 0; p < g.panels; ++p) {
    const char* panel = g.panel + p * g.panel_step;
    for (int64_t j = 0; j < g.groups; ++j, panel += a8_group_bytes(g.len)) {
      const float* s = reinterpret_cast<const float*>(panel);
      const float* m = s + kQNR;
      const unsigned char* codes = reinterpret_cast<const unsigned char*>(panel + kQHeader);
      for (int r = 0; r < g.rows; ++r) {
        const int8_t* a = g.a + r * g.lda + j * lenp;
        const int32_t as = g.asum[r * g.ldas + j];
        for (int n = 0; n < kQNR; ++n) {
          int32_t acc = 0;
          for (int64_t k = 0; k < lenp; ++k)
            acc += int32_t(a[k]) * int32_t(codes[size_t(k / kA8Quad) * kA8QuadBytes + a8_code_byte(int(k % kA8Quad), n)]);
          const float pr = float(acc - as * 128), v = std::fma(pr, s[n], float(as) * m[n]);
          float& c = g.c[p * g.ldcp + r * kQNR + n];
          c = std::fma(g.ascale[r], v, j ? c : 0.f);
        }
      }
    }
  }
}

}  // namespace ot::gemm::qdetail
