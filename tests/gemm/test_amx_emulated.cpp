// The AMX micro-kernel on the software model of the tile unit (src/gemm/amx_emulator.h): against
// fp64 dot products on hand-packed tiles, after other code on the thread has released the tiles or
// loaded its own configuration, and through the GEMM driver (row padding to 32, K chunks of 512
// accumulated in C, partial panels, the epilogue). The other GEMM tests run this path too, as the
// last entry of isa_paths().
#include <cmath>

#include "gemm_test_util.h"
#include "src/gemm/amx_emulator.h"
#include "src/gemm/internal.h"

namespace test_amx_emulated {
using namespace ot;
using namespace ot::gemm;
using namespace ot::gemm::testing;

namespace {

// One 32 x 48 block: A row-major bf16 (lda > kc), B one vnni panel [kc/2][48][2], C (ldc > 48).
struct Block {
  int64_t kc, lda, ldc = 48 + 8;
  std::vector<uint16_t> a, b;
  std::vector<float> c0;
  explicit Block(int64_t kc_, uint32_t seed) : kc(kc_), lda(kc_ + 32), a(size_t(32 * lda)), b(size_t(kc_ * detail::kNR)), c0(size_t(32 * ldc)) {
    std::mt19937 g(seed);
    std::uniform_real_distribution<float> d(-1.f, 1.f);
    for (auto& v : a) v = f32_to_bf16(d(g));
    for (auto& v : b) v = f32_to_bf16(d(g));
    for (auto& v : c0) v = d(g);
  }
  double bf(uint16_t h) const { return double(bf16_to_f32(h)); }
  // C[i][j] (+ c0 when accumulating) in fp64, and the sum of |terms| for the tolerance.
  double expect(int i, int j, bool acc, double* mag) const {
    double s = acc ? c0[size_t(i * ldc + j)] : 0.0;
    *mag = std::fabs(s);
    for (int64_t k = 0; k < kc; ++k) {
      const double t = bf(a[size_t(i * lda + k)]) * bf(b[size_t((k / 2) * 2 * detail::kNR + 2 * j + k % 2)]);
      s += t, *mag += std::fabs(t);
    }
    return s;
  }
  void run_and_check(bool acc, const std::string& what) const {
    std::vector<float> c = c0;
    detail::kernel_amx_bf16_emulated(32, kc, a.data(), lda, b.data(), c.data(), ldc, acc);
    int wrong = 0;
    for (int i = 0; i < 32; ++i)
      for (int j = 0; j < 48; ++j) {
        double mag, want = expect(i, j, acc, &mag);
        if (std::fabs(double(c[size_t(i * ldc + j)]) - want) > 1e-6 * mag + 1e-30) ++wrong;
      }
    for (int i = 0; i < 32; ++i)  // the padding columns of C are not touched
      for (int64_t j = 48; j < ldc; ++j) wrong += c[size_t(i * ldc + j)] != c0[size_t(i * ldc + j)];
    EXPECT_EQ(wrong, 0) << what;
  }
};

}  // namespace

TEST(AmxEmulated, KernelMatchesFp64OnHandPackedTiles) {
  for (int64_t kc : {32, 64, 512})
    for (bool acc : {false, true}) Block(kc, uint32_t(kc + acc)).run_and_check(acc, "kc " + std::to_string(kc) + (acc ? " accumulate" : ""));
}

// Other code on the thread (oneDNN's AMX kernels under PyTorch, say) may release the tiles or load
// its own configuration between our calls: the kernel must configure the unit again, not remember
// that it did (the model faults on a tile instruction after a release, as the hardware does).
TEST(AmxEmulated, ConfiguresAgainAfterOtherTileUsers) {
  Block blk(96, 5);
  blk.run_and_check(true, "first call");
  detail::amx_emulator_release();
  blk.run_and_check(true, "after a release");
  detail::amx_emulator_load_foreign_config();
  blk.run_and_check(false, "after a foreign configuration");
}

TEST(AmxEmulated, GemmThroughTheDriver) {
  ScopedIsaPath path({cpu::detected_isa(), 0, true});
  if (cpu::detected_isa() < cpu::Isa::avx2) GTEST_SKIP() << "bf16 pairs need AVX2";
  EXPECT_STREQ(kernel_name(DType::bf16, DType::bf16, 16), "amx_bf16_emulated");
  EXPECT_STRNE(kernel_name(DType::bf16, DType::bf16, 15), "amx_bf16_emulated");
  // M around the 32-row tile, K around the 32-deep tile step and past the 512-deep K chunk (C
  // accumulated across chunks), N with a partial panel; accumulating into C and not.
  for (int64_t M : {16, 31, 32, 33, 70})
    for (int64_t K : {31, 32, 600, 1100})
      for (int64_t N : {48, 100}) {
        const bool acc = (M + K) % 2;
        Tensor a = random_tensor(DType::bf16, {M, K}, uint32_t(M * K + N)), b = random_tensor(DType::bf16, {K, N}, uint32_t(N + K));
        Tensor c0 = random_tensor(DType::f32, {M, N}, uint32_t(M));
        Tensor c = Tensor::copy_of(c0), r = Tensor::copy_of(c0);
        Epilogue ep;
        ep.accumulate = acc;
        PackedB pb = prepack(b, BLayout::KN);
        ot::gemm::gemm(M, {a.view().data, DType::bf16, K}, pb, {c.view().data, DType::f32, N}, ep);
        ref::gemm(M, {a.view().data, DType::bf16, K}, b, BLayout::KN, {r.view().data, DType::f32, N}, ep);
        EXPECT_LE(norm_err(c, r), 2e-5) << "M " << M << " K " << K << " N " << N << (acc ? " accumulate" : "");
      }
}

}  // namespace test_amx_emulated
