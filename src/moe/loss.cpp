// Load-balancing losses and capacity: validation plus fast fp32-row kernels.
#include <algorithm>
#include <cmath>

#include "ot/cpu.h"
#include "ot/moe/loss.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "src/moe/common.h"
#include "src/ref/moe_loss_ref.h"

namespace ot::moe {
namespace impl {

struct AuxPlan { int64_t T = 0, E = 0; std::vector<int64_t> counts; Tensor hp; TensorView probs; };
static AuxPlan plan_aux(const TensorView& probs, const TensorView& tpe, int64_t k) {
  const char* op = "moe_aux_loss";
  AuxPlan p;
  check_ndim(op, "probs", probs, 2);
  check_float(op, "probs", probs);
  check_ndim(op, "tokens_per_expert", tpe, 1);
  check_dim(op, "tokens_per_expert", tpe, 0, probs.size(1));
  OT_CHECK(k >= 1 && k <= probs.size(1), op, "k", "1 <= k <= E", k);
  p.T = probs.size(0); p.E = probs.size(1);
  p.counts = read_ints(op, "tokens_per_expert", tpe);
  p.probs = contig(probs, p.hp);
  return p;
}
struct ZPlan { int64_t T = 0, E = 0; Tensor hl, hm; TensorView logits, mask; };
static ZPlan plan_z(const TensorView& logits, const TensorView& mask) {
  const char* op = "moe_z_loss";
  ZPlan p;
  check_ndim(op, "logits", logits, 2);
  check_float(op, "logits", logits);
  check_finite(op, "logits", logits);
  if (mask.defined()) {
    check_dtype(op, "mask", mask, DType::u8);
    OT_CHECK(mask.ndim == 1 && mask.size(0) == logits.size(0), op, "mask", "[T]", mask.shape_str());
  }
  p.T = logits.size(0); p.E = logits.size(1);
  p.logits = contig(logits, p.hl);
  p.mask = contig(mask, p.hm);
  return p;
}

}  // namespace impl

float moe_aux_loss(const TensorView& probs, const TensorView& tpe, int64_t k, float coeff) {
  impl::AuxPlan p = impl::plan_aux(probs, tpe, k);
  trace::OpScope scope("moe_aux_loss");
  if (cpu::force_ref()) return refimpl::aux_loss(probs, tpe, k, coeff);
  if (p.T == 0) return 0.f;
  std::vector<float> col(static_cast<size_t>(p.E), 0.f), row(static_cast<size_t>(p.E));
  for (int64_t t = 0; t < p.T; ++t) {
    impl::load_f32(p.probs, t * p.E, row.data(), p.E);
    for (int64_t e = 0; e < p.E; ++e) col[size_t(e)] += row[size_t(e)];
  }
  double s = 0;
  for (int64_t e = 0; e < p.E; ++e) s += double(col[size_t(e)]) * double(p.counts[size_t(e)]);
  return float(s * double(coeff) * double(p.E) / (double(k) * double(p.T) * double(p.T)));
}

float moe_z_loss(const TensorView& logits, float coeff, const TensorView& mask) {
  impl::ZPlan p = impl::plan_z(logits, mask);
  trace::OpScope scope("moe_z_loss");
  if (cpu::force_ref()) return refimpl::z_loss(logits, coeff, mask);
  std::vector<float> row(static_cast<size_t>(p.E));
  double s = 0;
  int64_t valid = 0;
  for (int64_t t = 0; t < p.T; ++t) {
    if (p.mask.defined() && !p.mask.ptr<uint8_t>()[t]) continue;
    impl::load_f32(p.logits, t * p.E, row.data(), p.E);
    float m = *std::max_element(row.begin(), row.end()), sum = 0;
    for (float v : row) sum += std::exp(v - m);
    float lse = m + std::log(sum);
    s += double(lse) * double(lse);
    ++valid;
  }
  return float(double(coeff) * s / double(std::max<int64_t>(valid, 1)));
}

int64_t moe_capacity(int64_t tokens, int64_t k, int64_t experts, double factor, int64_t min_capacity) {
  const char* op = "moe_capacity";
  OT_CHECK(tokens >= 0, op, "tokens", ">= 0", tokens);
  OT_CHECK(k >= 1, op, "k", ">= 1", k);
  OT_CHECK(experts >= 1, op, "experts", ">= 1", experts);
  OT_CHECK(factor > 0 && std::isfinite(factor), op, "capacity_factor", "a finite number > 0", factor);
  int64_t c = int64_t(std::ceil(double(tokens) * double(k) / double(experts) * factor));
  return std::max(c, min_capacity);
}

namespace ref {
float moe_aux_loss(const TensorView& probs, const TensorView& tpe, int64_t k, float coeff) {
  impl::plan_aux(probs, tpe, k);
  return refimpl::aux_loss(probs, tpe, k, coeff);
}
float moe_z_loss(const TensorView& logits, float coeff, const TensorView& mask) {
  impl::plan_z(logits, mask);
  return refimpl::z_loss(logits, coeff, mask);
}
}  // namespace ref

}  // namespace ot::moe
