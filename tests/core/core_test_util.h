// Shared helpers of the core-family tests: a uniform random tensor in any float dtype, and the
// check that a call throws an ot::Error naming an argument.
#pragma once
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "ot/error.h"
#include "ot/tensor.h"

namespace core_test {

inline ot::Tensor uniform(std::mt19937& rng, ot::DType dt, std::vector<int64_t> shape, float lo, float hi) {
  ot::Tensor f = ot::Tensor::empty(ot::DType::f32, shape);
  std::uniform_real_distribution<float> u(lo, hi);
  for (int64_t i = 0; i < f.numel(); ++i) f.ptr<float>()[i] = u(rng);
  if (dt == ot::DType::f32) return f;
  ot::Tensor t = ot::Tensor::empty(dt, shape);
  ot::copy_into(f.view(), t.view());
  return t;
}

template <class F> void expect_error(F&& fn, const char* arg) {
  try {
    fn();
    ADD_FAILURE() << "no error for " << arg;
  } catch (const ot::Error& e) {
    EXPECT_NE(std::string(e.what()).find(arg), std::string::npos) << e.what();
  }
}

}  // namespace core_test
