// fp64 ground truth of the GDN backward (src/ref/gdn_bwd_ref.cpp): the token recurrence of spec
// section 3 for one (sequence, value head), and its exact gradients by hand-written reverse mode
// (backpropagation through the tokens). Independent of the chunked algorithm.
#pragma once
#include <cstdint>

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

}  // namespace ot::gdn::bwdref
