// Operands and named cases shared by `ot bench gemm` and `ot bench gemm_onednn`.
#pragma once
#include <time.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "ot/gemm.h"
#include "ot/tensor.h"

namespace ot::cli::gemmbench {

struct Shape {
  std::string name;
  int64_t M, N, K;
  std::string dtype;  // bf16 | fp16 | fp32
  int threads = 0;    // 0: the --threads option
  bool decode = false;  // report weight GB/s instead of GFLOP/s
};

inline DType parse_dtype(const std::string& s) { return s == "bf16" ? DType::bf16 : s == "fp16" ? DType::f16 : DType::f32; }

// Uniform [-1, 1) in the dtype (non-zero data: zeros can run faster on some units).
inline Tensor random(DType t, const std::vector<int64_t>& shape, uint32_t seed) {
  Tensor x = Tensor::empty(t, shape);
  Tensor f = Tensor::empty(DType::f32, shape);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  for (int64_t i = 0; i < f.numel(); ++i) f.ptr<float>()[i] = d(rng);
  copy_into(f, x);
  return x;
}

// The expert shapes of the issue: M in {16, 64, 128, 256}, N in {1536, 4096}, K in {2048, 4096}.
inline std::vector<Shape> expert_shapes() {
  std::vector<Shape> v;
  for (int64_t M : {16, 64, 128, 256})
    for (int64_t N : {1536, 4096})
      for (int64_t K : {2048, 4096})
        v.push_back({"expert_m" + std::to_string(M) + "_n" + std::to_string(N) + "_k" + std::to_string(K) + "_bf16", M, N, K, "bf16"});
  return v;
}

// Process CPU time per call, averaged over a batch of at least ~100 ms of CPU time (the kernel's
// per-thread accounting is only exact at that scale). This machine is shared: wall time mostly
// measures the other tenants, while CPU time / threads estimates the idle-machine time (spinning
// OpenMP workers included, so it errs slow).
inline double cpu_ms_per_call(const std::function<void()>& fn, int min_calls) {
  auto cpu_now = [] {
    timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return double(t.tv_sec) * 1e3 + double(t.tv_nsec) * 1e-6;
  };
  fn();
  double t0 = cpu_now(), t = t0;
  int calls = 0;
  while (calls < std::max(1, min_calls) || t - t0 < 100.0) {
    fn();
    ++calls;
    t = cpu_now();
  }
  return (t - t0) / calls;
}

inline std::string shape_str(const Shape& s) { return std::to_string(s.M) + "x" + std::to_string(s.N) + "x" + std::to_string(s.K); }

}  // namespace ot::cli::gemmbench
