// Test access to the AVX2 vector math of the epilogue (src/gemm/vec_math_avx2.h), whose functions
// have internal linkage: vec_math_probe__avx2.cpp evaluates them over arrays. Call only on AVX2 CPUs.
#pragma once
#include <cstdint>

namespace ot::gemm::testing {

enum class VecFn { exp, silu, erf, gelu };
// y[i] = f(x[i]) for i < n, computed 8 lanes at a time (n need not be a multiple of 8).
void vec_math_avx2(VecFn f, const float* x, float* y, int64_t n);

}  // namespace ot::gemm::testing
