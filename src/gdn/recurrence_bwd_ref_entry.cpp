// ot::gdn::ref::recurrence_bwd (ot/gdn_bwd.h): the backward's validation and outputs, then the
// plain reference of src/ref/gdn_bwd_ref.h.
#include "ot/gdn_bwd.h"
#include "ot/trace.h"
#include "src/gdn/gdn_bwd_common.h"
#include "src/gdn/ref_args.h"
#include "src/ref/gdn_bwd_ref.h"

namespace ot::gdn::ref {

ChunkBwd recurrence_bwd(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g, const TensorView& beta,
                        const TensorView& dO, const ChunkBwdOptions& opt) {
  const char* op = "gdn_recurrence_bwd_ref";
  trace::OpScope scope(op);
  detail::BwdArgs a;
  detail::check_bwd(a, q, k, v, g, beta, dO, opt, false, op);
  ChunkBwd r = detail::alloc_bwd(a, q, v, beta, opt);
  if (scope.active()) scope.args(detail::shape_args(q, v, opt.layout)).kernel("ref");
  bwdref::recurrence_bwd(q, k, v, g, beta, dO, opt.initial_state, opt.dht, a.scale, opt.use_qk_l2norm_in_kernel, r.dq, r.dk, r.dv, r.dg,
                         r.dbeta, r.dh0, opt.layout, detail::cu_of(*a.seq));
  return r;
}

}  // namespace ot::gdn::ref
