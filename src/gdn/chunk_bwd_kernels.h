// Per-chunk building blocks of the chunked GDN backward (spec section 6) on fp32 scratch. Row-major
// with explicit leading dims; L x L chunk matrices (E, A, P, dP) have leading dim kChunk. Every
// matrix product goes through ot::gemm (see BwdChunk::bf16); what stays here is the elementwise work (gates,
// masks, row dots), built once per ISA (chunk_bwd_kernels.inc). Used by the stage operators and the
// fused composition alike.
#pragma once
#include <cstdint>

namespace ot::gdn::detail {

// Operands of one chunk (rows 0..L-1). G: chunk-cumulative gate, E = decay_matrix(G).
struct BwdChunk {
  int64_t L = 0, DK = 0, DV = 0;
  float scale = 1.f;
  const float *q = nullptr, *k = nullptr;   // [L][DK] (already l2-normalised when asked)
  const float *v = nullptr;                 // [L][DV]
  const float *dO = nullptr;                // [L][DV]
  const float *G = nullptr, *beta = nullptr, *E = nullptr;
  // Raw Gram products of the chunk's (normalised) rows, [L][kChunk] (grams_chunk): per key head,
  // so a group's value heads share them. QK: dv_local and dqkwg; KK: wy_bwd_full.
  const float *QK = nullptr, *KK = nullptr;
  // The bf16 path (bf16 q, k, v): every product takes bf16-rounded operands with fp32 accumulation
  // (gemm::matmul_bf16_operands), fla's precision; the elementwise work stays fp32.
  bool bf16 = false;
};

// QK = Q K^T and KK = K K^T (either may be null), [L][kChunk]; bf16: as BwdChunk::bf16.
void grams_chunk(const float* q, const float* k, int64_t L, int64_t DK, float* QK, float* KK, bool bf16);

// W = A diag(beta e^G) K -> [L][DK] (A: (I + M)^-1 [L][kChunk]); scratch: L x DK.
void w_chunk(const BwdChunk& c, const float* A, float* W, float* scratch);

// dv_local = s (causal(E) o Q K^T)^T dO -> out [L][DV] (Q K^T from c.QK). P: kChunk x kChunk scratch.
void dv_local_chunk(const BwdChunk& c, float* out, float* P);

// dv2 = diag(e^{G_last - G}) K dH + dv_local (dv2 may alias dv_local). dH: [DK][DV]. scratch L x DK.
void dv2_chunk(const BwdChunk& c, const float* dH, const float* dv_local, float* dv2, float* scratch);

// dH <- e^{G_last} dH + s (diag(e^G) Q)^T dO - W^T dv2 (state gradient before the chunk). scratch L x DK.
void dh_update_chunk(const BwdChunk& c, float* dH, const float* W, const float* dv2, float* scratch);

// chunk_bwd_dqkwg: S = h[c] (state before the chunk), dH = dh[c] (gradient of the state after it),
// vnew = v_new, dv2. Writes dq, dk, dw [L][DK] and dG (w.r.t. the cumulative gate) [L].
// dG is summed from per-token and per-pair terms that carry their own decay factor (no
// cancellation of O(1) terms: accurate where the gates saturate). P: kChunk x kChunk scratch.
void dqkwg_chunk(const BwdChunk& c, const float* vnew, const float* S, const float* dH, const float* dv2, float* dq, float* dk, float* dw,
                 float* dG, float* P);

// prepare_wy_repr_bwd_da: dP = strict(-A^T strict(dW kbg^T + dU vb^T) A^T) o E, [L][kChunk]
// (row i, column j < i; zero elsewhere). A: (I + M)^-1 [L][kChunk]. T1, T2: kChunk x kChunk scratch;
// scratch: L x max(DK, DV).
void wy_bwd_da_chunk(const BwdChunk& c, const float* A, const float* dW, const float* dU, float* dP, float* T1, float* T2, float* scratch);

// prepare_wy_repr_bwd_full: from dP and the W, U gradients: dk [L][DK], dv [L][DV], dbeta [L] and
// dG [L] (WY part, w.r.t. the cumulative gate); every output written (not accumulated).
// X: L x DK, Y: L x DV, scratch: L x max(DK, DV).
void wy_bwd_full_chunk(const BwdChunk& c, const float* A, const float* dP, const float* dW, const float* dU, float* dk, float* dv, float* dbeta,
                       float* dG, float* X, float* Y, float* scratch);

// l2norm backward of rows: dx = r (dy - (dy . y) y) in place on dy (y: normalised rows, r: 1/norm).
void l2norm_bwd_rows(const float* y, const float* r, float* dy, int64_t L, int64_t D);

}  // namespace ot::gdn::detail
