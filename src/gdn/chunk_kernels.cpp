// Portable build of the chunk kernels and the per-ISA dispatchers (one branch per call).
#define OT_CK_NS generic
#include "src/gdn/chunk_kernels.inc"
#undef OT_CK_NS

#include "ot/cpu.h"
#include "src/gdn/chunk_kernels.h"

namespace ot::gdn::detail {
// The AVX2 and AVX-512 builds of chunk_kernels.inc (chunk_kernels__avx2.cpp, __avx512.cpp): the
// same signatures.
#define OT_CK_DECLARE(ns) \
  namespace ns { \
  decltype(detail::fused_chunk_kkq) fused_chunk_kkq; \
  decltype(detail::fused_chunk_fwd) fused_chunk_fwd; \
  decltype(detail::cumsum_chunk) cumsum_chunk; \
  decltype(detail::decay_matrix) decay_matrix; \
  decltype(detail::kkt_chunk) kkt_chunk; \
  decltype(detail::solve_tril_chunk) solve_tril_chunk; \
  decltype(detail::wu_chunk) wu_chunk; \
  decltype(detail::vnew_chunk) vnew_chunk; \
  decltype(detail::state_update_chunk) state_update_chunk; \
  decltype(detail::out_chunk) out_chunk; \
  decltype(detail::l2norm_rows) l2norm_rows; \
  }
OT_CK_DECLARE(avx2)
OT_CK_DECLARE(avx512)
#undef OT_CK_DECLARE

// f from the highest build this machine may run.
#define OT_CK_CALL(f, ...)                                                        \
  (cpu::has(cpu::Isa::avx512) ? avx512::f(__VA_ARGS__)                            \
   : cpu::has(cpu::Isa::avx2) ? avx2::f(__VA_ARGS__)                              \
                              : generic::f(__VA_ARGS__))

void cumsum_chunk(const float* g, int64_t L, float* G, bool reverse, float scale) {
  OT_CK_CALL(cumsum_chunk, g, L, G, reverse, scale);
}

void decay_matrix(const float* G, int64_t L, float* E) {
  OT_CK_CALL(decay_matrix, G, L, E);
}

void kkt_chunk(const float* K, int64_t ldk, int64_t L, int64_t DK, const float* beta, const float* E, float* M) {
  OT_CK_CALL(kkt_chunk, K, ldk, L, DK, beta, E, M);
}

void solve_tril_chunk(const float* M, int64_t ldm, int64_t L, float* A, int64_t lda) {
  OT_CK_CALL(solve_tril_chunk, M, ldm, L, A, lda);
}

void wu_chunk(const float* A, int64_t lda, const float* K, int64_t ldk, const float* V, int64_t ldv, const float* beta, const float* G,
              int64_t L, int64_t DK, int64_t DV, float* W, int64_t ldw, float* U, int64_t ldu, float* scratch) {
  OT_CK_CALL(wu_chunk, A, lda, K, ldk, V, ldv, beta, G, L, DK, DV, W, ldw, U, ldu, scratch);
}

void vnew_chunk(const float* W, int64_t ldw, const float* U, int64_t ldu, const float* S, int64_t L, int64_t DK, int64_t DV, float* Dn,
                int64_t ldd) {
  OT_CK_CALL(vnew_chunk, W, ldw, U, ldu, S, L, DK, DV, Dn, ldd);
}

void state_update_chunk(float* S, const float* K, int64_t ldk, const float* Dn, int64_t ldd, const float* G, int64_t L, int64_t DK,
                        int64_t DV, float* scratch) {
  OT_CK_CALL(state_update_chunk, S, K, ldk, Dn, ldd, G, L, DK, DV, scratch);
}

void out_chunk(const float* Q, int64_t ldq, const float* K, int64_t ldk, const float* Dn, int64_t ldd, const float* S, const float* E,
               const float* G, float s, int64_t L, int64_t DK, int64_t DV, float* O, int64_t ldo, float* scratch, float* P) {
  OT_CK_CALL(out_chunk, Q, ldq, K, ldk, Dn, ldd, S, E, G, s, L, DK, DV, O, ldo, scratch, P);
}

void l2norm_rows(float* x, int64_t ld, int64_t L, int64_t D, float eps, float* rstd) {
  OT_CK_CALL(l2norm_rows, x, ld, L, D, eps, rstd);
}

void fused_chunk_fwd(const FusedBufs& b, int64_t L, int64_t DK, int64_t DV, float scale) {
  OT_CK_CALL(fused_chunk_fwd, b, L, DK, DV, scale);
}

void fused_chunk_kkq(const FusedBufs& b, int64_t L, int64_t DK) {
  OT_CK_CALL(fused_chunk_kkq, b, L, DK);
}

#undef OT_CK_CALL

}  // namespace ot::gdn::detail
