// Plain fp64 references of every GDN forward stage (src/ref/gdn_ref.cpp): the OT_FORCE_REF path
// of each operator and the ground truth of the tests. Same canonical views as the fast path.
#pragma once
#include <vector>

#include "src/gdn/gdn_internal.h"

namespace ot::gdn::refimpl {

using detail::StateRef;
using detail::Tok;

void cumsum(const Tok& g, const Tok& G, const SeqInfo& s, bool reverse, float scale);
void l2norm(const TensorView& x, const TensorView& y, const TensorView& rstd, float eps);
void kkt(const Tok& k, const Tok& G, const Tok& beta, const Tok& M, const SeqInfo& s);
void solve_tril(const Tok& M, const Tok& A, const SeqInfo& s);
void wu(const Tok& k, const Tok& v, const Tok& beta, const Tok& A, const Tok& G, const Tok& w, const Tok& u, const SeqInfo& s);
// h: [num_chunks, HV, DK, DV] fp32 (may be null); fin may be undefined.
void fwd_h(const Tok& k, const Tok& w, const Tok& u, const Tok& G, const StateRef& S0, float* h, const Tok& vnew, const StateRef& fin,
           const SeqInfo& s);
void fwd_o(const Tok& q, const Tok& k, const Tok& vnew, const float* h, const Tok& G, double scale, const Tok& o, const SeqInfo& s);

// The token recurrence (spec section 3) in fp64. g: raw log gates (undefined: 0); beta undefined:
// 1. With l2norm, q and k rows are normalised first (eps 1e-6 inside the root). fin (when defined)
// receives the state after commit[n] tokens of sequence n (all tokens when commit is null).
void recurrence(const Tok& q, const Tok& k, const Tok& v, const Tok& g, const Tok& beta, const StateRef& S0, bool l2norm, double scale,
                const Tok& o, const StateRef& fin, const SeqInfo& s, const std::vector<int64_t>* commit = nullptr);

}  // namespace ot::gdn::refimpl
