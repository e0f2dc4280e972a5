// fp64 ground truth of the GDN backward (src/ref/gdn_bwd_ref.cpp): the token recurrence of spec
// section 3 for one (sequence, value head), and its exact gradients by hand-written reverse mode
// (backpropagation through the tokens). Independent of the chunked algorithm.
#pragma once
#include <cstdint>

#include "src/gdn/gdn_internal.h"

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

// ---- fp64 references of the backward stages (spec 6.1-6.4), plain loops over chunk rows --------
// Same canonical views as the fast stages; h, dh: [num_chunks, HV, DK, DV] fp32.
using detail::StateRef;
using detail::Tok;
void dv_local(const Tok& q, const Tok& k, const Tok& G, const Tok& dO, double s, const Tok& out, const SeqInfo& seq);
void dhu(const Tok& q, const Tok& k, const Tok& w, const Tok& G, const StateRef& dht, const Tok& dO, const Tok& dvl, double s, float* dh,
         const StateRef& dh0, const Tok& dv2, const SeqInfo& seq);
void dqkwg(const Tok& q, const Tok& k, const Tok& vnew, const float* h, const Tok& G, const Tok& dv2, const Tok& dO, const float* dh, double s,
           const Tok& dq, const Tok& dk, const Tok& dw, const Tok& dg, const SeqInfo& seq);
void wy_da(const Tok& k, const Tok& v, const Tok& beta, const Tok& A, const Tok& dw, const Tok& du, const Tok& G, const Tok& dP, const SeqInfo& seq);
void wy_full(const Tok& k, const Tok& v, const Tok& beta, const Tok& A, const Tok& dP, const Tok& dw, const Tok& du, const Tok& G, const Tok& dk,
             const Tok& dv, const Tok& dbeta, const Tok& dg, const SeqInfo& seq);

}  // namespace ot::gdn::bwdref
