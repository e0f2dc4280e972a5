// quantize_row_i8_dynamic (ot/quant.h): the AVX-512 form gives the portable form's codes and scale
// bit for bit (lengths 1-67 around the vector width, ties, values at the clamp, zero rows, NaN / Inf),
// and the portable form matches the definition worked by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "ot/cpu.h"
#include "ot/quant.h"

namespace test_quant_row {
using namespace ot;

TEST(QuantizeRowI8, HandWorkedRow) {
  // max |x| = 127: d = 1, so the codes are x rounded half to even.
  const std::vector<float> x = {127.f, -127.f, 0.5f, 1.5f, 2.5f, -0.5f, -2.5f, 3.49f};
  std::vector<int8_t> q(x.size());
  cpu::ScopedMaxIsa cap(cpu::Isa::scalar);
  EXPECT_EQ(quantize_row_i8_dynamic(x.data(), int64_t(x.size()), q.data()), 1.f);
  EXPECT_EQ(q, (std::vector<int8_t>{127, -127, 0, 2, 2, 0, -2, 3}));
}

TEST(QuantizeRowI8, VectorFormEqualsPortableForm) {
  if (!cpu::has(cpu::Isa::avx512)) GTEST_SKIP() << "no AVX-512";
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  for (int n = 1; n <= 67; ++n)
    for (int kind = 0; kind < 5; ++kind) {
      std::vector<float> x(static_cast<size_t>(n));
      for (float& v : x) v = nd(rng);
      if (kind == 1) for (int i = 0; i < n; ++i) x[size_t(i)] = float(i % 7 - 3) * 0.5f;  // halves: ties against d
      if (kind == 2) for (float& v : x) v = 0.f;
      if (kind == 3) x[size_t(n / 2)] = std::numeric_limits<float>::quiet_NaN();
      if (kind == 4) x[size_t(n - 1)] = -std::numeric_limits<float>::infinity();
      std::vector<int8_t> a(static_cast<size_t>(n), 9), b(static_cast<size_t>(n), 7);
      float da, db;
      {
        cpu::ScopedMaxIsa cap(cpu::Isa::scalar);
        da = quantize_row_i8_dynamic(x.data(), n, a.data());
      }
      db = quantize_row_i8_dynamic(x.data(), n, b.data());
      EXPECT_EQ(a, b) << "n=" << n << " kind=" << kind;
      if (kind >= 3) EXPECT_TRUE(std::isnan(da) && std::isnan(db));
      else EXPECT_EQ(da, db) << "n=" << n << " kind=" << kind;
    }
}

}  // namespace test_quant_row
