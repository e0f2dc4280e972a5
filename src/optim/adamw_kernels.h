// The element loop of adamw_step (multi_tensor.cpp drives it over chunks of each tensor), built
// once per ISA from adamw_kernels.inc: torch's single-tensor AdamW order of operations in fp32.
#pragma once
#include <cmath>
#include <cstdint>

#include "ot/optim.h"

namespace ot::optim::detail {

struct AdamWScalars {
  float b1, b2, one_minus_b1, one_minus_b2, decay, grad_scale, step_size, bc2_sqrt, eps;
};
inline AdamWScalars adamw_scalars(const AdamW& c) {
  const float bc1 = 1.f - float(std::pow(double(c.beta1), double(c.step))), bc2 = 1.f - float(std::pow(double(c.beta2), double(c.step)));
  return {c.beta1, c.beta2, 1.f - c.beta1, 1.f - c.beta2, 1.f - c.lr * c.weight_decay, c.grad_scale, c.lr / bc1, std::sqrt(bc2), c.eps};
}

using AdamWRows = void (*)(const AdamWScalars&, float*, const float*, float*, float*, int64_t);
void adamw_rows_generic(const AdamWScalars& k, float* p, const float* g, float* m, float* v, int64_t n);
void adamw_rows_avx2(const AdamWScalars& k, float* p, const float* g, float* m, float* v, int64_t n);
void adamw_rows_avx512(const AdamWScalars& k, float* p, const float* g, float* m, float* v, int64_t n);

}  // namespace ot::optim::detail
