// Backward of the load-balancing losses (Megatron definitions, spec section 11).
#include <cmath>
#include <vector>

#include "ot/cpu.h"
#include "ot/moe_bwd.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "src/moe/bwd_common.h"

namespace ot::moe {

namespace bwd {
std::vector<double> read_counts(const char* op, const TensorView& c, int64_t E) {
  OT_CHECK((c.dtype == DType::i32 || c.dtype == DType::i64) && c.ndim == 1 && c.sizes[0] == E, op, "tokens_per_expert",
           detail::cat("[", E, "] int32 or int64"), c.shape_str());
  std::vector<double> v(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) v[size_t(e)] = get_as_double(c, e);
  return v;
}
void check_loss_input(const char* op, const char* arg, const TensorView& v) {
  OT_CHECK(v.ndim == 2, op, arg, "[T, E]", v.shape_str());
  check_float(op, arg, v);
}
void check_mask(const char* op, const TensorView& mask, int64_t T) {
  if (mask.defined())
    OT_CHECK(mask.dtype == DType::u8 && mask.ndim == 1 && mask.sizes[0] == T, op, "mask", detail::cat("[", T, "] u8"), mask.shape_str());
}
}  // namespace bwd

Tensor moe_aux_loss_backward(const TensorView& probs, const TensorView& tpe, int64_t k, float coeff, float d_loss) {
  const char* op = "moe_aux_loss_backward";
  bwd::check_loss_input(op, "probs", probs);
  OT_CHECK(k >= 1, op, "k", ">= 1", k);
  const int64_t T = probs.sizes[0], E = probs.sizes[1];
  auto counts = bwd::read_counts(op, tpe, E);
  if (cpu::force_ref()) return ref::moe_aux_loss_backward(probs, tpe, k, coeff, d_loss);
  Tensor d = Tensor::zeros(DType::f32, {T, E});
  if (T == 0) return d;
  double c = double(d_loss) * coeff * double(E) / (double(k) * double(T) * double(T));
  bwd::parallel_rows(T, E * 8, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t e = 0; e < E; ++e) d.ptr<float>()[t * E + e] = float(c * counts[size_t(e)]);
  });
  return d;
}

Tensor moe_z_loss_backward(const TensorView& logits, float coeff, const TensorView& mask, float d_loss) {
  const char* op = "moe_z_loss_backward";
  bwd::check_loss_input(op, "logits", logits);
  const int64_t T = logits.sizes[0], E = logits.sizes[1];
  bwd::check_mask(op, mask, T);
  if (cpu::force_ref()) return ref::moe_z_loss_backward(logits, coeff, mask, d_loss);
  int64_t n = 0;
  for (int64_t t = 0; t < T; ++t) n += !mask.defined() || mask.ptr<uint8_t>()[t] != 0;
  Tensor d = Tensor::zeros(DType::f32, {T, E});
  double c = double(d_loss) * coeff * 2.0 / double(n > 0 ? n : 1);
  bwd::parallel_rows(T, E * 8, [&](int64_t t0, int64_t t1) {
    std::vector<double> x(static_cast<size_t>(E));
    for (int64_t t = t0; t < t1; ++t) {
      if (mask.defined() && !mask.ptr<uint8_t>()[t]) continue;
      double m = -INFINITY, s = 0;
      for (int64_t e = 0; e < E; ++e) m = std::fmax(m, x[size_t(e)] = get_as_double(logits, t * E + e));
      for (int64_t e = 0; e < E; ++e) s += std::exp(x[size_t(e)] - m);
      double lse = m + std::log(s);
      for (int64_t e = 0; e < E; ++e) d.ptr<float>()[t * E + e] = float(c * lse * std::exp(x[size_t(e)] - lse));
    }
  });
  return d;
}

}  // namespace ot::moe
