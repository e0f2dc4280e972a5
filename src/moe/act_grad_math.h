// Scalar derivatives of the GEMM epilogue activations (formulas of src/gemm/epilogue_math.h) for
// the fast backward rows (act_backward.cpp); the reference has its own fp64 forms (src/ref/act_math.h).
#pragma once
#include <cmath>

#include "ot/gemm.h"

namespace ot::moe::act_math {

template <class T> inline T sigmoid(T x) { return T(1) / (T(1) + std::exp(-x)); }
// d silu(x) / dx = s (1 + x (1 - s)), s = sigmoid(x)
template <class T> inline T silu_grad(T x) {
  T s = sigmoid(x);
  return s * (T(1) + x * (T(1) - s));
}
// exact GELU: d/dx [x Phi(x)] = Phi(x) + x phi(x)
template <class T> inline T gelu_grad(T x) {
  T cdf = T(0.5) * (T(1) + std::erf(x * T(0.70710678118654752440)));
  T pdf = T(0.39894228040143267794) * std::exp(T(-0.5) * x * x);
  return cdf + x * pdf;
}
// dz = act'(z) * dy for the element-wise activations (not swiglu).
template <class T> inline T act_grad(gemm::Act act, T z, T dy) {
  switch (act) {
    case gemm::Act::relu: return z > T(0) ? dy : T(0);
    case gemm::Act::gelu: return gelu_grad(z) * dy;
    case gemm::Act::silu: return silu_grad(z) * dy;
    default: return dy;
  }
}

}  // namespace ot::moe::act_math
