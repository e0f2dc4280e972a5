// Shared helpers of the GDN tests: deterministic inputs in any layout/dtype, error metrics and the
// bad-input check.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "ot/error.h"
#include "ot/gdn.h"
#include "ot/tensor.h"

namespace gdn_test {

using ot::DType;
using ot::Tensor;
using ot::TensorView;
using ot::gdn::Layout;

struct Shape {
  int64_t B = 1, T = 64, HK = 2, HV = 4, DK = 32, DV = 16;
  Layout layout = Layout::BTHD;
  bool packed = false;  // 3-D varlen form (B must be 1)
};

inline std::vector<int64_t> vec_shape(const Shape& s, int64_t H, int64_t D) {
  std::vector<int64_t> v = s.layout == Layout::BTHD ? std::vector<int64_t>{s.B, s.T, H, D} : std::vector<int64_t>{s.B, H, s.T, D};
  if (s.packed) v.erase(v.begin());
  return v;
}
inline std::vector<int64_t> scal_shape(const Shape& s, int64_t H) {
  std::vector<int64_t> v = s.layout == Layout::BTHD ? std::vector<int64_t>{s.B, s.T, H} : std::vector<int64_t>{s.B, H, s.T};
  if (s.packed) v.erase(v.begin());
  return v;
}

// Uniform values in [lo, hi) stored as dtype.
inline Tensor rand_tensor(std::mt19937& rng, DType dt, const std::vector<int64_t>& shape, float lo, float hi) {
  Tensor t = Tensor::empty(dt, shape);
  std::uniform_real_distribution<float> u(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) ot::set_from_double(t, i, u(rng));
  return t;
}

struct Inputs {
  Tensor q, k, v, g, beta;
};
// Keys of norm ~1 (well-conditioned I + M without l2norm), gates in [gmin, 0), beta in (0, 1).
inline Inputs make_inputs(const Shape& s, DType dt, uint32_t seed, float gmin = -1.f) {
  std::mt19937 rng(seed);
  float kr = std::sqrt(3.f / float(s.DK));
  Inputs in;
  in.q = rand_tensor(rng, dt, vec_shape(s, s.HK, s.DK), -1.f, 1.f);
  in.k = rand_tensor(rng, dt, vec_shape(s, s.HK, s.DK), -kr, kr);
  in.v = rand_tensor(rng, dt, vec_shape(s, s.HV, s.DV), -1.f, 1.f);
  in.g = rand_tensor(rng, DType::f32, scal_shape(s, s.HV), gmin, 0.f);
  in.beta = rand_tensor(rng, DType::f32, scal_shape(s, s.HV), 0.05f, 1.f);
  return in;
}

// ||a - b|| / max(||b||, tiny) over all elements (any float dtypes, same numel).
inline double rel_err(const TensorView& a, const TensorView& b) {
  double num = 0, den = 0;
  int64_t n = a.numel();
  for (int64_t i = 0; i < n; ++i) {
    double x = ot::get_as_double(a, i), y = ot::get_as_double(b, i);
    num += (x - y) * (x - y);
    den += y * y;
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}
inline double max_abs(const TensorView& a) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::fabs(ot::get_as_double(a, i)));
  return m;
}

inline Tensor cu_tensor(const std::vector<int64_t>& cu) {
  Tensor t = Tensor::empty(DType::i64, {int64_t(cu.size())});
  for (size_t i = 0; i < cu.size(); ++i) t.ptr<int64_t>()[i] = cu[i];
  return t;
}
// One chunk-forward case: inputs, options (final state on), optional cu_seqlens and a random
// initial state. The Tensors the options view live here.
struct ChunkCase {
  Inputs in;
  Tensor cu, S0;
  ot::gdn::ChunkOptions opt;
};
inline ChunkCase make_chunk_case(const Shape& s, DType dt, bool l2, float gmin, const std::vector<int64_t>& cu,
                                 bool init, uint32_t seed) {
  ChunkCase c;
  c.in = make_inputs(s, dt, seed, gmin);
  c.opt.layout = s.layout;
  c.opt.use_qk_l2norm_in_kernel = l2;
  c.opt.output_final_state = true;
  const int64_t N = cu.empty() ? s.B : int64_t(cu.size()) - 1;
  if (!cu.empty()) {
    c.cu = cu_tensor(cu);
    c.opt.cu_seqlens = c.cu;
  }
  if (init) {
    std::mt19937 rng(seed + 7);
    c.S0 = rand_tensor(rng, DType::f32, {N, s.HV, s.DK, s.DV}, -0.5f, 0.5f);
    c.opt.initial_state = c.S0;
  }
  return c;
}

// The recurrent form with its final state out, and the fp64 recurrence of the same inputs.
inline ot::gdn::RecurrentOptions recurrent_opts(bool l2, const TensorView& S0 = {}) {
  ot::gdn::RecurrentOptions ro;
  ro.use_qk_l2norm_in_kernel = l2;
  ro.initial_state = S0;
  ro.output_final_state = true;
  return ro;
}
inline ot::gdn::ChunkFwd recurrence_truth(const Inputs& in, bool l2, const TensorView& S0 = {}) {
  ot::gdn::ChunkOptions co;
  co.use_qk_l2norm_in_kernel = l2;
  co.initial_state = S0;
  co.output_final_state = true;
  return ot::gdn::ref::recurrence(in.q, in.k, in.v, in.g, in.beta, co);
}

inline Tensor i32_tensor(const std::vector<int32_t>& x) {
  Tensor t = Tensor::empty(DType::i32, {int64_t(x.size())});
  for (size_t i = 0; i < x.size(); ++i) t.ptr<int32_t>()[i] = x[i];
  return t;
}

// fn throws an ot::Error naming argument `arg` (and operator `op`, unless empty).
inline void expect_error(const std::function<void()>& fn, const std::string& arg, const std::string& op = "") {
  try {
    fn();
    ADD_FAILURE() << "no error: " << op << " " << arg;
  } catch (const ot::Error& e) {
    EXPECT_EQ(e.arg(), arg) << e.what();
    if (!op.empty()) {
      EXPECT_EQ(e.op(), op) << e.what();
    }
  }
}

}  // namespace gdn_test
