// Loss references: the Megatron formulas term by term in fp64.
#include "src/ref/moe_loss_ref.h"

#include <cmath>

namespace ot::moe::refimpl {

float aux_loss(const TensorView& probs, const TensorView& tokens_per_expert, int64_t k, float coeff) {
  const int64_t T = probs.size(0), E = probs.size(1);
  if (T == 0) return 0.f;
  // coeff * E * sum_i f_i * P_i with f_i = counts_i / (T*K), P_i = mean_t probs[t, i].
  double loss = 0;
  for (int64_t i = 0; i < E; ++i) {
    double P = 0;
    for (int64_t t = 0; t < T; ++t) P += get_as_double(probs, t * E + i);
    P /= double(T);
    double f = get_as_double(tokens_per_expert, i) / (double(T) * double(k));
    loss += f * P;
  }
  return float(double(coeff) * double(E) * loss);
}

float z_loss(const TensorView& logits, float coeff, const TensorView& mask) {
  const int64_t T = logits.size(0), E = logits.size(1);
  double s = 0;
  int64_t n = 0;
  for (int64_t t = 0; t < T; ++t) {
    if (mask.defined() && get_as_double(mask, t) == 0) continue;
    double m = -INFINITY;
    for (int64_t e = 0; e < E; ++e) m = std::fmax(m, get_as_double(logits, t * E + e));
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += std::exp(get_as_double(logits, t * E + e) - m);
    double lse = m + std::log(sum);
    s += lse * lse;
    ++n;
  }
  return float(double(coeff) * s / double(n > 0 ? n : 1));
}

}  // namespace ot::moe::refimpl
