// Shared helpers of the GDN layer tests (causal conv1d, gated RMSNorm): one conv case (shapes,
// options, inputs), the ISA paths to run, the fp64 reference's outputs, and the finite-difference
// check of a backward.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "gdn_test_util.h"
#include "ot/cpu.h"
#include "ot/gdn_layer.h"
#include "src/ref/gdn_layer_ref.h"

namespace conv_test {

using namespace gdn_test;
namespace gdn = ot::gdn;

// Every kernel level this CPU has: scalar (the portable build), avx2 and avx512.
inline std::vector<ot::cpu::Isa> isa_paths() {
  std::vector<ot::cpu::Isa> v{ot::cpu::Isa::scalar};
  for (ot::cpu::Isa i : {ot::cpu::Isa::avx2, ot::cpu::Isa::avx512})
    if (ot::cpu::detected_isa() >= i) v.push_back(i);
  return v;
}

struct Case {
  int64_t B = 2, T = 37, D = 70, W = 4;
  std::vector<int64_t> cu;  // varlen offsets (B must be 1), empty: fixed length
  bool bias = true, init = true, silu = true;
  DType dt = DType::f32, state_dt = DType::f32;
  int64_t N() const { return cu.empty() ? B : int64_t(cu.size()) - 1; }
};

// The tensors of a case and the options that view them (the Tensors live here).
struct ConvIn {
  Tensor x, w, b, s0, cu;
  gdn::CausalConv1dOptions opt;
};
inline ConvIn make_conv(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  ConvIn in;
  in.x = rand_tensor(rng, c.dt, {c.B, c.T, c.D}, -2.f, 2.f);
  in.w = rand_tensor(rng, c.dt, {c.D, c.W}, -0.8f, 0.8f);
  if (c.bias) in.b = rand_tensor(rng, c.dt, {c.D}, -0.5f, 0.5f), in.opt.bias = in.b;
  if (c.init) in.s0 = rand_tensor(rng, c.state_dt, {c.N(), c.D, c.W - 1}, -2.f, 2.f), in.opt.initial_states = in.s0;
  if (!c.cu.empty()) in.cu = cu_tensor(c.cu), in.opt.cu_seqlens = in.cu;
  in.opt.activation = c.silu ? gdn::Activation::silu : gdn::Activation::none;
  in.opt.return_final_states = true;
  return in;
}
inline std::vector<int64_t> starts(const Case& c) { return c.cu; }

// The reference's forward outputs in fp32.
struct RefFwd {
  Tensor y, fin;
};
inline RefFwd ref_fwd(const Case& c, const ConvIn& in) {
  RefFwd r{Tensor::zeros(DType::f32, {c.B, c.T, c.D}), Tensor::zeros(DType::f32, {c.N(), c.D, c.W - 1})};
  gdn::ref::causal_conv1d_fwd(in.x, in.w, in.b, in.s0, c.silu, starts(c), r.y, r.fin);
  return r;
}
// Relative tolerance of an output stored in dt (computed in fp32).
inline double tol(DType dt) { return dt == DType::f32 ? 2e-6 : dt == DType::f16 ? 1.5e-3 : 8e-3; }

// An fp32 tensor of `shape` holding v.
inline Tensor f32_tensor(const std::vector<double>& v, const std::vector<int64_t>& shape) {
  Tensor t = Tensor::empty(DType::f32, shape);
  for (size_t i = 0; i < v.size(); ++i) t.ptr<float>()[i] = float(v[i]);
  return t;
}

// Central differences of f.loss() (an fp64 loss of the inputs) in every element of v, against the
// analytic gradient g: the largest difference, relative to the largest |fd| (at least 1e-3), < tol.
template <class Fd>
void expect_fd(Fd& f, std::vector<double>& v, const TensorView& g, double tol, const char* what) {
  double worst = 0, scale = 1e-3;
  for (size_t i = 0; i < v.size(); ++i) {
    const double keep = v[i], h = 1e-5;
    v[i] = keep + h;
    const double lp = f.loss();
    v[i] = keep - h;
    const double lm = f.loss();
    v[i] = keep;
    const double fd = (lp - lm) / (2 * h);
    worst = std::max(worst, std::fabs(fd - ot::get_as_double(g, int64_t(i))));
    scale = std::max(scale, std::fabs(fd));
  }
  EXPECT_LT(worst / scale, tol) << what;
}

}  // namespace conv_test
