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
#include "src/core/knobs.h"

namespace ot::gemm::testing {

// A dispatch level and, on AVX-512 BF16, which bf16 kernel runs (knob gemm.bf16_kernel: 1 vdpbf16ps,
// 2 widening to fp32 FMAs; 0 the measured default): this CPU picks one of the two by itself, and
// both must be right on every machine that can run them. amx_emulated (knob gemm.amx_emulate): row
// blocks of >= 16 rows run the AMX kernel on the software model of the tile unit.
struct IsaPath {
  cpu::Isa isa = cpu::Isa::scalar;
  int bf16_kernel = 0;
  bool amx_emulated = false;
  operator cpu::Isa() const { return isa; }  // NOLINT(google-explicit-constructor): loops compare levels
};

// Every dispatch level up to what the CPU has (AVX-512 BF16 twice: both bf16 kernels), then the top
// level again with the AMX kernel on its software model (AMX's driver path, checked where no AMX runs).
inline std::vector<IsaPath> isa_paths() {
  std::vector<IsaPath> v;
  for (int i = 0; i <= int(cpu::detected_isa()); ++i) {
    if (cpu::Isa(i) == cpu::Isa::avx512_bf16) {
      v.push_back({cpu::Isa(i), 1});
      v.push_back({cpu::Isa(i), 2});
    } else {
      v.push_back({cpu::Isa(i), 0});
    }
  }
  if (cpu::detected_isa() >= cpu::Isa::avx2) v.push_back({cpu::detected_isa(), 0, true});
  return v;
}

// The highest level up to AVX-512 BF16 this CPU has (that one once per bf16 kernel): for the
// backward forms' tiles, which run on AVX-512 BF16 but never on AMX.
inline std::vector<IsaPath> top_vector_isa_paths() {
  const cpu::Isa top = std::min(cpu::detected_isa(), cpu::Isa::avx512_bf16);
  std::vector<IsaPath> v;
  for (const IsaPath& p : isa_paths())
    if (p.isa == top && !p.amx_emulated) v.push_back(p);
  return v;
}

// Caps the ISA and sets the bf16 kernel and the AMX model of a path for a scope.
class ScopedIsaPath {
 public:
  explicit ScopedIsaPath(const IsaPath& p) : cap_(p.isa), prev_(knobs::get("gemm.bf16_kernel")), prev_amx_(knobs::get("gemm.amx_emulate")) {
    knobs::set("gemm.bf16_kernel", p.bf16_kernel);
    knobs::set("gemm.amx_emulate", p.amx_emulated);
  }
  ~ScopedIsaPath() {
    knobs::set("gemm.bf16_kernel", prev_);
    knobs::set("gemm.amx_emulate", prev_amx_);
  }
  ScopedIsaPath(const ScopedIsaPath&) = delete;
  ScopedIsaPath& operator=(const ScopedIsaPath&) = delete;

 private:
  cpu::ScopedMaxIsa cap_;
  int64_t prev_, prev_amx_;
};

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
inline std::string isa_str(const IsaPath& p) {
  return isa_str(p.isa) + (p.bf16_kernel == 1 ? "/vdpbf16ps" : p.bf16_kernel == 2 ? "/widen" : "") + (p.amx_emulated ? "/amx-emulated" : "");
}

}  // namespace ot::gemm::testing
