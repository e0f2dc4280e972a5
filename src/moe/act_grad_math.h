// Scalar derivatives of the GEMM epilogue activations (formulas of src/gemm/epilogue_math.h),
// shared by the backward reference and fast paths; templated so the reference runs them in fp64.
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
// swiglu: y = silu(g) * u  ->  dg = dy * u * silu'(g), du = dy * silu(g)
template <class T> inline void swiglu_grad(T g, T u, T dy, T* dg, T* du) {
  T s = sigmoid(g);
  *du = dy * g * s;
  *dg = dy * u * s * (T(1) + g * (T(1) - s));
}

}  // namespace ot::moe::act_math
