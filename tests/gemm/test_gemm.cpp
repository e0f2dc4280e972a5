// gemm() on prepacked B against ref::gemm, for every ISA path of this machine: odd shapes, row
// strides, both weight layouts, every dtype, every epilogue, gather and scatter.
#include <numeric>

#include "gemm_test_util.h"
#include "ot/error.h"
#include "ot/parallel.h"

namespace test_gemm {
using namespace ot;
using namespace ot::gemm;
using namespace ot::gemm::testing;

namespace {

struct Case {
  int64_t M, N, K;
  DType a_t, b_t, c_t;
  BLayout layout;
  Epilogue ep;
  bool gather = false;
  int64_t lda_pad = 3, c_rows = 0;  // c_rows > M for scatter targets
};

// Runs one case on the current ISA cap, compares with the reference, returns the normalised error.
double run_case(const Case& cs, uint32_t seed, double* tol) {
  const int64_t M = cs.M, N = cs.N, K = cs.K;
  const int64_t n_out = cs.ep.act == Act::swiglu ? N / 2 : N;
  const int64_t a_rows = cs.gather ? M + 7 : M;
  const int64_t lda = K + cs.lda_pad;
  Tensor a = random_tensor(cs.a_t, {std::max<int64_t>(a_rows, 1), lda}, seed);
  Tensor b = cs.layout == BLayout::KN ? random_tensor(cs.b_t, {K, N}, seed + 1) : random_tensor(cs.b_t, {N, K}, seed + 1);
  std::vector<int32_t> rows(static_cast<size_t>(M));
  std::mt19937 rng(seed + 2);
  for (auto& r : rows) r = int32_t(rng() % uint32_t(std::max<int64_t>(a_rows, 1)));
  std::vector<float> bias = to_f32(random_tensor(DType::f32, {N}, seed + 3));
  std::vector<float> scale = to_f32(random_tensor(DType::f32, {std::max<int64_t>(M, 1)}, seed + 4, 0.5f, 1.5f));
  int64_t c_rows = std::max(cs.c_rows, M);
  std::vector<int32_t> scatter(static_cast<size_t>(M));
  for (auto& s : scatter) s = int32_t(rng() % uint32_t(std::max<int64_t>(c_rows, 1)));
  const int64_t ldc = n_out + 5;
  Tensor c0 = random_tensor(cs.c_t, {std::max<int64_t>(c_rows, 1), ldc}, seed + 5);
  Tensor c_fast = Tensor::copy_of(c0), c_ref = Tensor::copy_of(c0);

  Epilogue ep = cs.ep;
  if (ep.bias) ep.bias = bias.data();
  if (ep.row_scale) ep.row_scale = scale.data();
  if (ep.scatter_rows) ep.scatter_rows = scatter.data();
  AOperand ao{a.view().data, cs.a_t, lda, cs.gather ? rows.data() : nullptr};
  PackedB pb = prepack(b, cs.layout);
  ot::gemm::gemm(M, ao, pb, {c_fast.view().data, cs.c_t, ldc}, ep);
  ref::gemm(M, ao, b, cs.layout, {c_ref.view().data, cs.c_t, ldc}, ep);
  // From AVX2 up bf16 weights pack as bf16 pairs and A is rounded to bf16.
  bool bf16_compute = pb.isa() >= cpu::Isa::avx2 && cs.b_t == DType::bf16 && cs.a_t != DType::bf16;
  *tol = tol_for(cs.c_t, bf16_compute);
  // With scatter-accumulate a row hit twice sums two rounded values: compare in the output dtype.
  return norm_err(c_fast, c_ref);
}

}  // namespace

TEST(Gemm, ShapesDtypesLayoutsEveryIsa) {
  const DType dts[] = {DType::f32, DType::bf16, DType::f16};
  for (const IsaPath& isa : isa_paths()) {
    ScopedIsaPath cap(isa);
    for (int di = 0; di < 3; ++di)
      for (int64_t M : {0, 1, 15, 16, 17, 33, 255}) {
        Case cs{M, 97, 130, dts[di], dts[di], dts[(di + int(M)) % 3], M % 2 ? BLayout::NK : BLayout::KN, {}};
        double tol, err = run_case(cs, uint32_t(M * 7 + di), &tol);
        EXPECT_LE(err, tol) << "isa=" << isa_str(isa) << " dtype=" << dtype_name(dts[di]) << " M=" << M;
      }
  }
}

TEST(Gemm, SmallAndDegenerateShapes) {
  for (const IsaPath& isa : isa_paths()) {
    ScopedIsaPath cap(isa);
    for (auto [N, K] : {std::pair<int64_t, int64_t>{1, 1}, {2, 3}, {48, 32}, {49, 33}, {96, 64}, {5, 0}, {200, 2}, {60, 1000}}) {  // K = 1000 spans several K blocks
      for (DType t : {DType::f32, DType::bf16}) {
        Case cs{9, N, K, t, t, DType::f32, BLayout::KN, {}};
        double tol, err = run_case(cs, uint32_t(N + K), &tol);
        EXPECT_LE(err, tol) << "isa=" << isa_str(isa) << " N=" << N << " K=" << K << " " << dtype_name(t);
      }
    }
  }
}

// Every micro-tile height (one tile of 1..8 rows, two of 5..8), K past the kernels' K blocks with
// a tail (accumulating chunks), N with a partial last panel: each ISA's register tile, edge by edge.
// Decode-sized M (1..4) also at an odd K past several of the decode kernels' k chunks.
TEST(Gemm, EveryTileHeightAndKTail) {
  for (const IsaPath& isa : isa_paths()) {
    ScopedIsaPath cap(isa);
    for (DType t : {DType::f32, DType::bf16, DType::f16})
      for (int64_t M = 1; M <= 16; ++M)
        for (int64_t K : {420, 1025}) {
          if (K == 1025 && M > 4) continue;
          Case cs{M, 100, K, t, t, DType::f32, M % 2 ? BLayout::KN : BLayout::NK, {}};
          double tol, err = run_case(cs, uint32_t(M * 3 + int(t) + K), &tol);
          EXPECT_LE(err, tol) << "isa=" << isa_str(isa) << " dtype=" << dtype_name(t) << " M=" << M << " K=" << K;
        }
  }
}

TEST(Gemm, MixedDtypes) {
  for (const IsaPath& isa : isa_paths()) {
    ScopedIsaPath cap(isa);
    for (auto [at, bt] : {std::pair{DType::f32, DType::bf16}, {DType::bf16, DType::f32}, {DType::f16, DType::bf16}, {DType::bf16, DType::f16}}) {
      Case cs{20, 50, 40, at, bt, DType::f32, BLayout::NK, {}};
      double tol, err = run_case(cs, 11, &tol);
      EXPECT_LE(err, tol) << "isa=" << isa_str(isa) << " a=" << dtype_name(at) << " b=" << dtype_name(bt);
    }
  }
}

// Every activation x bias x row_scale x accumulate (beta = 1) x C dtype on each ISA's epilogue;
// N = 98 (49 SwiGLU outputs): a partial 8- and 16-column vector at the end of each row. M 33 (the
// 8-row kernel) and 3 (a decode row block: the decode kernels' tiles, AVX2's 3-row form).
TEST(Gemm, EveryEpilogue) {
  static const float dummy = 0;  // non-null marker: run_case swaps in the real arrays
  for (const IsaPath& isa : isa_paths()) {
    ScopedIsaPath cap(isa);
    for (DType t : {DType::bf16, DType::f32})
      for (Act act : {Act::none, Act::relu, Act::gelu, Act::silu, Act::swiglu})
        for (int variant = 0; variant < 8; ++variant)
          for (DType ct : {DType::f32, DType::bf16, DType::f16})
            for (int64_t M : {33, 3}) {
              Epilogue ep;
              ep.act = act;
              ep.bias = variant & 1 ? &dummy : nullptr;
              ep.row_scale = variant & 2 ? &dummy : nullptr;
              ep.accumulate = variant & 4;
              Case cs{M, 98, 70, t, t, ct, BLayout::NK, ep, (variant & 2) != 0};
              double tol, err = run_case(cs, uint32_t(variant * 13 + int(act) + M), &tol);
              EXPECT_LE(err, tol) << "isa=" << isa_str(isa) << " act=" << act_name(act) << " variant=" << variant << " " << dtype_name(t)
                                  << " c=" << dtype_name(ct) << " M=" << M;
            }
  }
}

TEST(Gemm, GatherScatterAccumulateWithCollisions) {
  static const int32_t dummy_rows = 0;
  static const float dummy = 0;
  for (const IsaPath& isa : isa_paths()) {
    ScopedIsaPath cap(isa);
    for (DType ct : {DType::f32, DType::bf16, DType::f16}) {
      Epilogue ep;
      ep.scatter_rows = &dummy_rows;
      ep.row_scale = &dummy;
      ep.accumulate = true;
      // 255 rows scattered into 40: every output row is hit several times, from many threads' blocks.
      Case cs{255, 100, 64, DType::bf16, DType::bf16, ct, BLayout::KN, ep, true, 3, 40};
      double tol, err = run_case(cs, 5, &tol);
      EXPECT_LE(err, ct == DType::f32 ? 1e-4 : ct == DType::f16 ? 4e-3 : 2e-2) << "isa=" << isa_str(isa) << " c=" << dtype_name(ct);
    }
  }
}

TEST(Gemm, ForceRefMatchesReferenceExactly) {
  cpu::ScopedForceRef fr(true);
  Tensor a = random_tensor(DType::f32, {9, 30}, 1), b = random_tensor(DType::bf16, {30, 20}, 2);
  Tensor c1 = Tensor::zeros(DType::f32, {9, 20}), c2 = Tensor::zeros(DType::f32, {9, 20});
  PackedB pb = prepack(b, BLayout::KN);
  ot::gemm::gemm(9, {a.view().data, DType::f32, 30}, pb, {c1.view().data, DType::f32, 20});
  ref::gemm(9, {a.view().data, DType::f32, 30}, b, BLayout::KN, {c2.view().data, DType::f32, 20});
  EXPECT_EQ(norm_err(c1, c2), 0.0);
  EXPECT_STREQ(kernel_name(DType::bf16, DType::bf16, 9), "ref");
}

TEST(Gemm, KernelNamesFollowTheIsaCap) {
  {
    cpu::ScopedMaxIsa cap(cpu::Isa::scalar);
    EXPECT_STREQ(kernel_name(DType::bf16, DType::bf16, 64), "scalar");
  }
  if (cpu::detected_isa() >= cpu::Isa::avx2) {
    cpu::ScopedMaxIsa cap(cpu::Isa::avx2);
    EXPECT_STREQ(kernel_name(DType::f32, DType::f32, 64), "avx2_f32");
    EXPECT_STREQ(kernel_name(DType::bf16, DType::bf16, 1), "avx2_bf16_decode");
    EXPECT_STREQ(kernel_name(DType::bf16, DType::bf16, 3), "avx2_bf16_decode");
    EXPECT_STREQ(kernel_name(DType::bf16, DType::bf16, 4), "avx2_bf16");
    EXPECT_STREQ(kernel_name(DType::bf16, DType::bf16, 64), "avx2_bf16");
    EXPECT_EQ(prepack(random_tensor(DType::f32, {32, 32}, 1), BLayout::KN).isa(), cpu::Isa::avx2);
    EXPECT_EQ(prepack(random_tensor(DType::bf16, {32, 32}, 1), BLayout::KN).isa(), cpu::Isa::avx2);
  }
  if (cpu::detected_isa() >= cpu::Isa::avx512) {
    cpu::ScopedMaxIsa cap(cpu::Isa::avx512);  // no bf16 dot product: widen, decode on the AVX2 kernel
    EXPECT_STREQ(kernel_name(DType::bf16, DType::bf16, 3), "avx2_bf16_decode");
    EXPECT_STREQ(kernel_name(DType::bf16, DType::bf16, 4), "avx512_bf16_widen");
  }
  if (cpu::detected_isa() >= cpu::Isa::avx512_bf16) {
    for (int bf16_kernel : {1, 2}) {
      ScopedIsaPath cap({cpu::Isa::avx512_bf16, bf16_kernel});
      EXPECT_STREQ(kernel_name(DType::bf16, DType::bf16, 1), "avx512_bf16_decode");
      EXPECT_STREQ(kernel_name(DType::bf16, DType::bf16, 3), "avx512_bf16_decode");
      EXPECT_STREQ(kernel_name(DType::bf16, DType::bf16, 4), bf16_kernel == 1 ? "avx512_bf16" : "avx512_bf16_widen");
      EXPECT_STREQ(kernel_name(DType::f32, DType::f32, 64), "avx512_f32");
      Tensor b = random_tensor(DType::bf16, {32, 32}, 1);
      EXPECT_EQ(prepack(b, BLayout::KN).isa(), cpu::Isa::avx512_bf16);
    }
  }
}

TEST(Gemm, PackedForHigherIsaStillRunsUnderLowerCap) {
  Tensor a = random_tensor(DType::bf16, {17, 40}, 1), b = random_tensor(DType::bf16, {40, 60}, 2);
  PackedB pb = prepack(b, BLayout::KN);  // packed for the best ISA
  cpu::ScopedMaxIsa cap(cpu::Isa::scalar);
  Tensor c1 = Tensor::zeros(DType::f32, {17, 60}), c2 = Tensor::zeros(DType::f32, {17, 60});
  ot::gemm::gemm(17, {a.view().data, DType::bf16, 40}, pb, {c1.view().data, DType::f32, 60});
  ref::gemm(17, {a.view().data, DType::bf16, 40}, b, BLayout::KN, {c2.view().data, DType::f32, 60});
  EXPECT_LE(norm_err(c1, c2), 2e-5);
}

TEST(Gemm, BadInputsThrowBeforeWriting) {
  Tensor b = random_tensor(DType::f32, {8, 7}, 1), a = random_tensor(DType::f32, {4, 8}, 2);
  Tensor c = Tensor::zeros(DType::f32, {4, 7});
  PackedB pb = prepack(b, BLayout::KN);
  Epilogue sw;
  sw.act = Act::swiglu;  // odd N
  EXPECT_THROW(ot::gemm::gemm(4, {a.view().data, DType::f32, 8}, pb, {c.view().data, DType::f32, 7}, sw), Error);
  EXPECT_THROW(ot::gemm::gemm(4, {a.view().data, DType::f32, 5}, pb, {c.view().data, DType::f32, 7}), Error);   // lda < K
  EXPECT_THROW(ot::gemm::gemm(4, {a.view().data, DType::i32, 8}, pb, {c.view().data, DType::f32, 7}), Error);   // A dtype
  EXPECT_THROW(ot::gemm::gemm(4, {a.view().data, DType::f32, 8}, pb, {c.view().data, DType::i64, 7}), Error);   // C dtype
  EXPECT_THROW(ot::gemm::gemm(4, {a.view().data, DType::f32, 8}, PackedB(), {c.view().data, DType::f32, 7}), Error);
  EXPECT_THROW(ot::gemm::gemm(-1, {a.view().data, DType::f32, 8}, pb, {c.view().data, DType::f32, 7}), Error);
  Tensor i = Tensor::zeros(DType::i32, {4, 4});
  EXPECT_THROW(prepack(i, BLayout::KN), Error);
  Tensor t3 = Tensor::zeros(DType::f32, {2, 2, 2});
  EXPECT_THROW(prepack(t3, BLayout::KN), Error);
  for (int64_t k = 0; k < c.numel(); ++k) ASSERT_EQ(get_as_double(c, k), 0.0);
}

}  // namespace test_gemm
