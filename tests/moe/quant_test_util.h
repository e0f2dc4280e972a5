// Helpers of the quantised grouped matmul tests (test_grouped_quant.cpp, test_grouped_w8a8.cpp).
#pragma once
#include <cmath>
#include <vector>

#include "helpers.h"
#include "ot/cpu.h"

namespace qt {

// Relative Frobenius error ||a - b|| / ||b||.
inline double rel_frob(const ot::TensorView& a, const ot::TensorView& b) {
  EXPECT_EQ(a.shape(), b.shape());
  double d = 0, n = 0;
  for (int64_t i = 0; i < b.numel(); ++i) {
    const double x = ot::get_as_double(a, i), y = ot::get_as_double(b, i);
    d += (x - y) * (x - y);
    n += y * y;
  }
  return n > 0 ? std::sqrt(d / n) : std::sqrt(d);
}

// Group sizes summing to M over 6 groups, groups 1 and 4 empty.
inline ot::Tensor counts_for(int64_t M) {
  const int64_t a = M / 3, b = M / 4, c = M / 5;
  return mt::ints({6}, {int32_t(a), 0, int32_t(b), int32_t(c), 0, int32_t(M - a - b - c)});
}

// Every ISA level this machine has, scalar first.
inline std::vector<ot::cpu::Isa> paths() {
  std::vector<ot::cpu::Isa> v{ot::cpu::Isa::scalar};
  if (ot::cpu::detected_isa() >= ot::cpu::Isa::avx2) v.push_back(ot::cpu::Isa::avx2);
  if (ot::cpu::detected_isa() >= ot::cpu::Isa::avx512) v.push_back(ot::cpu::Isa::avx512);
  return v;
}

}  // namespace qt
