// Helpers of the MoE backward tests: seeded random tensors, fp64 copies, normalised errors and a
// central finite-difference gradient of a scalar fp64 function.
#pragma once
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "moe/normal_tensor.h"
#include "ot/error.h"
#include "ot/tensor.h"

namespace ot::moe::bwdtest {

inline Tensor randn(DType t, const std::vector<int64_t>& shape, uint64_t seed, double scale = 1.0) {
  return test::normal_tensor<std::mt19937_64>(t, shape, seed, scale);
}
inline std::vector<double> to_vec(const TensorView& v) {
  std::vector<double> r(size_t(v.numel()));
  for (int64_t i = 0; i < v.numel(); ++i) r[size_t(i)] = get_as_double(v, i);
  return r;
}
inline Tensor from_vec(DType t, const std::vector<int64_t>& shape, const std::vector<double>& v) {
  Tensor r = Tensor::empty(t, shape);
  for (int64_t i = 0; i < r.numel(); ++i) set_from_double(r, i, v[size_t(i)]);
  return r;
}
inline Tensor ints(DType t, const std::vector<int64_t>& shape, const std::vector<int64_t>& v) {
  Tensor r = Tensor::empty(t, shape);
  for (int64_t i = 0; i < r.numel(); ++i) {
    if (t == DType::i64) r.ptr<int64_t>()[i] = v[size_t(i)];
    else r.ptr<int32_t>()[i] = int32_t(v[size_t(i)]);
  }
  return r;
}
// ||a - b|| / max(||b||, tiny): the normalised error every comparison uses.
inline double rel_err(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) { num += (a[i] - b[i]) * (a[i] - b[i]); den += b[i] * b[i]; }
  if (a.size() != b.size()) return 1e30;
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}
inline double rel_err(const TensorView& a, const TensorView& b) { return rel_err(to_vec(a), to_vec(b)); }
// Tolerance of a fast-vs-reference comparison for outputs stored in `t`.
inline double tol(DType t) { return t == DType::f32 ? 2e-5 : (t == DType::bf16 ? 2e-2 : 4e-3); }

// The argument an ot::Error names when f throws ("no error" when it does not).
inline std::string err_arg(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.arg();
  }
  return "no error";
}

// Central differences of f at p (each coordinate perturbed by h * max(1, |p_i|)).
inline std::vector<double> fd_grad(std::vector<double>& p, const std::function<double()>& f, double h = 1e-6) {
  std::vector<double> g(p.size());
  for (size_t i = 0; i < p.size(); ++i) {
    double keep = p[i], step = h * std::max(1.0, std::fabs(keep));
    p[i] = keep + step;
    double fp = f();
    p[i] = keep - step;
    double fm = f();
    p[i] = keep;
    g[i] = (fp - fm) / (2 * step);
  }
  return g;
}

}  // namespace ot::moe::bwdtest
