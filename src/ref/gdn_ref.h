// Plain fp64 references of every GDN forward stage (src/ref/gdn_ref.cpp): the OT_FORCE_REF path
// of each operator and the ground truth of the tests. Tensors as the operators take them, in
// layout l (token tensors [B,T,H,D] / [B,H,T,D] or packed without B; scalars without D; states
// [N, HV, DK, DV]); cu: the values of cu_seqlens (empty: B sequences of T tokens). The caller
// validates the arguments.
#pragma once
#include <cstdint>
#include <vector>

#include "ot/gdn.h"

namespace ot::gdn::refimpl {

void cumsum(const TensorView& g, const TensorView& G, Layout l, const std::vector<int64_t>& cu, bool reverse, float scale);
void l2norm(const TensorView& x, const TensorView& y, const TensorView& rstd, float eps);
void kkt(const TensorView& k, const TensorView& G, const TensorView& beta, const TensorView& M, Layout l, const std::vector<int64_t>& cu);
void solve_tril(const TensorView& M, const TensorView& A, Layout l, const std::vector<int64_t>& cu);
void wu(const TensorView& k, const TensorView& v, const TensorView& beta, const TensorView& A, const TensorView& G, const TensorView& w,
        const TensorView& u, Layout l, const std::vector<int64_t>& cu);
// h: [num_chunks, HV, DK, DV] fp32, chunks numbered sequence by sequence (may be null); fin may be
// undefined.
void fwd_h(const TensorView& k, const TensorView& w, const TensorView& u, const TensorView& G, const TensorView& S0, float* h,
           const TensorView& vnew, const TensorView& fin, Layout l, const std::vector<int64_t>& cu);
void fwd_o(const TensorView& q, const TensorView& k, const TensorView& vnew, const float* h, const TensorView& G, double scale,
           const TensorView& o, Layout l, const std::vector<int64_t>& cu);

// The token recurrence (spec section 3) in fp64. g: raw log gates (undefined: 0); beta undefined:
// 1. With l2norm, q and k rows are normalised first (eps 1e-6 inside the root). fin (when defined)
// receives the state after commit[n] tokens of sequence n (all tokens when commit is null).
void recurrence(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g, const TensorView& beta,
                const TensorView& S0, bool l2norm, double scale, const TensorView& o, const TensorView& fin, Layout l,
                const std::vector<int64_t>& cu, const std::vector<int64_t>* commit = nullptr);

}  // namespace ot::gdn::refimpl
