// Helpers of the GEMM tests: random matrices in any float dtype, the ISA paths this machine has,
// and a normalised error (max |fast - ref| / max |ref|) with per-dtype tolerances.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "ot/cpu.h"
#include "ot/gemm.h"
#include "ot/numeric.h"
#include "ot/tensor.h"

namespace ot::gemm::testing {

// Every dispatch level up to what the CPU has.
inline std::vector<cpu::Isa> isa_paths() {
  std::vector<cpu::Isa> v;
  for (int i = 0; i <= int(cpu::detected_isa()); ++i) v.push_back(cpu::Isa(i));
  return v;
}

inline Tensor random_tensor(DType t, const std::vector<int64_t>& shape, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  Tensor x = Tensor::empty(t, shape);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  for (int64_t i = 0; i < x.numel(); ++i) set_from_double(x, i, d(rng));
  return x;
}

inline std::vector<float> to_f32(const TensorView& v) {
  std::vector<float> out(size_t(v.numel()));
  for (int64_t i = 0; i < v.numel(); ++i) out[size_t(i)] = float(get_as_double(v, i));
  return out;
}

inline double norm_err(const TensorView& fast, const TensorView& ref) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    double f = get_as_double(fast, i), r = get_as_double(ref, i);
    if (std::isnan(f) != std::isnan(r)) return INFINITY;
    num = std::max(num, std::fabs(f - r));
    den = std::max(den, std::fabs(r));
  }
  return num / std::max(den, 1e-20);
}

// Tolerance for an output dtype, loosened when the engine rounds fp32/fp16 A to bf16 (bf16 weights).
inline double tol_for(DType out, bool bf16_compute) {
  double t = out == DType::bf16 ? 1e-2 : out == DType::f16 ? 2e-3 : 2e-5;
  return std::max(t, bf16_compute ? 1e-2 : 0.0);
}

inline std::string isa_str(cpu::Isa i) { return cpu::isa_name(i); }

}  // namespace ot::gemm::testing
