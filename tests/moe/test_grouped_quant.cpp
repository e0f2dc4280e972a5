// grouped_matmul on quantised experts (antiquant_scale / antiquant_offset / antiquant_group_size)
// against its reference (dequantize_weights, then the plain grouped matmul) on every ISA path of
// this machine: rows 0, 1, 7, 64, 300 over groups with empty ones, int8 per channel (K = 200, no
// multiple of anything) and int4 / int8 group-wise, symmetric and asymmetric, N odd and even,
// SwiGLU on and off, bias, x in fp32 / bf16 / fp16.
#include <cmath>
#include <string>

#include "helpers.h"
#include "quant_test_util.h"
#include "ot/cpu.h"
#include "ot/quant_weights.h"
#include "ot/trace.h"

namespace test_grouped_quant {
using namespace ot;
using namespace ot::moe;
using mt::randn;
using qt::counts_for;
using qt::paths;
using qt::rel_frob;

namespace {

struct Fmt { WeightFormat f; int64_t gs; bool sym; int64_t K; };

}  // namespace

TEST(GroupedMatmulQuant, MatchesReference) {
  const std::vector<Fmt> fmts = {
      {WeightFormat::int8, 0, true, 200},  {WeightFormat::int8, 0, false, 200}, {WeightFormat::int4, 32, true, 96},
      {WeightFormat::int4, 32, false, 96}, {WeightFormat::int4, 64, true, 192}, {WeightFormat::int4, 64, false, 192},
      {WeightFormat::int4, 128, true, 256}, {WeightFormat::int4, 128, false, 256}, {WeightFormat::int8, 64, false, 128},
      {WeightFormat::int4, 0, true, 72},
  };
  const int64_t G = 6;
  int combo = 0;
  for (const Fmt& fm : fmts)
    for (int64_t M : {0, 1, 7, 64, 300}) {
      ++combo;
      const bool swiglu = combo % 2 == 0, with_bias = combo % 3 != 0;
      const DType xt = combo % 5 == 0 ? DType::f16 : combo % 2 ? DType::bf16 : DType::f32;
      const int64_t N = swiglu ? 70 : 37;  // SwiGLU: 35 outputs (one full and one partial panel)
      Tensor w = randn(DType::f32, {G, fm.K, N}, uint32_t(combo), 0.05f);
      QuantizedWeights q = quantize_weights(w, fm.f, fm.gs, fm.sym);
      Tensor x = randn(xt, {M, fm.K}, uint32_t(100 + combo));
      Tensor bias = with_bias ? randn(DType::f32, {G, N}, uint32_t(200 + combo), 0.1f) : Tensor();
      Tensor gl = counts_for(M);
      const gemm::Act act = swiglu ? gemm::Act::swiglu : gemm::Act::none;
      Tensor ref = ref::grouped_matmul(x, q.view(), gl, GroupListType::count, bias, act);
      const std::string what = std::string(weight_format_name(fm.f)) + " gs=" + std::to_string(fm.gs) + (fm.sym ? " sym" : " asym") +
                               " M=" + std::to_string(M) + " N=" + std::to_string(N) + (with_bias ? " bias " : " ") + dtype_name(xt);
      for (cpu::Isa isa : paths()) {
        cpu::ScopedMaxIsa cap(isa);
        Tensor y = grouped_matmul(x, q.view(), gl, GroupListType::count, bias, act);
        ASSERT_EQ(y.shape(), ref.shape()) << what;
        ASSERT_EQ(y.dtype(), xt);
        // fp32 output: only summation order differs; bf16 / fp16: the output's rounding.
        const double tol = xt == DType::f32 ? 2e-5 : xt == DType::f16 ? 1e-3 : 4e-3;
        EXPECT_LE(rel_frob(y, ref), tol) << what << " isa=" << cpu::isa_name(isa);
      }
    }
}

TEST(GroupedMatmulQuant, PackedEqualsViewAndNamesItsKernel) {
  Tensor w = randn(DType::f32, {3, 128, 96}, 1, 0.05f);
  QuantizedWeights q = quantize_weights(w, WeightFormat::int4, 64, false);
  gemm::PackedQuantB pk = gemm::prepack_quantized(q.view());
  EXPECT_EQ(pk.G(), 3);
  EXPECT_EQ(pk.K(), 128);
  EXPECT_EQ(pk.N(), 96);
  EXPECT_TRUE(pk.has_offset());
  // 3 experts x 4 panels x 2 groups x (256 header bytes + 64 rows x 16 bytes).
  EXPECT_EQ(pk.bytes(), size_t(3 * 4 * 2 * (256 + 64 * 16)));
  Tensor x = randn(DType::bf16, {20, 128}, 2);
  Tensor gl = mt::ints({3}, {5, 0, 15});
  Tensor a = grouped_matmul(x, q.view(), gl, GroupListType::count, {}, gemm::Act::swiglu);
  trace::take_events();
  trace::set_timeline(true);
  Tensor b = grouped_matmul(x, pk, gl, GroupListType::count, {}, gemm::Act::swiglu);
  trace::set_timeline(false);
  std::string kernel;
  for (const trace::Event& e : trace::take_events())
    if (e.name == "grouped_matmul") kernel = e.kernel;
  EXPECT_EQ(kernel, gemm::quant_kernel_name(WeightFormat::int4));
  EXPECT_NE(kernel.find("w4"), std::string::npos) << kernel;
  mt::expect_same(a, b, "packed vs view");
  // Run to run: the same bits.
  mt::expect_same(grouped_matmul(x, pk, gl, GroupListType::count, {}, gemm::Act::swiglu), b, "repeat");
}

TEST(GroupedMatmulQuant, BadInputNamesTheArgument) {
  Tensor w = randn(DType::f32, {2, 64, 33}, 1, 0.05f);
  QuantizedWeights q = quantize_weights(w, WeightFormat::int4, 32, true);
  Tensor x = randn(DType::bf16, {4, 64}, 2);
  Tensor gl = mt::ints({2}, {1, 3});
  EXPECT_OT_ERROR(grouped_matmul(x, q.view(), gl, GroupListType::count, {}, gemm::Act::swiglu), "weight");  // odd N for swiglu
  EXPECT_OT_ERROR(grouped_matmul(randn(DType::bf16, {4, 32}, 3), q.view(), gl, GroupListType::count), "weight");  // K mismatch
  EXPECT_OT_ERROR(grouped_matmul(x, q.view(), mt::ints({2}, {1, 2}), GroupListType::count), "group_list");
  EXPECT_OT_ERROR(grouped_matmul(x, q.view(), gl, GroupListType::count, Tensor::zeros(DType::f32, {2, 32})), "bias");
  QuantWeightView v = q.view();
  v.group_size = 64;
  EXPECT_OT_ERROR(grouped_matmul(x, v, gl, GroupListType::count), "antiquant_scale");
  v = q.view();
  v.offset = Tensor::zeros(DType::f32, {2, 2, 32});
  EXPECT_OT_ERROR(grouped_matmul(x, v, gl, GroupListType::count), "antiquant_offset");
  v = q.view();
  v.data = Tensor::zeros(DType::i8, {2, 64, 17});
  EXPECT_OT_ERROR(grouped_matmul(x, v, gl, GroupListType::count), "weight");
  EXPECT_OT_ERROR(grouped_matmul(Tensor::zeros(DType::i32, {4, 64}), q.view(), gl, GroupListType::count), "x");
}

// A NaN activation of a one-row group (the int16 decode path for bf16 / fp16 x) makes that row's
// outputs NaN, and only that row's, on every ISA path (docs/robustness.md).
TEST(GroupedMatmulQuant, NanActivationReachesOnlyItsRow) {
  const int64_t G = 3, K = 96, N = 40;
  for (const Fmt fm : {Fmt{WeightFormat::int8, 0, true, K}, Fmt{WeightFormat::int4, 32, false, K}})
    for (DType xt : {DType::bf16, DType::f16}) {
      QuantizedWeights q = quantize_weights(randn(DType::f32, {G, K, N}, 7u, 0.05f), fm.f, fm.gs, fm.sym);
      Tensor x = randn(xt, {G, K}, 8u);
      set_from_double(x, 1 * K + 37, std::nan(""));
      Tensor gl = mt::ints({G}, {1, 1, 1});
      for (cpu::Isa isa : paths()) {
        cpu::ScopedMaxIsa cap(isa);
        Tensor y = grouped_matmul(x, q.view(), gl, GroupListType::count, Tensor(), gemm::Act::none);
        for (int64_t r = 0; r < G; ++r)
          for (int64_t n = 0; n < N; ++n) {
            const double v = get_as_double(y, r * N + n);
            EXPECT_EQ(std::isnan(v), r == 1) << weight_format_name(fm.f) << " " << dtype_name(xt) << " isa=" << cpu::isa_name(isa)
                                             << " row " << r << " col " << n;
          }
      }
    }
}

}  // namespace test_grouped_quant
