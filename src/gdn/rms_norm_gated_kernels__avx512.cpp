// AVX-512 gated RMSNorm forward and backward for groups of whole vectors (group % 16 == 0; the
// kernel lists in rms_norm_gated.cpp send other groups to the AVX2 rows). A row is read from memory once, in two
// passes over the L1-resident row: the group's sum of squares, then the normalised, weighted and
// gated output, converted and stored directly. The fp32 scratch rows of the AVX2 form (a load,
// store and reload of every value per step) were ~5 cycles an element: 10% of the read bandwidth.
#include <immintrin.h>

#include <cmath>

#include "src/core/cvt_avx512.h"
#include "src/core/knobs.h"
#include "src/gdn/rms_norm_gated_kernels.h"
#include "src/gemm/vec_math_avx512.h"

namespace ot::gdn::detail::norm {
namespace {

// Dtypes as template arguments: a branch on them per vector was a fifth of the loop.
template <DType T> inline __m512 load_v(const void* p, int64_t i) {
  if constexpr (T == DType::f32) return _mm512_loadu_ps(static_cast<const float*>(p) + i);
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(p) + i));
  if constexpr (T == DType::bf16) return simd::bf16x16_to_f32(h);
  else return simd::f16x16_to_f32(h);
}
template <DType T> inline void store_v(void* p, int64_t i, __m512 v) {
  if constexpr (T == DType::f32) {
    _mm512_storeu_ps(static_cast<float*>(p) + i, v);
  } else {
    const __m256i h = T == DType::bf16 ? simd::f32_to_bf16x16(v) : simd::f32_to_f16x16(v);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(p) + i), h);
  }
}
// sigmoid = 1 / (1 + e^-z) by vrcp14ps and a Newton step (~1 ulp; vdivps held the loop on its
// divider); silu(z) = z sigmoid(z), in the AVX2 row form's order.
inline __m512 sigmoid_v(__m512 z) {
  const __m512 one = _mm512_set1_ps(1.f), d = _mm512_add_ps(one, gemm::vm::exp(_mm512_sub_ps(_mm512_setzero_ps(), z)));
  const __m512 r = _mm512_rcp14_ps(d);
  return _mm512_fmadd_ps(_mm512_fnmadd_ps(d, r, one), r, r);
}
inline __m512 silu_v(__m512 z) { return _mm512_mul_ps(sigmoid_v(z), z); }
// silu_v of U vectors in lockstep (vm::exp_n): the one-vector form ran latency-bound, ~28 cycles a
// vector on Zen 5 (the out-of-order window held about two vectors' chains).
template <int U> __attribute__((always_inline)) inline void silu_n(__m512* z) {
  const __m512 one = _mm512_set1_ps(1.f);
  __m512 d[U];
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) d[u] = _mm512_sub_ps(_mm512_setzero_ps(), z[u]);
  gemm::vm::exp_n<U>(d);
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) {
    d[u] = _mm512_add_ps(one, d[u]);
    const __m512 r = _mm512_rcp14_ps(d[u]);
    z[u] = _mm512_mul_ps(_mm512_fmadd_ps(_mm512_fnmadd_ps(d[u], r, one), r, r), z[u]);
  }
}
constexpr int kLock = 8;  // vectors in lockstep
knobs::Knob g_lockstep("norm.gate_lockstep", 1, 0, 1, "rms_norm_gated (AVX-512, norm before gate): compute the gates 8 vectors in lockstep (0 = one at a time)");
// 1 / sqrt(mean of squares + eps) from 16 partial sums (a fixed reduction order: same bits every run).
inline float rstd_of(__m512 acc, int64_t G, float eps) { return 1.f / std::sqrt(_mm512_reduce_add_ps(acc) / float(G) + eps); }

// y has the dtype of x.
template <DType XT, DType ZT>
void rows(const Cfg& c, In xi, In zi, Out yo, float* rstd, int64_t r0, int64_t r1, float* buf) {
  const int64_t N = c.N, G = c.group, NG = N / G;
  for (int64_t r = r0; r < r1; ++r) {
    const void* xp = elem_at(xi.p, XT, r * xi.st);
    const void* zp = elem_at(zi.p, ZT, r * zi.st);
    void* yp = elem_at(yo.p, XT, r * yo.st);
    for (int64_t g = 0; g < NG; ++g) {
      const int64_t o = g * G;
      __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();  // two chains of FMAs
      if (c.norm_before_gate) {
        for (int64_t i = o; i < o + G; i += 16) {
          const __m512 x = load_v<XT>(xp, i);
          if ((i - o) & 16) a1 = _mm512_fmadd_ps(x, x, a1); else a0 = _mm512_fmadd_ps(x, x, a0);
        }
      } else {  // the gated input u = x silu(z) is normalised: kept in buf for the second pass
        for (int64_t i = o; i < o + G; i += 16) {
          const __m512 u = _mm512_mul_ps(load_v<XT>(xp, i), silu_v(load_v<ZT>(zp, i)));
          _mm512_storeu_ps(buf + (i - o), u);
          if ((i - o) & 16) a1 = _mm512_fmadd_ps(u, u, a1); else a0 = _mm512_fmadd_ps(u, u, a0);
        }
      }
      const float rs = rstd_of(_mm512_add_ps(a0, a1), G, c.eps);
      if (rstd) rstd[r * NG + g] = rs;
      const __m512 vrs = _mm512_set1_ps(rs);
      int64_t i = o;
      if (c.norm_before_gate && g_lockstep.get())  // the gates kLock vectors in lockstep
        for (; i + 16 * kLock <= o + G; i += 16 * kLock) {
          __m512 s[kLock];
#pragma GCC unroll 8
          for (int u = 0; u < kLock; ++u) s[u] = load_v<ZT>(zp, i + 16 * u);
          silu_n<kLock>(s);
#pragma GCC unroll 8
          for (int u = 0; u < kLock; ++u) {
            const int64_t iu = i + 16 * u;
            store_v<XT>(yp, iu, _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(load_v<XT>(xp, iu), vrs), _mm512_loadu_ps(c.w + iu)), s[u]));
          }
        }
      for (; i < o + G; i += 16) {
        const __m512 w = _mm512_loadu_ps(c.w + i);
        __m512 y;
        if (c.norm_before_gate) y = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(load_v<XT>(xp, i), vrs), w), silu_v(load_v<ZT>(zp, i)));
        else y = _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(buf + (i - o)), vrs), w);
        store_v<XT>(yp, i, y);
      }
    }
  }
}

template <DType XT> void rows_z(const Cfg& c, In x, In z, Out y, float* rstd, int64_t r0, int64_t r1, float* buf) {
  switch (z.dt) {
    case DType::f32: return rows<XT, DType::f32>(c, x, z, y, rstd, r0, r1, buf);
    case DType::bf16: return rows<XT, DType::bf16>(c, x, z, y, rstd, r0, r1, buf);
    default: return rows<XT, DType::f16>(c, x, z, y, rstd, r0, r1, buf);
  }
}

// The backward of rows (see rms_norm_gated_kernels.inc for the formulas), dy in the dtype of x, dx
// in that of x, dz in that of z. Per group: uh = u rs, g = dy w gate, dw += dy uh gate and
// mean(g uh) in one pass (uh, g, silu(z), silu'(z) kept in buf), then du = rs (g - uh mean).
template <DType XT, DType ZT>
void bwd(const Cfg& c, const Bwd& b, int64_t r0, int64_t r1, float* dw, float* buf) {
  const int64_t N = c.N, G = c.group, NG = N / G;
  const bool nbg = c.norm_before_gate;
  float *uh = buf, *gg = buf + G, *sl = buf + 2 * G, *ds = buf + 3 * G;
  const __m512 one = _mm512_set1_ps(1.f);
  for (int64_t r = r0; r < r1; ++r) {
    const void* xp = elem_at(b.x.p, XT, r * b.x.st);
    const void* zp = elem_at(b.z.p, ZT, r * b.z.st);
    const void* dyp = elem_at(b.dy.p, XT, r * b.dy.st);
    void* dxp = elem_at(b.dx.p, XT, r * b.dx.st);
    void* dzp = elem_at(b.dz.p, ZT, r * b.dz.st);
    for (int64_t k = 0; k < NG; ++k) {
      const int64_t o = k * G;
      // silu(z) and silu'(z) = sigmoid (1 + z (1 - sigmoid)); u = x (or x silu(z)).
      __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
      for (int64_t i = 0; i < G; i += 16) {
        const __m512 z = load_v<ZT>(zp, o + i), sg = sigmoid_v(z);
        _mm512_storeu_ps(sl + i, _mm512_mul_ps(z, sg));
        _mm512_storeu_ps(ds + i, _mm512_mul_ps(sg, _mm512_fmadd_ps(z, _mm512_sub_ps(one, sg), one)));
        const __m512 x = load_v<XT>(xp, o + i), u = nbg ? x : _mm512_mul_ps(x, _mm512_loadu_ps(sl + i));
        _mm512_storeu_ps(uh + i, u);
        if (i & 16) a1 = _mm512_fmadd_ps(u, u, a1); else a0 = _mm512_fmadd_ps(u, u, a0);
      }
      const float rs = b.rstd ? b.rstd[r * NG + k] : rstd_of(_mm512_add_ps(a0, a1), G, c.eps);
      const __m512 vrs = _mm512_set1_ps(rs);
      __m512 m0 = _mm512_setzero_ps(), m1 = _mm512_setzero_ps();
      for (int64_t i = 0; i < G; i += 16) {
        const __m512 u = _mm512_mul_ps(_mm512_loadu_ps(uh + i), vrs), dy = load_v<XT>(dyp, o + i);
        const __m512 gw = _mm512_mul_ps(dy, _mm512_loadu_ps(c.w + o + i)), gate = nbg ? _mm512_loadu_ps(sl + i) : one;
        _mm512_storeu_ps(dw + o + i, _mm512_add_ps(_mm512_loadu_ps(dw + o + i), _mm512_mul_ps(_mm512_mul_ps(dy, u), gate)));
        if (nbg) store_v<ZT>(dzp, o + i, _mm512_mul_ps(_mm512_mul_ps(gw, u), _mm512_loadu_ps(ds + i)));
        const __m512 g = _mm512_mul_ps(gw, gate);
        _mm512_storeu_ps(uh + i, u);
        _mm512_storeu_ps(gg + i, g);
        if (i & 16) m1 = _mm512_fmadd_ps(g, u, m1); else m0 = _mm512_fmadd_ps(g, u, m0);
      }
      const __m512 mean = _mm512_set1_ps(_mm512_reduce_add_ps(_mm512_add_ps(m0, m1)) / float(G));
      for (int64_t i = 0; i < G; i += 16) {
        const __m512 du = _mm512_mul_ps(vrs, _mm512_fnmadd_ps(_mm512_loadu_ps(uh + i), mean, _mm512_loadu_ps(gg + i)));
        if (nbg) {
          store_v<XT>(dxp, o + i, du);
        } else {
          store_v<ZT>(dzp, o + i, _mm512_mul_ps(_mm512_mul_ps(du, load_v<XT>(xp, o + i)), _mm512_loadu_ps(ds + i)));
          store_v<XT>(dxp, o + i, _mm512_mul_ps(du, _mm512_loadu_ps(sl + i)));
        }
      }
    }
  }
}
template <DType XT> void bwd_z(const Cfg& c, const Bwd& b, int64_t r0, int64_t r1, float* dw, float* buf) {
  switch (b.z.dt) {
    case DType::f32: return bwd<XT, DType::f32>(c, b, r0, r1, dw, buf);
    case DType::bf16: return bwd<XT, DType::bf16>(c, b, r0, r1, dw, buf);
    default: return bwd<XT, DType::f16>(c, b, r0, r1, dw, buf);
  }
}

}  // namespace

void fwd_rows_avx512(const Cfg& c, In x, In z, Out y, float* rstd, int64_t r0, int64_t r1, float* buf) {
  switch (x.dt) {
    case DType::f32: return rows_z<DType::f32>(c, x, z, y, rstd, r0, r1, buf);
    case DType::bf16: return rows_z<DType::bf16>(c, x, z, y, rstd, r0, r1, buf);
    default: return rows_z<DType::f16>(c, x, z, y, rstd, r0, r1, buf);
  }
}


void bwd_rows_avx512(const Cfg& c, const Bwd& b, int64_t r0, int64_t r1, float* dw, float* buf) {
  switch (b.x.dt) {
    case DType::f32: return bwd_z<DType::f32>(c, b, r0, r1, dw, buf);
    case DType::bf16: return bwd_z<DType::bf16>(c, b, r0, r1, dw, buf);
    default: return bwd_z<DType::f16>(c, b, r0, r1, dw, buf);
  }
}
}  // namespace ot::gdn::detail::norm
