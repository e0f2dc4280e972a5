#include "src/gdn/chunk_bwd_kernels.h"

#include <cmath>
#include <cstring>

#include "ot/gdn.h"
#include "ot/gemm.h"

namespace ot::gdn::detail {

namespace {
gemm::MatView cm(const float* p, int64_t r, int64_t c, int64_t ld) { return {p, DType::f32, r, c, ld, 1}; }
gemm::MutMatView mm(float* p, int64_t r, int64_t c, int64_t ld) { return {p, DType::f32, r, c, ld, 1}; }
constexpr int64_t C = kChunk;

// dst[i][:] = f_i * src[i][:]
void scale_rows(const float* src, int64_t lds, int64_t L, int64_t D, const float* f, float* dst, int64_t ldd) {
  for (int64_t i = 0; i < L; ++i)
    for (int64_t d = 0; d < D; ++d) dst[i * ldd + d] = f[i] * src[i * lds + d];
}
// P[i][j] *= s E_ij on and below the diagonal, 0 above (L x L, row stride C): the chunk's causal,
// decayed scores from raw dot products.
void causal_scores(const BwdChunk& c, float* P) {
  for (int64_t i = 0; i < c.L; ++i) {
    float* r = P + i * C;
    for (int64_t j = 0; j <= i; ++j) r[j] *= c.scale * c.E[i * C + j];
    for (int64_t j = i + 1; j < c.L; ++j) r[j] = 0.f;
  }
}
float dot(const float* a, const float* b, int64_t n) {
  float s = 0.f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}
}  // namespace

void grams_chunk(const float* q, const float* k, int64_t L, int64_t DK, float* QK, float* KK) {
  if (QK) gemm::matmul(cm(q, L, DK, DK), cm(k, L, DK, DK).t(), mm(QK, L, L, C));
  if (KK) gemm::matmul(cm(k, L, DK, DK), cm(k, L, DK, DK).t(), mm(KK, L, L, C));
}

void dv_local_chunk(const BwdChunk& c, float* out, float* P) {
  const int64_t L = c.L;
  // P[i][j] = s E_ij (q_i . k_j) for j <= i; dv_local = P^T dO.
  for (int64_t i = 0; i < L; ++i) std::memcpy(P + i * C, c.QK + i * C, sizeof(float) * size_t(L));
  causal_scores(c, P);
  gemm::matmul(cm(P, L, L, C).t(), cm(c.dO, L, c.DV, c.DV), mm(out, L, c.DV, c.DV));
}

void dv2_chunk(const BwdChunk& c, const float* dH, const float* dv_local, float* dv2, float* scratch) {
  const int64_t L = c.L;
  float f[C];
  for (int64_t i = 0; i < L; ++i) f[i] = std::exp(c.G[L - 1] - c.G[i]);
  scale_rows(c.k, c.DK, L, c.DK, f, scratch, c.DK);
  if (dv2 != dv_local) std::memcpy(dv2, dv_local, sizeof(float) * size_t(L * c.DV));
  gemm::matmul(cm(scratch, L, c.DK, c.DK), cm(dH, c.DK, c.DV, c.DV), mm(dv2, L, c.DV, c.DV), 1.f, 1.f);
}

void dh_update_chunk(const BwdChunk& c, float* dH, const float* W, const float* dv2, float* scratch) {
  const int64_t L = c.L;
  float f[C];
  for (int64_t i = 0; i < L; ++i) f[i] = c.scale * std::exp(c.G[i]);
  scale_rows(c.q, c.DK, L, c.DK, f, scratch, c.DK);
  float decay = std::exp(c.G[L - 1]);
  for (int64_t i = 0; i < c.DK * c.DV; ++i) dH[i] *= decay;
  gemm::matmul(cm(scratch, L, c.DK, c.DK).t(), cm(c.dO, L, c.DV, c.DV), mm(dH, c.DK, c.DV, c.DV), 1.f, 1.f);
  gemm::matmul(cm(W, L, c.DK, c.DK).t(), cm(dv2, L, c.DV, c.DV), mm(dH, c.DK, c.DV, c.DV), -1.f, 1.f);
}

void dqkwg_chunk(const BwdChunk& c, const float* vnew, const float* S, const float* dH, const float* dv2, float* dq, float* dk, float* dw,
                 float* dG, float* P) {
  const int64_t L = c.L, DK = c.DK, DV = c.DV;
  const float gl = c.G[L - 1];
  // dS_ij = s E_ij (dO_i . vnew_j), j <= i.
  gemm::matmul(cm(c.dO, L, DV, DV), cm(vnew, L, DV, DV).t(), mm(P, L, L, C));
  causal_scores(c, P);
  // dq = s diag(e^G) dO S^T + dS K; the inter part's gate term q_i . dq_inter_i first.
  gemm::matmul(cm(c.dO, L, DV, DV), cm(S, DK, DV, DV).t(), mm(dq, L, DK, DK));
  for (int64_t i = 0; i < L; ++i) {
    float f = c.scale * std::exp(c.G[i]);
    for (int64_t d = 0; d < DK; ++d) dq[i * DK + d] *= f;
    dG[i] = dot(c.q + i * DK, dq + i * DK, DK);
  }
  gemm::matmul(cm(P, L, L, C), cm(c.k, L, DK, DK), mm(dq, L, DK, DK), 1.f, 1.f);
  // dG is summed from per-pair terms instead of q . dq - k . dk: the diagonal of dS (E_ii = 1) and
  // the last row's own dk_inter term (e^{G_last - G_last} = 1) cancel exactly there, but as computed
  // they leave rounding noise of their O(1) size where the true dG is tiny (saturated gates).
  // Pair term Z_ij = dS_ij (q_i . k_j), j < i: + to row i, - to column j.
  const float* QK = c.QK;
  for (int64_t i = 1; i < L; ++i) {
    float row = 0.f;
    for (int64_t j = 0; j < i; ++j) {
      float z = P[i * C + j] * QK[i * C + j];
      row += z;
      dG[j] -= z;
    }
    dG[i] += row;
  }
  // dk_inter = diag(e^{G_last - G}) vnew dH^T, dk = dk_inter + dS^T Q.
  gemm::matmul(cm(vnew, L, DV, DV), cm(dH, DK, DV, DV).t(), mm(dk, L, DK, DK));
  float last = 0.f;
  for (int64_t i = 0; i < L; ++i) {
    float f = std::exp(gl - c.G[i]);
    float* r = dk + i * DK;
    for (int64_t d = 0; d < DK; ++d) r[d] *= f;
    if (i == L - 1) break;
    float kd = dot(c.k + i * DK, r, DK);
    dG[i] -= kd;
    last += kd;
  }
  dG[L - 1] += std::exp(gl) * dot(S, dH, DK * DV) + last;
  gemm::matmul(cm(P, L, L, C).t(), cm(c.q, L, DK, DK), mm(dk, L, DK, DK), 1.f, 1.f);
  // dw = -dv2 S^T
  gemm::matmul(cm(dv2, L, DV, DV), cm(S, DK, DV, DV).t(), mm(dw, L, DK, DK), -1.f);
}

void wy_bwd_da_chunk(const BwdChunk& c, const float* A, const float* dW, const float* dU, float* dP, float* T1, float* T2, float* scratch) {
  const int64_t L = c.L, DK = c.DK, DV = c.DV;
  float f[C];
  // dA = strict(dW kbg^T + dU vb^T) with kbg = diag(beta e^G) K, vb = diag(beta) V.
  for (int64_t i = 0; i < L; ++i) f[i] = c.beta[i] * std::exp(c.G[i]);
  scale_rows(c.k, DK, L, DK, f, scratch, DK);
  gemm::matmul(cm(dW, L, DK, DK), cm(scratch, L, DK, DK).t(), mm(T1, L, L, C));
  scale_rows(c.v, DV, L, DV, c.beta, scratch, DV);
  gemm::matmul(cm(dU, L, DV, DV), cm(scratch, L, DV, DV).t(), mm(T1, L, L, C), 1.f, 1.f);
  for (int64_t i = 0; i < L; ++i)
    for (int64_t j = i; j < L; ++j) T1[i * C + j] = 0.f;
  // dM = strict(-A^T dA A^T); dP = dM o E.
  gemm::matmul(cm(A, L, L, C).t(), cm(T1, L, L, C), mm(T2, L, L, C));
  gemm::matmul(cm(T2, L, L, C), cm(A, L, L, C).t(), mm(dP, L, L, C), -1.f);
  for (int64_t i = 0; i < L; ++i) {
    float* r = dP + i * C;
    for (int64_t j = 0; j < i; ++j) r[j] *= c.E[i * C + j];
    for (int64_t j = i; j < C; ++j) r[j] = 0.f;
  }
}

void wy_bwd_full_chunk(const BwdChunk& c, const float* A, const float* dP, const float* dW, const float* dU, float* dk, float* dv, float* dbeta,
                       float* dG, float* X, float* Y, float* scratch) {
  const int64_t L = c.L, DK = c.DK, DV = c.DV;
  // X = A^T dW (= dL/dkbg), Y = A^T dU (= dL/dvb).
  gemm::matmul(cm(A, L, L, C).t(), cm(dW, L, DK, DK), mm(X, L, DK, DK));
  gemm::matmul(cm(A, L, L, C).t(), cm(dU, L, DV, DV), mm(Y, L, DV, DV));
  const float* Gram = c.KK;
  // dP o (K K^T): row sums -> dbeta and the row side of dG; beta_i-weighted column sums -> column side.
  float rs[C], cs[C];
  for (int64_t j = 0; j < L; ++j) cs[j] = 0.f;
  for (int64_t i = 0; i < L; ++i) {
    float s = 0.f;
    for (int64_t j = 0; j < i; ++j) {
      float x = dP[i * C + j] * Gram[i * C + j];
      s += x;
      cs[j] += c.beta[i] * x;
    }
    rs[i] = s;
  }
  // dk = diag(beta e^G) X + diag(beta) dP K + dP^T (diag(beta) K)
  float f[C];
  for (int64_t i = 0; i < L; ++i) f[i] = c.beta[i] * std::exp(c.G[i]);
  scale_rows(X, DK, L, DK, f, dk, DK);
  gemm::matmul(cm(dP, L, L, C), cm(c.k, L, DK, DK), mm(scratch, L, DK, DK));
  for (int64_t i = 0; i < L; ++i)
    for (int64_t d = 0; d < DK; ++d) dk[i * DK + d] += c.beta[i] * scratch[i * DK + d];
  scale_rows(c.k, DK, L, DK, c.beta, scratch, DK);
  gemm::matmul(cm(dP, L, L, C).t(), cm(scratch, L, DK, DK), mm(dk, L, DK, DK), 1.f, 1.f);
  for (int64_t i = 0; i < L; ++i) {
    float xk = dot(X + i * DK, c.k + i * DK, DK);
    float yv = dot(Y + i * DV, c.v + i * DV, DV);
    dbeta[i] = std::exp(c.G[i]) * xk + yv + rs[i];
    dG[i] = f[i] * xk + c.beta[i] * rs[i] - cs[i];
    for (int64_t d = 0; d < DV; ++d) dv[i * DV + d] = c.beta[i] * Y[i * DV + d];
  }
}

void l2norm_bwd_rows(const float* y, const float* r, float* dy, int64_t L, int64_t D) {
  for (int64_t i = 0; i < L; ++i) {
    float* g = dy + i * D;
    float c = dot(g, y + i * D, D);
    for (int64_t d = 0; d < D; ++d) g[d] = r[i] * (g[d] - c * y[i * D + d]);
  }
}

}  // namespace ot::gdn::detail
