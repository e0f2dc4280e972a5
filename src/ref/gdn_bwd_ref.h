// fp64 ground truth of the GDN backward (src/ref/gdn_bwd_ref.cpp): the token recurrence of spec
// section 3 for one (sequence, value head), and its exact gradients by hand-written reverse mode
// (backpropagation through the tokens). Independent of the chunked algorithm.
#pragma once
#include <cstdint>
#include <vector>

#include "ot/gdn.h"

namespace ot::gdn::bwdref {

// One (sequence, value head). Row-major: q, k [L][K] (raw: normalised here when l2norm),
// v [L][V], beta, g [L] (raw log gates), S0 [K][V] (null: zero state).
struct Head {
  int64_t L = 0, K = 0, V = 0;
  const double *q = nullptr, *k = nullptr, *v = nullptr, *beta = nullptr, *g = nullptr, *S0 = nullptr;
  double scale = 1.0;
  bool l2norm = false;
};

// o [L][V] (may be null), final state [K][V] (may be null).
void head_fwd(const Head& x, double* o, double* ST);

// Gradients of loss = sum(o * dO) + sum(S_T * dST) (dST null: 0). dq and dk are w.r.t. the raw q, k
// (through the l2norm when on) and are ADDED to (so grouped value heads sum into their key head);
// dv, dbeta, dg [L], dS0 [K][V] are written (any may be null).
void head_bwd(const Head& x, const double* dO, const double* dST, double* dq, double* dk, double* dv, double* dbeta, double* dg,
              double* dS0);

// Tensors below as the operators take them, in layout l (token tensors [B,T,H,D] / [B,H,T,D] or
// packed without B; scalars without D; states [N, HV, DK, DV]); cu: the values of cu_seqlens
// (empty: B sequences of T tokens). The caller validates the arguments.

// Every sequence and value head through head_bwd. g: raw log gates (undefined: 0); beta undefined:
// 1; S0, dht, dh0 may be undefined. Writes dq, dk, dv, dg, dbeta (and dh0).
void recurrence_bwd(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g, const TensorView& beta,
                    const TensorView& dO, const TensorView& S0, const TensorView& dht, double scale, bool l2norm, const TensorView& dq,
                    const TensorView& dk, const TensorView& dv, const TensorView& dg, const TensorView& dbeta, const TensorView& dh0, Layout l,
                    const std::vector<int64_t>& cu);

// ---- the backward stages (spec 6.1-6.4), plain loops over chunk rows -------------------------
// h, dh: [num_chunks, HV, DK, DV] fp32, chunks numbered sequence by sequence.
void dv_local(const TensorView& q, const TensorView& k, const TensorView& G, const TensorView& dO, double s, const TensorView& out, Layout l,
              const std::vector<int64_t>& cu);
void dhu(const TensorView& q, const TensorView& k, const TensorView& w, const TensorView& G, const TensorView& dht, const TensorView& dO,
         const TensorView& dvl, double s, float* dh, const TensorView& dh0, const TensorView& dv2, Layout l, const std::vector<int64_t>& cu);
void dqkwg(const TensorView& q, const TensorView& k, const TensorView& vnew, const float* h, const TensorView& G, const TensorView& dv2,
           const TensorView& dO, const float* dh, double s, const TensorView& dq, const TensorView& dk, const TensorView& dw, const TensorView& dg,
           Layout l, const std::vector<int64_t>& cu);
void wy_da(const TensorView& k, const TensorView& v, const TensorView& beta, const TensorView& A, const TensorView& dw, const TensorView& du,
           const TensorView& G, const TensorView& dP, Layout l, const std::vector<int64_t>& cu);
void wy_full(const TensorView& k, const TensorView& v, const TensorView& beta, const TensorView& A, const TensorView& dP, const TensorView& dw,
             const TensorView& du, const TensorView& G, const TensorView& dk, const TensorView& dv, const TensorView& dbeta, const TensorView& dg,
             Layout l, const std::vector<int64_t>& cu);

}  // namespace ot::gdn::bwdref
