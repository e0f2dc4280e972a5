// Causal attention (include/ot/attention.h) as torch ops: the forward (o, lse) and its backward.
#include "bridge.h"
#include "ops.h"
#include "ot/attention.h"

namespace ot::py {

std::tuple<Tensor, Tensor> causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
  const char* op = "causal_attention";
  auto r = ot::causal_attention(view(q, op, "q"), view(k, op, "k"), view(v, op, "v"), float(scale));
  return {wrap(r.o), wrap(r.lse)};
}

std::tuple<Tensor, Tensor, Tensor> causal_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                                             const Tensor& o, const Tensor& lse, double scale) {
  const char* op = "causal_attention_backward";
  auto g = ot::causal_attention_backward(view(dout, op, "dout"), view(q, op, "q"), view(k, op, "k"), view(v, op, "v"), view(o, op, "o"),
                                         view(lse, op, "lse"), float(scale));
  return {wrap(g.dq), wrap(g.dk), wrap(g.dv)};
}

}  // namespace ot::py
