// Scalar activation formulas shared by the reference and the fast epilogues.
#pragma once
#include <cmath>

#include "ot/gemm.h"

namespace ot::gemm {

template <class T> inline T silu(T x) { return x / (T(1) + std::exp(-x)); }
template <class T> inline T gelu(T x) { return T(0.5) * x * (T(1) + std::erf(x * T(0.70710678118654752440))); }  // exact (erf) GELU
template <class T> inline T activate(Act act, T x) {
  switch (act) {
    case Act::relu: return x > T(0) ? x : T(0);
    case Act::gelu: return gelu(x);
    case Act::silu: return silu(x);
    default: return x;
  }
}

}  // namespace ot::gemm
