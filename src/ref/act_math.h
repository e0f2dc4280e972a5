// The activations of the GEMM epilogues and their derivatives, written out once for the references
// (fp64), apart from the fast epilogues' own formulas so a slip in either shows up in the tests.
#pragma once
#include <cmath>

#include "ot/gemm.h"

namespace ot::refmath {

inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
inline double silu(double x) { return x * sigmoid(x); }
// The exact (erf) GELU: x * Phi(x).
inline double gelu(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }

inline double activate(gemm::Act act, double x) {
  switch (act) {
    case gemm::Act::relu: return x > 0 ? x : 0.0;
    case gemm::Act::gelu: return gelu(x);
    case gemm::Act::silu: return silu(x);
    default: return x;
  }
}

// d silu / dx = s + x s (1 - s), s = sigmoid(x).
inline double silu_grad(double x) {
  double s = sigmoid(x);
  return s + x * s * (1.0 - s);
}
// d (x Phi(x)) / dx = Phi(x) + x phi(x).
inline double gelu_grad(double x) {
  const double pi = 3.14159265358979323846;
  double cdf = 0.5 * (1.0 + std::erf(x / std::sqrt(2.0)));
  double pdf = std::exp(-0.5 * x * x) / std::sqrt(2.0 * pi);
  return cdf + x * pdf;
}
// dz = act'(z) * dy for the element-wise activations (swiglu has two inputs: swiglu_grad).
inline double act_grad(gemm::Act act, double z, double dy) {
  switch (act) {
    case gemm::Act::relu: return z > 0 ? dy : 0.0;
    case gemm::Act::gelu: return gelu_grad(z) * dy;
    case gemm::Act::silu: return silu_grad(z) * dy;
    default: return dy;
  }
}
// y = silu(g) * u: dg = dy * u * silu'(g), du = dy * silu(g).
inline void swiglu_grad(double g, double u, double dy, double* dg, double* du) {
  *dg = dy * u * silu_grad(g);
  *du = dy * silu(g);
}

}  // namespace ot::refmath
