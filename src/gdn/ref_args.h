// The fast path's internal forms turned back into the public arguments the references take
// (src/ref/gdn_ref.h, gdn_bwd_ref.h): a token accessor back to its view, the sequences back to
// their cu_seqlens.
#pragma once
#include <vector>

#include "src/gdn/gdn_internal.h"

namespace ot::gdn::detail {

// The view a Tok was read from ([B,T,H,D] / [B,H,T,D], packed without B; scalars without D).
inline TensorView view_of(const Tok& x, Layout l, bool scalar) {
  if (!x.defined()) return {};
  std::vector<int64_t> size, stride;
  if (!x.packed) size.push_back(x.B), stride.push_back(x.sb);
  if (l == Layout::BTHD) size.insert(size.end(), {x.T, x.H}), stride.insert(stride.end(), {x.st, x.sh});
  else size.insert(size.end(), {x.H, x.T}), stride.insert(stride.end(), {x.sh, x.st});
  if (!scalar) size.push_back(x.D), stride.push_back(x.sd);
  return TensorView(x.p, x.dt, size, stride);
}
inline TensorView vec_view(const Tok& x, Layout l) { return view_of(x, l, false); }
inline TensorView scal_view(const Tok& x, Layout l) { return view_of(x, l, true); }

// cu_seqlens of a varlen batch (empty for B sequences of T tokens).
inline std::vector<int64_t> cu_of(const SeqInfo& s) {
  if (!s.varlen) return {};
  std::vector<int64_t> cu;
  for (int64_t n = 0; n < s.num_seqs(); ++n) cu.push_back(s.bos[size_t(n)]);
  cu.push_back(s.tokens);
  return cu;
}

}  // namespace ot::gdn::detail
