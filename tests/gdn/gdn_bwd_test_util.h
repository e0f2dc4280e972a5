// What the GDN backward tests share: the gradient metric and the comparison of two ChunkBwd.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "ot/gdn_bwd.h"
#include "ot/tensor.h"

namespace gdn_test {

// RMS(a - b) / RMS(b): fla's err_ratio.
inline double rel_rms(const ot::TensorView& a, const ot::TensorView& b) {
  EXPECT_EQ(a.shape(), b.shape());
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    double x = ot::get_as_double(a, i), y = ot::get_as_double(b, i);
    num += (x - y) * (x - y), den += y * y;
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// Every gradient of `got` within `tol` (rel_rms) of `want`; dh0 present in both or in neither.
inline void expect_grads_close(const ot::gdn::ChunkBwd& got, const ot::gdn::ChunkBwd& want, double tol, const std::string& what) {
  EXPECT_LT(rel_rms(got.dq, want.dq), tol) << what << " dq";
  EXPECT_LT(rel_rms(got.dk, want.dk), tol) << what << " dk";
  EXPECT_LT(rel_rms(got.dv, want.dv), tol) << what << " dv";
  EXPECT_LT(rel_rms(got.dbeta, want.dbeta), tol) << what << " dbeta";
  EXPECT_LT(rel_rms(got.dg, want.dg), tol) << what << " dg";
  ASSERT_EQ(got.dh0.defined(), want.dh0.defined()) << what;
  if (want.dh0.defined()) {
    EXPECT_LT(rel_rms(got.dh0, want.dh0), tol) << what << " dh0";
  }
}

}  // namespace gdn_test
