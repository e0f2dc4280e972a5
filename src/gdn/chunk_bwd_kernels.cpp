// Portable build of the backward chunk kernels and the per-ISA dispatchers (one branch per call).
#define OT_CBK_NS generic
#include "src/gdn/chunk_bwd_kernels.inc"
#undef OT_CBK_NS

#include "ot/cpu.h"

namespace ot::gdn::detail {
// The AVX2 and AVX-512 builds of chunk_bwd_kernels.inc (chunk_bwd_kernels__avx2.cpp, __avx512.cpp).
#define OT_CBK_DECLARE(ns) \
  namespace ns { \
  decltype(detail::grams_chunk) grams_chunk; \
  decltype(detail::w_chunk) w_chunk; \
  decltype(detail::dv_local_chunk) dv_local_chunk; \
  decltype(detail::dv2_chunk) dv2_chunk; \
  decltype(detail::dh_update_chunk) dh_update_chunk; \
  decltype(detail::dqkwg_chunk) dqkwg_chunk; \
  decltype(detail::wy_bwd_da_chunk) wy_bwd_da_chunk; \
  decltype(detail::wy_bwd_full_chunk) wy_bwd_full_chunk; \
  decltype(detail::l2norm_bwd_rows) l2norm_bwd_rows; \
  }
OT_CBK_DECLARE(avx2)
OT_CBK_DECLARE(avx512)
#undef OT_CBK_DECLARE

// f from the highest build this machine may run.
#define OT_CBK_CALL(f, ...)                                                       \
  (cpu::has(cpu::Isa::avx512) ? avx512::f(__VA_ARGS__)                            \
   : cpu::has(cpu::Isa::avx2) ? avx2::f(__VA_ARGS__)                              \
                              : generic::f(__VA_ARGS__))

void grams_chunk(const float* q, const float* k, int64_t L, int64_t DK, float* QK, float* KK, bool bf16) {
  OT_CBK_CALL(grams_chunk, q, k, L, DK, QK, KK, bf16);
}

void w_chunk(const BwdChunk& c, const float* A, float* W, float* scratch) { OT_CBK_CALL(w_chunk, c, A, W, scratch); }

void dv_local_chunk(const BwdChunk& c, float* out, float* P) { OT_CBK_CALL(dv_local_chunk, c, out, P); }

void dv2_chunk(const BwdChunk& c, const float* dH, const float* dv_local, float* dv2, float* scratch) {
  OT_CBK_CALL(dv2_chunk, c, dH, dv_local, dv2, scratch);
}

void dh_update_chunk(const BwdChunk& c, float* dH, const float* W, const float* dv2, float* scratch) {
  OT_CBK_CALL(dh_update_chunk, c, dH, W, dv2, scratch);
}

void dqkwg_chunk(const BwdChunk& c, const float* vnew, const float* S, const float* dH, const float* dv2, float* dq, float* dk, float* dw,
                 float* dG, float* P) {
  OT_CBK_CALL(dqkwg_chunk, c, vnew, S, dH, dv2, dq, dk, dw, dG, P);
}

void wy_bwd_da_chunk(const BwdChunk& c, const float* A, const float* dW, const float* dU, float* dP, float* T1, float* T2, float* scratch) {
  OT_CBK_CALL(wy_bwd_da_chunk, c, A, dW, dU, dP, T1, T2, scratch);
}

void wy_bwd_full_chunk(const BwdChunk& c, const float* A, const float* dP, const float* dW, const float* dU, float* dk, float* dv, float* dbeta,
                       float* dG, float* X, float* Y, float* scratch) {
  OT_CBK_CALL(wy_bwd_full_chunk, c, A, dP, dW, dU, dk, dv, dbeta, dG, X, Y, scratch);
}

void l2norm_bwd_rows(const float* y, const float* r, float* dy, int64_t L, int64_t D) { OT_CBK_CALL(l2norm_bwd_rows, y, r, dy, L, D); }

#undef OT_CBK_CALL

}  // namespace ot::gdn::detail
