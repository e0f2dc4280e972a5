// matmul's unpacked small fp32 path (src/gemm/small.h) against the fp64 reference: every
// transposition of A and B, row and column tails around the 8 x 32 tile, K = 0, alpha / beta,
// a C wider than N (columns past N untouched), and inside a parallel region (where it also takes
// the larger shapes).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "ot/cpu.h"
#include "ot/gemm.h"
#include "ot/numeric.h"
#include "ot/parallel.h"
#include "src/gemm/small.h"

namespace ot::gemm {
namespace test_small_matmul {

struct Case {
  int64_t M, N, K;
  bool ta, tb;
  float alpha, beta;
};

// Runs one case through matmul (or matmul_bf16_operands when `bf16`; on the calling thread when
// `in_region`) and checks every element of C, the guard columns included. Returns whether the
// small fp32 path took it.
bool check(const Case& c, bool in_region, bool bf16 = false) {
  std::mt19937 rng(uint32_t(c.M * 131 + c.N * 17 + c.K));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  const int64_t lda = (c.ta ? c.M : c.K) + 3, ldb = (c.tb ? c.K : c.N) + 5, ldc = c.N + 7;
  std::vector<float> A(size_t((c.ta ? c.K : c.M) * lda + 1)), B(size_t((c.tb ? c.N : c.K) * ldb + 1));
  for (float& x : A) x = u(rng);
  for (float& x : B) x = u(rng);
  std::vector<float> C(size_t(c.M * ldc + 1)), R;
  for (float& x : C) x = c.beta == 0.f ? std::numeric_limits<float>::quiet_NaN() : u(rng);  // beta = 0 must ignore C
  R = C;
  MatView a = c.ta ? MatView{A.data(), DType::f32, c.K, c.M, lda, 1}.t() : MatView{A.data(), DType::f32, c.M, c.K, lda, 1};
  MatView b = c.tb ? MatView{B.data(), DType::f32, c.N, c.K, ldb, 1}.t() : MatView{B.data(), DType::f32, c.K, c.N, ldb, 1};
  MutMatView cv{C.data(), DType::f32, c.M, c.N, ldc, 1}, rv{R.data(), DType::f32, c.M, c.N, ldc, 1};
  bool took = false;
  auto run = [&] {
    took = detail::small_f32_takes(a, b, cv);
    if (bf16) matmul_bf16_operands(a, b, cv, c.alpha, c.beta);
    else matmul(a, b, cv, c.alpha, c.beta);
  };
  if (in_region) parallel_for(2, [&](int64_t i0, int64_t) { if (i0 == 0) run(); });
  else run();
  if (bf16) {  // the reference sees the rounded operands
    for (float& x : A) x = bf16_to_f32(f32_to_bf16(x));
    for (float& x : B) x = bf16_to_f32(f32_to_bf16(x));
  }
  ref::matmul(a, b, rv, c.alpha, c.beta);
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t j = 0; j < ldc; ++j) {
      const float got = C[size_t(i * ldc + j)], want = R[size_t(i * ldc + j)];
      if (j >= c.N) {  // past the edge: the guard value, bit for bit (NaN stays NaN)
        EXPECT_TRUE(std::isnan(want) ? std::isnan(got) : got == want) << "guard column " << j << " row " << i;
        continue;
      }
      EXPECT_NEAR(got, want, 1e-5f * float(c.K + 2)) << "M" << c.M << " N" << c.N << " K" << c.K << " ta" << c.ta << " tb" << c.tb << " (" << i
                                                      << ", " << j << ")";
    }
  return took;
}

TEST(SmallF32, EveryTranspositionAndTailAgainstTheReference) {
  int taken = 0, total = 0;
  for (int64_t M : {1, 7, 8, 9, 17, 64})
    for (int64_t N : {1, 15, 16, 17, 31, 32, 33, 64, 130})
      for (int64_t K : {0, 1, 5, 16, 17, 64, 128})
        for (int form = 0; form < 4; ++form) {
          Case c{M, N, K, bool(form & 1), bool(form & 2), form == 3 ? -1.5f : 1.f, (form & 1) ? 0.5f : 0.f};
          taken += check(c, false);
          ++total;
        }
  // Every one of these is small enough to take the path wherever it exists (AVX2 and up).
  if (cpu::has(cpu::Isa::avx2)) EXPECT_EQ(taken, total);
  else EXPECT_EQ(taken, 0);
}

TEST(SmallBf16, EveryTranspositionAndTailAgainstTheRoundedReference) {
  for (int64_t M : {1, 7, 8, 9, 64})
    for (int64_t N : {1, 15, 16, 17, 33, 128})
      for (int64_t K : {0, 1, 2, 5, 31, 32, 33, 64, 128})
        for (int form = 0; form < 4; ++form)
          check(Case{M, N, K, bool(form & 1), bool(form & 2), form == 3 ? -1.5f : 1.f, (form & 1) ? 0.5f : 0.f}, true, true);
}

TEST(SmallBf16, RoundsTheOperands) {
  // 1 + 2^-10 is not a bf16: the product of the rounded operands is exactly 1.
  float a = 1.f + 1.f / 1024, b = 1.f, c = 0.f;
  matmul_bf16_operands(MatView{&a, DType::f32, 1, 1, 1, 1}, MatView{&b, DType::f32, 1, 1, 1, 1}, MutMatView{&c, DType::f32, 1, 1, 1, 1});
  EXPECT_EQ(c, 1.f);
}

TEST(SmallF32, LargerShapesInsideAParallelRegion) {
  for (Case c : {Case{300, 257, 129, false, true, 1.f, 0.f}, Case{64, 512, 512, true, false, 0.25f, 1.f}}) {
    const bool took = check(c, true);
    EXPECT_EQ(took, cpu::has(cpu::Isa::avx2));
  }
  // Outside a region a product this size uses every thread on the packed path.
  if (num_threads() > 1) {
    EXPECT_FALSE(check(Case{300, 257, 129, false, true, 1.f, 0.f}, false));
  }
}

TEST(SmallF32, EveryIsaLevel) {
  // The AVX-512 and AVX2 tiles (and, below AVX2, the packed path) on the same cases.
  for (cpu::Isa isa : {cpu::Isa::avx2, cpu::Isa::scalar}) {
    if (!cpu::has(isa)) continue;
    cpu::ScopedMaxIsa cap(isa);
    for (int form = 0; form < 4; ++form)
      for (int64_t M : {1, 6, 7, 13})
        for (int64_t N : {1, 8, 9, 17, 40}) {
          const bool took = check(Case{M, N, 37, bool(form & 1), bool(form & 2), 1.f, (form & 1) ? 0.5f : 0.f}, false);
          EXPECT_EQ(took, isa == cpu::Isa::avx2);
        }
  }
}

TEST(SmallF32, NotTakenForOtherDtypesOrStrides) {
  std::vector<float> x(64 * 64);
  std::vector<uint16_t> h(64 * 64);
  MatView a{x.data(), DType::f32, 64, 64, 64, 1}, hb{h.data(), DType::bf16, 64, 64, 64, 1};
  MatView strided{x.data(), DType::f32, 16, 16, 128, 2};  // neither stride 1
  MutMatView c{x.data(), DType::f32, 64, 64, 64, 1}, ccol{x.data(), DType::f32, 64, 64, 1, 64};
  EXPECT_FALSE(detail::small_f32_takes(a, hb, c));
  EXPECT_FALSE(detail::small_f32_takes(strided, strided, MutMatView{x.data(), DType::f32, 16, 16, 16, 1}));
  EXPECT_FALSE(detail::small_f32_takes(a, a, ccol));
}

}  // namespace test_small_matmul
}  // namespace ot::gemm
