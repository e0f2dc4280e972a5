#include "src/gdn/chunk_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ot/gdn.h"
#include "ot/gemm.h"

namespace ot::gdn::detail {

static gemm::MatView cm(const float* p, int64_t r, int64_t c, int64_t ld) { return {p, DType::f32, r, c, ld, 1}; }
static gemm::MutMatView mm(float* p, int64_t r, int64_t c, int64_t ld) { return {p, DType::f32, r, c, ld, 1}; }

void cumsum_chunk(const float* g, int64_t L, float* G, bool reverse, float scale) {
  float acc = 0.f;
  if (!reverse) {
    for (int64_t i = 0; i < L; ++i) G[i] = scale * (acc += g[i]);
  } else {
    for (int64_t i = L - 1; i >= 0; --i) G[i] = scale * (acc += g[i]);
  }
}

void decay_matrix(const float* G, int64_t L, float* E) {
  float lo = G[0], hi = G[0];
  for (int64_t i = 1; i < L; ++i) lo = std::min(lo, G[i]), hi = std::max(hi, G[i]);
  std::memset(E, 0, sizeof(float) * size_t(kChunk * kChunk));
  if (hi - lo < 60.f) {
    // Bounded range: exp(G_i - G_j) = exp(G_i - hi) * exp(hi - G_j), no overflow (e^60 < FLT_MAX),
    // 2L exponentials instead of L^2/2.
    float a[kChunk], b[kChunk];
    for (int64_t i = 0; i < L; ++i) a[i] = std::exp(G[i] - hi), b[i] = std::exp(hi - G[i]);
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j <= i; ++j) E[i * kChunk + j] = a[i] * b[j];
    for (int64_t i = 0; i < L; ++i) E[i * kChunk + i] = 1.f;
  } else {
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j <= i; ++j) E[i * kChunk + j] = std::exp(G[i] - G[j]);
  }
}

void kkt_chunk(const float* K, int64_t ldk, int64_t L, int64_t DK, const float* beta, const float* E, float* M) {
  std::memset(M, 0, sizeof(float) * size_t(kChunk * kChunk));
  if (L <= 1) return;
  gemm::matmul(cm(K, L, DK, ldk), cm(K, L, DK, ldk).t(), mm(M, L, L, kChunk));
  for (int64_t i = 0; i < L; ++i) {
    float* r = M + i * kChunk;
    const float* e = E + i * kChunk;
    for (int64_t j = 0; j < i; ++j) r[j] *= beta[i] * e[j];
    for (int64_t j = i; j < L; ++j) r[j] = 0.f;
  }
}

void solve_tril_chunk(const float* M, int64_t ldm, int64_t L, float* A, int64_t lda) {
  // Row i of (I+M)^-1: e_i - sum_{m<i} M[i][m] A[m][:], forward substitution (A lower unit).
  for (int64_t i = 0; i < kChunk; ++i) std::memset(A + i * lda, 0, sizeof(float) * size_t(kChunk));
  for (int64_t i = 0; i < L; ++i) {
    float* ai = A + i * lda;
    const float* mi = M + i * ldm;
    for (int64_t m = 0; m < i; ++m) {
      float c = -mi[m];
      const float* am = A + m * lda;
      for (int64_t j = 0; j <= m; ++j) ai[j] += c * am[j];
    }
    ai[i] = 1.f;
  }
}

void wu_chunk(const float* A, int64_t lda, const float* K, int64_t ldk, const float* V, int64_t ldv, const float* beta, const float* G,
              int64_t L, int64_t DK, int64_t DV, float* W, int64_t ldw, float* U, int64_t ldu, float* scratch) {
  for (int64_t i = 0; i < L; ++i) {
    float f = beta[i] * std::exp(G[i]);
    for (int64_t d = 0; d < DK; ++d) scratch[i * DK + d] = f * K[i * ldk + d];
  }
  gemm::matmul(cm(A, L, L, lda), cm(scratch, L, DK, DK), mm(W, L, DK, ldw));
  for (int64_t i = 0; i < L; ++i)
    for (int64_t d = 0; d < DV; ++d) scratch[i * DV + d] = beta[i] * V[i * ldv + d];
  gemm::matmul(cm(A, L, L, lda), cm(scratch, L, DV, DV), mm(U, L, DV, ldu));
}

void vnew_chunk(const float* W, int64_t ldw, const float* U, int64_t ldu, const float* S, int64_t L, int64_t DK, int64_t DV, float* Dn,
                int64_t ldd) {
  if (Dn != U)
    for (int64_t i = 0; i < L; ++i) std::memcpy(Dn + i * ldd, U + i * ldu, sizeof(float) * size_t(DV));
  gemm::matmul(cm(W, L, DK, ldw), cm(S, DK, DV, DV), mm(Dn, L, DV, ldd), -1.f, 1.f);
}

void state_update_chunk(float* S, const float* K, int64_t ldk, const float* Dn, int64_t ldd, const float* G, int64_t L, int64_t DK,
                        int64_t DV, float* scratch) {
  float gl = G[L - 1], decay = std::exp(gl);
  for (int64_t i = 0; i < DK * DV; ++i) S[i] *= decay;
  for (int64_t i = 0; i < L; ++i) {
    float f = std::exp(gl - G[i]);
    for (int64_t d = 0; d < DK; ++d) scratch[i * DK + d] = f * K[i * ldk + d];
  }
  gemm::matmul(cm(scratch, L, DK, DK).t(), cm(Dn, L, DV, ldd), mm(S, DK, DV, DV), 1.f, 1.f);
}

void out_chunk(const float* Q, int64_t ldq, const float* K, int64_t ldk, const float* Dn, int64_t ldd, const float* S, const float* E,
               const float* G, float s, int64_t L, int64_t DK, int64_t DV, float* O, int64_t ldo, float* scratch, float* P) {
  gemm::matmul(cm(Q, L, DK, ldq), cm(K, L, DK, ldk).t(), mm(P, L, L, kChunk));
  for (int64_t i = 0; i < L; ++i) {
    float* r = P + i * kChunk;
    const float* e = E + i * kChunk;
    for (int64_t j = 0; j <= i; ++j) r[j] *= s * e[j];
    for (int64_t j = i + 1; j < L; ++j) r[j] = 0.f;
  }
  for (int64_t i = 0; i < L; ++i) {
    float f = s * std::exp(G[i]);
    for (int64_t d = 0; d < DK; ++d) scratch[i * DK + d] = f * Q[i * ldq + d];
  }
  gemm::matmul(cm(scratch, L, DK, DK), cm(S, DK, DV, DV), mm(O, L, DV, ldo));
  gemm::matmul(cm(P, L, L, kChunk), cm(Dn, L, DV, ldd), mm(O, L, DV, ldo), 1.f, 1.f);
}

void l2norm_rows(float* x, int64_t ld, int64_t L, int64_t D, float eps, float* rstd) {
  for (int64_t i = 0; i < L; ++i) {
    float* r = x + i * ld;
    float ss = 0.f;
    for (int64_t d = 0; d < D; ++d) ss += r[d] * r[d];
    float inv = 1.f / std::sqrt(ss + eps);
    for (int64_t d = 0; d < D; ++d) r[d] *= inv;
    if (rstd) rstd[i] = inv;
  }
}

}  // namespace ot::gdn::detail
