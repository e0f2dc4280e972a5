// bf16 fused chunk forward on AVX512-BF16 (see chunk_fused_bf16.h). The engine's matmul packs
// its operands on every call, which dominates at 64 x 128 x 128; here each operand is produced
// once per chunk directly in the layout the engine's fixed-size tiles read (src/gemm/small.h:
// A bf16 rows, B bf16 pairs of rows interleaved, "VNNI") and reused across the chunk's products.
// The state recurrence (W, U, v_new = U - W S, the state update) runs on fp32 operands; only the
// output products (Q S, P v_new) take bf16 copies of S and v_new.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "ot/numeric.h"
#include "src/gdn/chunk_fused_bf16.h"
#include "src/gdn/chunk_kernels.h"
#include "src/gemm/small.h"

namespace ot::gdn::detail {
namespace {

constexpr int64_t C = kChunk;
using gemm::detail::TileEpi;
using gemm::detail::tiles_bf16;
using gemm::detail::tiles_f32;
using gemm::detail::tiles_widen;

// Pair-interleave two rows into words: dst[j] = r0[j] | r1[j] << 16 (bf16 sources).
inline void pair_u16(const uint16_t* r0, const uint16_t* r1, uint32_t* dst, int64_t n) {
  for (int64_t j = 0; j < n; j += 16) {
    __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r0 + j)));
    __m512i hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r1 + j)));
    _mm512_storeu_si512(dst + j, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
  }
}
inline __m256i to_bf16(__m512 x) { return (__m256i)_mm512_cvtneps_pbh(x); }
// Same from fp32 rows (rounded to nearest even).
inline void pair_f32(const float* r0, const float* r1, uint32_t* dst, int64_t n) {
  for (int64_t j = 0; j < n; j += 16) {
    __m512i lo = _mm512_cvtepu16_epi32(to_bf16(_mm512_loadu_ps(r0 + j)));
    __m512i hi = _mm512_cvtepu16_epi32(to_bf16(_mm512_loadu_ps(r1 + j)));
    _mm512_storeu_si512(dst + j, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
  }
}
// dst[j] = bf16(src[j] * f[j]) (f null: 1), n % 16 == 0.
inline void row_bf16(const float* src, const float* f, uint16_t* dst, int64_t n) {
  for (int64_t j = 0; j < n; j += 16) {
    __m512 x = _mm512_loadu_ps(src + j);
    if (f) x = _mm512_mul_ps(x, _mm512_loadu_ps(f + j));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + j), to_bf16(x));
  }
}
inline float sumsq_bf16(const uint16_t* x, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    __m512 v = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + j))), 16));
    acc = _mm512_fmadd_ps(v, v, acc);
  }
  return _mm512_reduce_add_ps(acc);
}

struct Bufs {
  uint16_t *kb, *qb;     // C x DK raw rows (rows >= L zero)
  uint32_t* kv;          // C/2 x DK pairs of k rows
  uint32_t* kT;          // DK/2 x C: k^T as pairs (B operand of the Gram products)
  float* kt;             // DK x C: rk_i k_i^T (transposed)
  float *rk, *rq;        // C
  float *kk, *qk;        // C x C Gram (lower part)
  float *g, *G, *beta, *gam, *fk, *fv, *fs, *ro, *E, *M, *A;
  float *aw, *au, *ktd;  // fp32 operands of the state recurrence: A diag(fk), A diag(fv), K^T diag(fs)
  uint16_t* p;
  uint32_t *vv, *sv, *dv;
  uint16_t* vb;          // C x DV raw v rows
  float *w, *u, *o;
  float* states;
  float* a32;            // the widening kernel's fp32 A (null: vdpbf16ps)
};

void load_bf16_rows(const Tok& x, int64_t b, int64_t t0, int64_t L, int64_t h, uint16_t* dst) {
  for (int64_t i = 0; i < L; ++i) std::memcpy(dst + i * x.D, x.at(b, t0 + i, h), size_t(x.D) * 2);
  if (L < C) std::memset(dst + L * x.D, 0, size_t((C - L) * x.D) * 2);
}

// A = (I + M)^-1 for the strictly lower M (ld C), rows >= L zero: row i = e_i - sum_{m<i} M[i][m]
// A[m]. Row i lives in NV = ceil(i/16) registers (A[m] is zero beyond column m), with even and
// odd m in separate accumulators to halve the FMA latency chain.
template <int NV>
inline void solve_row(const float* M, float* A, int64_t i) {
  __m512 e[NV], o[NV];
  for (int v = 0; v < NV; ++v) e[v] = o[v] = _mm512_setzero_ps();
  const float* mi = M + i * C;
  int64_t m = 0;
  for (; m + 1 < i; m += 2) {
    __m512 c0 = _mm512_set1_ps(-mi[m]), c1 = _mm512_set1_ps(-mi[m + 1]);
    for (int v = 0; v < NV; ++v) {
      e[v] = _mm512_fmadd_ps(c0, _mm512_load_ps(A + m * C + 16 * v), e[v]);
      o[v] = _mm512_fmadd_ps(c1, _mm512_load_ps(A + (m + 1) * C + 16 * v), o[v]);
    }
  }
  if (m < i) {
    __m512 c0 = _mm512_set1_ps(-mi[m]);
    for (int v = 0; v < NV; ++v) e[v] = _mm512_fmadd_ps(c0, _mm512_load_ps(A + m * C + 16 * v), e[v]);
  }
  float* ai = A + i * C;
  for (int v = 0; v < NV; ++v) _mm512_store_ps(ai + 16 * v, _mm512_add_ps(e[v], o[v]));
  for (int v = NV; v < C / 16; ++v) _mm512_store_ps(ai + 16 * v, _mm512_setzero_ps());
  ai[i] = 1.f;
}
void solve_unit_lower(const float* M, int64_t L, float* A) {
  for (int64_t i = 0; i < C; ++i) {
    if (i >= L) {
      std::memset(A + i * C, 0, sizeof(float) * C);
      continue;
    }
    switch ((i + 15) / 16) {
      case 0: solve_row<1>(M, A, i); break;  // i == 0: the unit row
      case 1: solve_row<1>(M, A, i); break;
      case 2: solve_row<2>(M, A, i); break;
      case 3: solve_row<3>(M, A, i); break;
      default: solve_row<4>(M, A, i); break;
    }
  }
}

// Carves the buffers from base (null: only measures); returns the bytes used.
size_t carve(Bufs& b, char* base, int64_t DK, int64_t DV, int64_t group, bool widen) {
  size_t off = 0;
  auto take = [&](auto*& ptr, int64_t n) {
    using T = std::remove_reference_t<decltype(*ptr)>;
    ptr = base ? reinterpret_cast<T*>(base + off) : nullptr;  // (an offset on a null base is UB: fuzz_gdn_chunk, clang UBSan)
    off += (size_t(n) * sizeof(T) + 63) & ~size_t(63);
  };
  take(b.kb, C * DK), take(b.qb, C * DK), take(b.kv, C / 2 * DK), take(b.kT, DK / 2 * C);
  take(b.kt, DK * C), take(b.rk, C), take(b.rq, C), take(b.kk, C * C), take(b.qk, C * C);
  take(b.g, C), take(b.G, C), take(b.beta, C), take(b.gam, C), take(b.fk, C), take(b.fv, C), take(b.fs, C), take(b.ro, C);
  take(b.E, C * C), take(b.M, C * C), take(b.A, C * C);
  take(b.aw, C * C), take(b.au, C * C), take(b.p, C * C), take(b.ktd, DK * C);
  take(b.vv, C / 2 * DV), take(b.sv, DK / 2 * DV), take(b.dv, C / 2 * DV), take(b.vb, C * DV);
  take(b.w, C * DK), take(b.u, C * DV), take(b.o, C * DV), take(b.states, group * DK * DV);
  const int64_t side = std::max(C, DK);  // A of every product is C or DK square at most
  b.a32 = nullptr;
  if (widen) take(b.a32, side * side);
  return off;
}

}  // namespace

void bf16_fused_task(const Bf16Fwd& a, int64_t n, int64_t hk) {
  const int64_t DK = a.DK, DV = a.DV, group = a.HV / a.HK;
  // Per-thread scratch kept across calls (no fresh pages per call); ~0.5 MiB at 128/128, G = 2.
  static thread_local std::vector<char> mem;
  Bufs b;
  size_t need = carve(b, nullptr, DK, DV, group, a.widen) + 64;
  if (mem.size() < need) mem.assign(need, 0);
  carve(b, reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(mem.data()) + 63) & ~uintptr_t(63)), DK, DV, group, a.widen);

  for (int64_t j = 0; j < group; ++j) {
    float* S = b.states + j * DK * DV;
    if (a.S0.defined()) std::memcpy(S, a.S0.f32(n, hk * group + j), sizeof(float) * size_t(DK * DV));
    else std::memset(S, 0, sizeof(float) * size_t(DK * DV));
  }
  const SeqInfo& s = *a.s;
  const int64_t nc = s.chunk_offsets[size_t(n + 1)] - s.chunk_offsets[size_t(n)];
  for (int64_t c = 0; c < nc; ++c) {
    ChunkSpan sp = chunk_span(s, n, c);
    const int64_t L = sp.L;
    // ---- key head: raw rows, norms, Gram matrices, k pairs and k^T (shared by the group).
    load_bf16_rows(a.k, sp.b, sp.t0, L, hk, b.kb);
    load_bf16_rows(a.q, sp.b, sp.t0, L, hk, b.qb);
    for (int64_t i = 0; i < C; ++i) {
      bool on = i < L && a.l2;
      b.rk[i] = on ? 1.f / std::sqrt(sumsq_bf16(b.kb + i * DK, DK) + 1e-6f) : 1.f;
      b.rq[i] = on ? 1.f / std::sqrt(sumsq_bf16(b.qb + i * DK, DK) + 1e-6f) : 1.f;
    }
    if (a.l2 && a.rq.defined()) {
      store_scal(b.rq, a.rq, sp.b, sp.t0, L, hk);
      store_scal(b.rk, a.rk, sp.b, sp.t0, L, hk);
    }
    for (int64_t p = 0; p < C / 2; ++p) pair_u16(b.kb + 2 * p * DK, b.kb + (2 * p + 1) * DK, b.kv + p * DK, DK);
    {
      // k^T pairs for the Gram products: B[d][j] = k_j[d] -> words [DK/2][C].
      uint32_t* kT = b.kT;
      // Word transpose by gathers: kT[p][j] = word p of k row j.
      const __m512i rows = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                              _mm512_set1_epi32(int(DK / 2)));
      for (int64_t p = 0; p < DK / 2; ++p)
        for (int64_t j = 0; j < C; j += 16)
          _mm512_storeu_si512(kT + p * C + j, _mm512_i32gather_epi32(_mm512_add_epi32(rows, _mm512_set1_epi32(int(j * (DK / 2) + p))), b.kb, 4));
      TileEpi e;
      e.tri_n = true;
      tiles_bf16(b.kb, DK, kT, C, DK, b.kk, C, C, e, b.a32);
      tiles_bf16(b.qb, DK, kT, C, DK, b.qk, C, C, e, b.a32);
      // kt[d][i] = rk_i k_i[d] (fp32): the halves of kT's words.
      for (int64_t p = 0; p < DK / 2; ++p)
        for (int64_t j = 0; j < C; j += 16) {
          __m512i w = _mm512_loadu_si512(kT + p * C + j);
          __m512 r = _mm512_loadu_ps(b.rk + j);
          _mm512_storeu_ps(b.kt + 2 * p * C + j, _mm512_mul_ps(r, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16))));
          _mm512_storeu_ps(b.kt + (2 * p + 1) * C + j,
                           _mm512_mul_ps(r, _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32(int(0xffff0000u))))));
        }
    }
    // ---- value heads.
    for (int64_t j = 0; j < group; ++j) {
      const int64_t hv = hk * group + j;
      float* S = b.states + j * DK * DV;
      if (a.h) std::memcpy(a.h + (s.chunk_id(n, c) * a.HV + hv) * DK * DV, S, sizeof(float) * size_t(DK * DV));
      load_scal(a.g, sp.b, sp.t0, L, hv, b.g);
      load_scal(a.beta, sp.b, sp.t0, L, hv, b.beta);
      cumsum_chunk(b.g, L, b.G, false, 1.f);
      decay_matrix(b.G, L, b.E);
      const float gl = b.G[L - 1];
      for (int64_t i = 0; i < C; ++i) {
        bool on = i < L;
        b.gam[i] = on ? std::exp(b.G[i]) : 0.f;
        b.fk[i] = on ? b.beta[i] * b.gam[i] * b.rk[i] : 0.f;  // column scale of A for W
        b.fv[i] = on ? b.beta[i] : 0.f;                       // ... for U
        b.fs[i] = on ? std::exp(gl - b.G[i]) : 0.f;           // decay to the chunk end
        b.ro[i] = on ? a.scale * b.gam[i] * b.rq[i] : 0.f;    // row scale of Q S
      }
      for (int64_t i = 0; i < L; ++i) {
        const float* kk = b.kk + i * C;
        const float* e = b.E + i * C;
        float* m = b.M + i * C;
        float f = b.beta[i] * b.rk[i];
        for (int64_t jj = 0; jj < i; ++jj) m[jj] = f * kk[jj] * e[jj] * b.rk[jj];
      }
      solve_unit_lower(b.M, L, b.A);
      if (a.A.defined()) store_rows(b.A, C, a.A, sp.b, sp.t0, L, hv);
      for (int64_t i = 0; i < C; ++i)
        for (int64_t jj = 0; jj < C; ++jj) {
          b.aw[i * C + jj] = b.A[i * C + jj] * b.fk[jj];
          b.au[i * C + jj] = b.A[i * C + jj] * b.fv[jj];
        }
      load_bf16_rows(a.v, sp.b, sp.t0, L, hv, b.vb);
      for (int64_t p = 0; p < C / 2; ++p) pair_u16(b.vb + 2 * p * DV, b.vb + (2 * p + 1) * DV, b.vv + p * DV, DV);
      TileEpi tk;
      tk.tri_k = true;
      // W = A diag(beta e^G rk) K, U = A diag(beta) V: fp32 A times the exact bf16 K, V pairs.
      tiles_widen(b.aw, C, b.kv, DK, C, b.w, DK, C, tk);
      tiles_widen(b.au, C, b.vv, DV, C, b.u, DV, C, tk);
      // v_new = U - W S in fp32 (the state recurrence); the bf16 copy of S only feeds the output.
      for (int64_t p = 0; p < DK / 2; ++p) pair_f32(S + 2 * p * DV, S + (2 * p + 1) * DV, b.sv + p * DV, DV);
      TileEpi vn;
      vn.alpha = -1.f, vn.beta = 1.f;
      tiles_f32(b.w, DK, S, DV, DV, DK, b.u, DV, C, vn);
      float* dn = b.u;
      if (a.h) store_rows(dn, DV, a.v_new, sp.b, sp.t0, L, hv);
      for (int64_t p = 0; p < C / 2; ++p) pair_f32(dn + 2 * p * DV, dn + (2 * p + 1) * DV, b.dv + p * DV, DV);
      // O = diag(s e^G rq) Q S + P v_new, P = s causal(E) o (Q K^T) rq_i rk_j.
      TileEpi oq;
      oq.rs = b.ro;
      tiles_bf16(b.qb, DK, b.sv, DV, DK, b.o, DV, C, oq, b.a32);
      for (int64_t i = 0; i < C; ++i) {
        float* pr = b.M + i * C;  // M is no longer needed: fp32 P row
        if (i < L) {
          float f = a.scale * b.rq[i];
          const float* qk = b.qk + i * C;
          const float* e = b.E + i * C;
          for (int64_t jj = 0; jj <= i; ++jj) pr[jj] = f * qk[jj] * e[jj] * b.rk[jj];
          for (int64_t jj = i + 1; jj < C; ++jj) pr[jj] = 0.f;
        } else {
          std::memset(pr, 0, sizeof(float) * C);
        }
        row_bf16(pr, nullptr, b.p + i * C, C);
      }
      TileEpi op;
      op.beta = 1.f, op.tri_k = true;
      tiles_bf16(b.p, C, b.dv, DV, C, b.o, DV, C, op, b.a32);
      store_rows(b.o, DV, a.o, sp.b, sp.t0, L, hv);
      if (a.G.defined()) store_scal(b.G, a.G, sp.b, sp.t0, L, hv);
      // S = e^{G_last} S + (diag(e^{G_last - G}) K)^T v_new, all fp32 (v_new unrounded).
      for (int64_t d = 0; d < DK; ++d)
        for (int64_t i = 0; i < C; ++i) b.ktd[d * C + i] = b.kt[d * C + i] * b.fs[i];
      TileEpi su;
      su.beta = std::exp(gl);
      tiles_f32(b.ktd, C, dn, DV, DV, C, S, DV, DK, su);
    }
  }
  for (int64_t j = 0; j < group; ++j)
    if (a.fin.defined()) std::memcpy(a.fin.f32(n, hk * group + j), b.states + j * DK * DV, sizeof(float) * size_t(DK * DV));
}

}  // namespace ot::gdn::detail
