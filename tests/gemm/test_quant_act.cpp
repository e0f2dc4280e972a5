// The int16 activation blocks of the quantised GEMM (QActI16Fn, src/gemm/quant_internal.h): every
// ISA's form gives the scalar form's bits (codes, scales, sum) over lengths with partial blocks,
// zero blocks, ties at .5, values at the clamp, and blocks with NaN / Inf; and the scalar form
// keeps its contract (|code| <= 32767, the block's largest |a| maps to +-32767, NaN blocks: NaN
// scale and zero codes).
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "ot/cpu.h"
#include "src/gemm/quant_internal.h"

namespace test_quant_act {
using namespace ot;
using namespace ot::gemm::qdetail;

namespace {

struct Blocks {
  std::vector<int16_t> q;
  std::vector<float> scale;
  float sum = 0;
};

Blocks run(QActI16Fn f, const std::vector<float>& a) {
  const int64_t len = int64_t(a.size()), nb = act_blocks(len);
  Blocks b;
  b.q.assign(size_t(nb * kQABlock), int16_t(0x5a5a));  // padding must be written as zeros
  b.scale.assign(size_t(nb), -1.f);
  b.sum = f(a.data(), len, b.q.data(), b.scale.data());
  return b;
}

bool same_bits(float x, float y) { return std::memcmp(&x, &y, sizeof x) == 0; }

std::vector<float> sample(int64_t len, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> a(static_cast<size_t>(len));
  for (float& x : a) x = d(rng) * (seed % 3 == 0 ? 1e-3f : seed % 3 == 1 ? 1.f : 3e4f);
  if (len > 40) {
    for (int64_t k = 32; k < 40; ++k) a[size_t(k)] = 0.f;   // part of block 1 zero
    a[5] = 0.5f * a[5] / std::fabs(a[5]);                     // signs of ties after scaling
  }
  if (len >= 64 && seed % 2) std::fill(a.begin() + 32, a.begin() + 64, 0.f);  // a whole zero block
  return a;
}

}  // namespace

TEST(QuantAct, EveryIsaGivesTheScalarBits) {
  std::vector<std::pair<const char*, QActI16Fn>> forms;
  if (cpu::detected_isa() >= cpu::Isa::avx2) forms.push_back({"avx2", qact_i16_avx2});
  if (cpu::detected_isa() >= cpu::Isa::avx512) forms.push_back({"avx512", qact_i16_avx512});
  if (forms.empty()) GTEST_SKIP() << "no SIMD form on this CPU";
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  uint32_t seed = 0;
  for (int64_t len : {1, 7, 31, 32, 33, 64, 100, 200, 768, 2048})
    for (int variant = 0; variant < 4; ++variant) {
      std::vector<float> a = sample(len, ++seed);
      if (variant == 1) a[size_t(len - 1)] = nan;
      if (variant == 2) a[size_t(len / 2)] = -inf;
      if (variant == 3 && len > 1) a[0] = -a[1] * 2.f;  // a negative largest |a|
      const Blocks ref = run(qact_i16_scalar, a);
      for (auto& [name, f] : forms) {
        const Blocks got = run(f, a);
        EXPECT_EQ(got.q, ref.q) << name << " len " << len << " variant " << variant;
        for (size_t b = 0; b < ref.scale.size(); ++b)
          EXPECT_TRUE(same_bits(got.scale[b], ref.scale[b])) << name << " len " << len << " block " << b << ": " << got.scale[b] << " vs " << ref.scale[b];
        EXPECT_TRUE(same_bits(got.sum, ref.sum)) << name << " len " << len << " variant " << variant << ": " << got.sum << " vs " << ref.sum;
      }
    }
}

TEST(QuantAct, ScalarFormKeepsItsContract) {
  std::vector<float> a = sample(100, 4);
  a[70] = std::numeric_limits<float>::quiet_NaN();  // block 2 (64..95)
  const Blocks b = run(qact_i16_scalar, a);
  ASSERT_EQ(b.scale.size(), 4u);
  EXPECT_TRUE(std::isnan(b.scale[2]));
  EXPECT_TRUE(std::isnan(b.sum));
  for (int k = 64; k < 96; ++k) EXPECT_EQ(b.q[size_t(k)], 0) << k;
  for (int blk : {0, 1, 3}) {
    int peak = 0;
    for (int k = 32 * blk; k < 32 * blk + 32; ++k) {
      EXPECT_LE(std::abs(int(b.q[size_t(k)])), 32767);
      peak = std::max(peak, std::abs(int(b.q[size_t(k)])));
      if (k >= 100) {
        EXPECT_EQ(b.q[size_t(k)], 0) << "padding " << k;
      }
    }
    EXPECT_EQ(peak, 32767) << "block " << blk;
  }
}

}  // namespace test_quant_act
