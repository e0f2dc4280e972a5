// Shared helpers of the MoE tests: random tensors, normalised error, exact index comparison and
// the bad-input assertion (an ot::Error naming the expected argument).
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "moe/normal_tensor.h"
#include "ot/error.h"
#include "ot/moe.h"
#include "ot/tensor.h"

namespace mt {
using namespace ot;

inline Tensor randn(DType t, const std::vector<int64_t>& shape, uint32_t seed, float scale = 1.f) {
  return test::normal_tensor<std::mt19937>(t, shape, seed, scale);
}
inline Tensor ints(const std::vector<int64_t>& shape, const std::vector<int32_t>& v) {
  Tensor r = Tensor::empty(DType::i32, shape);
  for (size_t i = 0; i < v.size(); ++i) r.ptr<int32_t>()[i] = v[i];
  return r;
}
inline Tensor floats(DType t, const std::vector<int64_t>& shape, const std::vector<double>& v) {
  Tensor r = Tensor::empty(t, shape);
  for (size_t i = 0; i < v.size(); ++i) set_from_double(r, int64_t(i), v[i]);
  return r;
}
// Random top-k expert ids [T, K] (distinct per row) in [0, E).
inline Tensor rand_ids(int64_t T, int64_t K, int64_t E, uint32_t seed) {
  Tensor r = Tensor::empty(DType::i32, {T, K});
  std::mt19937 g(seed);
  std::vector<int32_t> all(size_t(E), 0);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e) all[size_t(e)] = int32_t(e);
    std::shuffle(all.begin(), all.end(), g);
    for (int64_t k = 0; k < K; ++k) r.ptr<int32_t>()[t * K + k] = all[size_t(k)];
  }
  return r;
}
// max |a - b| / max(max |b|, 1e-6): normalised error between two tensors of equal size.
inline double nerr(const TensorView& a, const TensorView& b) {
  EXPECT_EQ(a.numel(), b.numel());
  double m = 0, s = 1e-6;
  for (int64_t i = 0; i < std::min(a.numel(), b.numel()); ++i) {
    double x = get_as_double(a, i), y = get_as_double(b, i);
    // A NaN on one side only is an infinite error (std::max would drop a NaN difference).
    m = std::isnan(x) != std::isnan(y) ? HUGE_VAL : std::isnan(x) ? m : std::max(m, std::fabs(x - y));
    s = std::max(s, std::fabs(y));
  }
  return m / s;
}
inline double tol(DType t) { return t == DType::f32 ? 1e-5 : (t == DType::f16 ? 4e-3 : 2e-2); }
inline void expect_same(const TensorView& a, const TensorView& b, const char* what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(get_as_double(a, i), get_as_double(b, i)) << what << " at " << i;
}
inline std::vector<double> values(const TensorView& a) {
  std::vector<double> v(size_t(a.numel()));
  for (int64_t i = 0; i < a.numel(); ++i) v[size_t(i)] = get_as_double(a, i);
  return v;
}
inline const std::vector<DType>& float_types() {
  static const std::vector<DType> v{DType::f32, DType::bf16, DType::f16};
  return v;
}
}  // namespace mt

// The statement must throw ot::Error naming `arg_name`.
#define EXPECT_OT_ERROR(stmt, arg_name)                                                     \
  do {                                                                                      \
    bool thrown_ = false;                                                                   \
    try { stmt; } catch (const ot::Error& e_) {                                             \
      thrown_ = true;                                                                       \
      EXPECT_EQ(std::string(e_.arg()), std::string(arg_name)) << e_.what();                 \
    }                                                                                       \
    EXPECT_TRUE(thrown_) << "no ot::Error for " #stmt;                                      \
  } while (0)

// As EXPECT_OT_ERROR, and the error's expected form must contain `condition`, so a test of one
// bad input cannot pass on a different check of the same argument.
#define EXPECT_OT_ERROR_MSG(stmt, arg_name, condition)                                      \
  do {                                                                                      \
    bool thrown_ = false;                                                                   \
    try { stmt; } catch (const ot::Error& e_) {                                             \
      thrown_ = true;                                                                       \
      EXPECT_EQ(std::string(e_.arg()), std::string(arg_name)) << e_.what();                 \
      EXPECT_NE(e_.expected().find(condition), std::string::npos)                           \
          << "expected form \"" << e_.expected() << "\" lacks \"" << condition << "\"";     \
    }                                                                                       \
    EXPECT_TRUE(thrown_) << "no ot::Error for " #stmt;                                      \
  } while (0)
