// Per-chunk building blocks of the chunked gated delta rule on fp32 scratch (row-major, explicit
// leading dims). Every matrix product goes through ot::gemm::matmul; what stays here is the
// elementwise work around it (gates, masks, triangular solve). Shared by the stage operators, the
// fused forward and (later) the backward.
#pragma once
#include <cstdint>

namespace ot::gdn::detail {

// G = scale * chunk-local prefix sum of g (reverse: suffix sum), fp32.
void cumsum_chunk(const float* g, int64_t L, float* G, bool reverse, float scale);
// E[i][j] = exp(G_i - G_j) for j <= i (ld = kChunk); entries above the diagonal are not written.
void decay_matrix(const float* G, int64_t L, float* E);
// M = strict(diag(beta) (K K^T) o E), ld = kChunk; columns/rows >= L zero.
void kkt_chunk(const float* K, int64_t ldk, int64_t L, int64_t DK, const float* beta, const float* E, float* M);
// A = (I + M)^-1 (strictly lower part of M read), ld lda; the full kChunk x kChunk block written.
void solve_tril_chunk(const float* M, int64_t ldm, int64_t L, float* A, int64_t lda);
// W = A diag(beta e^G) K, U = A diag(beta) V. scratch: L x max(DK, DV).
void wu_chunk(const float* A, int64_t lda, const float* K, int64_t ldk, const float* V, int64_t ldv, const float* beta, const float* G,
              int64_t L, int64_t DK, int64_t DV, float* W, int64_t ldw, float* U, int64_t ldu, float* scratch);
// Dn = U - W S (v_new) with S [DK][DV] (ld DV). Dn may alias U.
void vnew_chunk(const float* W, int64_t ldw, const float* U, int64_t ldu, const float* S, int64_t L, int64_t DK, int64_t DV, float* Dn,
                int64_t ldd);
// S = e^{G_last} S + (diag(e^{G_last - G}) K)^T Dn. scratch: L x DK.
void state_update_chunk(float* S, const float* K, int64_t ldk, const float* Dn, int64_t ldd, const float* G, int64_t L, int64_t DK,
                        int64_t DV, float* scratch);
// O = s diag(e^G) Q S + s (causal(E) o Q K^T) Dn. scratch: L x DK, P: kChunk x kChunk.
void out_chunk(const float* Q, int64_t ldq, const float* K, int64_t ldk, const float* Dn, int64_t ldd, const float* S, const float* E,
               const float* G, float s, int64_t L, int64_t DK, int64_t DV, float* O, int64_t ldo, float* scratch, float* P);
// Rows of x scaled to unit L2 norm (eps inside the root); rstd out (may be null).
void l2norm_rows(float* x, int64_t ld, int64_t L, int64_t D, float eps, float* rstd);


// Buffers of the fused forward chunk (fp32, per thread). Stacking lets one matmul do two jobs:
// [K; Q] K^T gives K K^T and Q K^T, A [Kb | Vb] gives W and U, [Qs | P] [S; v_new] gives O.
struct FusedBufs {
  float* kq;    // 2 kChunk x DK: k rows [0, kChunk), q rows [kChunk, 2 kChunk); rows >= L zero
  float* v;     // kChunk x DV
  float *g, *G, *beta, *rq, *rk;  // kChunk
  float *E, *M, *A;               // kChunk x kChunk
  float* kkq;   // 2 kChunk x kChunk
  float* kbvb;  // kChunk x (DK + DV)
  float* wu;    // kChunk x (DK + DV)
  float* sd;    // (DK + kChunk) x DV: the state S, then v_new rows
  float* qsp;   // kChunk x (DK + kChunk)
  float* o;     // kChunk x DV
  float* kd;    // kChunk x DK
};
// The key-head part of a fused chunk: kkq = [K; Q] K^T (shared by the value heads of a group).
void fused_chunk_kkq(const FusedBufs& b, int64_t L, int64_t DK);
// The value-head part (spec section 4). In: kq, kkq, v, g (raw gates), beta, the state in sd rows
// [0, DK). Out: G, A, o (rows < L), v_new in sd rows [DK, DK + L), the state advanced.
void fused_chunk_fwd(const FusedBufs& b, int64_t L, int64_t DK, int64_t DV, float scale);

}  // namespace ot::gdn::detail
