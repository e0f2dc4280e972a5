// W8A8 grouped_matmul (int8 weights, activations quantised per token to int8) against its
// reference (the activations quantised and dequantised per row, the weights dequantised, then the
// plain grouped matmul) on every ISA path of this machine: rows 0, 1, 7, 13, 64, 300 over groups
// with empty ones, int8 per channel (K 200, and K 203 whose groups pad to whole quads) and group-wise,
// symmetric and asymmetric, SwiGLU on and off, bias, x in fp32 / bf16 / fp16.
#include <cmath>
#include <limits>
#include <string>

#include "helpers.h"
#include "quant_test_util.h"
#include "ot/cpu.h"
#include "ot/gemm_quant.h"
#include "ot/quant.h"
#include "ot/quant_weights.h"
#include "ot/trace.h"

namespace test_grouped_w8a8 {
using namespace ot;
using namespace ot::moe;
using mt::randn;
using qt::counts_for;
using qt::paths;
using qt::rel_frob;
using gemm::ActivationQuant;

namespace {

constexpr ActivationQuant kA8 = ActivationQuant::int8_per_token;

struct Fmt { int64_t gs; bool sym; int64_t K; };

}  // namespace

TEST(GroupedMatmulW8A8, MatchesReference) {
  const std::vector<Fmt> fmts = {{0, true, 200}, {0, false, 203}, {64, false, 128}, {32, true, 96}};
  const int64_t G = 6;
  int combo = 0;
  for (const Fmt& fm : fmts)
    for (int64_t M : {0, 1, 7, 13, 64, 300}) {
      ++combo;
      const bool swiglu = combo % 2 == 0, with_bias = combo % 3 != 0;
      const DType xt = combo % 5 == 0 ? DType::f16 : combo % 2 ? DType::bf16 : DType::f32;
      // SwiGLU: 35 outputs a half (2 panels each); plain: 3 panels, so a streamed item of few-row
      // groups reads one pair side by side and one panel alone.
      const int64_t N = swiglu ? 70 : 67;
      QuantizedWeights q = quantize_weights(randn(DType::f32, {G, fm.K, N}, uint32_t(combo), 0.05f), WeightFormat::int8, fm.gs, fm.sym);
      Tensor x = randn(xt, {M, fm.K}, uint32_t(100 + combo));
      Tensor bias = with_bias ? randn(DType::f32, {G, N}, uint32_t(200 + combo), 0.1f) : Tensor();
      Tensor gl = counts_for(M);
      const gemm::Act act = swiglu ? gemm::Act::swiglu : gemm::Act::none;
      Tensor ref = ref::grouped_matmul(x, q.view(), gl, GroupListType::count, bias, act, kA8);
      Tensor weight_only = ref::grouped_matmul(x, q.view(), gl, GroupListType::count, bias, act);
      const std::string what = "gs=" + std::to_string(fm.gs) + (fm.sym ? " sym" : " asym") + " K=" + std::to_string(fm.K) + " M=" +
                               std::to_string(M) + " N=" + std::to_string(N) + (with_bias ? " bias " : " ") + dtype_name(xt);
      // The reference does quantise the activations: its distance from weight-only is the int8
      // rounding of x (a W8A8 path that skipped it would pass a looser check).
      if (M > 0) {
        const double lossy = rel_frob(ref, weight_only);
        EXPECT_GT(lossy, 5e-4) << what;
        EXPECT_LT(lossy, 3e-2) << what;
      }
      for (cpu::Isa isa : paths()) {
        cpu::ScopedMaxIsa cap(isa);
        Tensor y = grouped_matmul(x, q.view(), gl, GroupListType::count, bias, act, kA8);
        ASSERT_EQ(y.shape(), ref.shape()) << what;
        ASSERT_EQ(y.dtype(), xt);
        const double tol = xt == DType::f32 ? 2e-5 : xt == DType::f16 ? 1e-3 : 4e-3;
        EXPECT_LE(rel_frob(y, ref), tol) << what << " isa=" << cpu::isa_name(isa);
      }
    }
}

// Every kernel forms the same exact int32 sums and scales them in the same order: the scalar and
// the vector paths give the same bits (fp32 output, no activation), and so do repeated calls.
TEST(GroupedMatmulW8A8, KernelsAgreeBitForBitAndPackOnce) {
  QuantizedWeights q = quantize_weights(randn(DType::f32, {3, 256, 96}, 3, 0.05f), WeightFormat::int8, 0, false);
  gemm::PackedQuantB pk = gemm::prepack_quantized(q.view(), kA8);
  EXPECT_EQ(pk.activation_quant(), kA8);
  // 3 experts x 4 panels (N even: two halves of 48 columns, 2 panels each) x (256 header bytes +
  // 64 quads x 128 bytes).
  EXPECT_EQ(pk.bytes(), size_t(3 * 4 * (256 + 64 * 128)));
  Tensor x = randn(DType::f32, {40, 256}, 4);
  Tensor gl = mt::ints({3}, {13, 0, 27});
  Tensor view = grouped_matmul(x, q.view(), gl, GroupListType::count, {}, gemm::Act::none, kA8);
  trace::take_events();
  trace::set_timeline(true);
  Tensor packed = grouped_matmul(x, pk, gl, GroupListType::count);
  trace::set_timeline(false);
  std::string kernel;
  for (const trace::Event& e : trace::take_events())
    if (e.name == "grouped_matmul") kernel = e.kernel;
  EXPECT_EQ(kernel, gemm::quant_kernel_name(WeightFormat::int8, kA8));
  EXPECT_NE(kernel.find("w8a8"), std::string::npos) << kernel;
  mt::expect_same(view, packed, "packed vs view");
  mt::expect_same(grouped_matmul(x, pk, gl, GroupListType::count), packed, "repeat");
  for (cpu::Isa isa : paths()) {
    cpu::ScopedMaxIsa cap(isa);
    mt::expect_same(grouped_matmul(x, pk, gl, GroupListType::count), packed, cpu::isa_name(isa));
  }
}

// Rows already quantised (EP dispatch's int8 rows with their scales) through gemm::QuantGroup give
// the bits of the float rows quantised inside the call.
TEST(GroupedMatmulW8A8, GivenInt8RowsEqualTheQuantisedFloatRows) {
  const int64_t M = 9, K = 128, N = 64;
  QuantizedWeights q = quantize_weights(randn(DType::f32, {2, K, N}, 5, 0.05f), WeightFormat::int8, 0, true);
  gemm::PackedQuantB pk = gemm::prepack_quantized(q.view(), kA8);
  Tensor x = randn(DType::f32, {M, K}, 6);
  std::vector<int8_t> codes(size_t(M * K));
  std::vector<float> scale(static_cast<size_t>(M));
  for (int64_t r = 0; r < M; ++r) scale[size_t(r)] = quantize_row_i8_dynamic(x.ptr<float>() + r * K, K, codes.data() + r * K);
  const std::vector<int32_t> rows = {8, 0, 3, 1, 2, 7, 6, 5, 4};  // gathered, as permuted tokens are
  std::vector<float> y_float(size_t(M * N)), y_int8(size_t(M * N));
  for (int pass = 0; pass < 2; ++pass) {
    gemm::QuantGroup g[2];
    for (int i = 0; i < 2; ++i) {
      g[i].M = i ? 5 : 4;
      g[i].a = pass ? static_cast<const void*>(codes.data()) : x.ptr<float>();
      g[i].a_dtype = pass ? DType::i8 : DType::f32;
      g[i].a_scale = pass ? scale.data() : nullptr;
      g[i].lda = K;
      g[i].a_rows = rows.data() + (i ? 4 : 0);
      g[i].expert = i;
      g[i].c = {(pass ? y_int8 : y_float).data() + (i ? 4 : 0) * N, DType::f32, N};
    }
    gemm::grouped_gemm_quant(pk, g, 2);
  }
  EXPECT_EQ(y_float, y_int8);
  // The call really used the given codes: other scales move the result.
  for (float& s : scale) s *= 2.f;
  gemm::QuantGroup g;
  g.M = 1, g.a = codes.data(), g.a_dtype = DType::i8, g.a_scale = scale.data(), g.lda = K, g.c = {y_int8.data(), DType::f32, N};
  gemm::grouped_gemm_quant(pk, &g, 1);
  EXPECT_EQ(y_int8[0], 2.f * y_float[size_t(N)]);  // x row 0 was output row 1 (rows[1] = 0) of expert 0 above
}

TEST(GroupedMatmulW8A8, BadInputNamesTheArgument) {
  Tensor w = randn(DType::f32, {2, 64, 32}, 1, 0.05f);
  QuantizedWeights q8 = quantize_weights(w, WeightFormat::int8, 0, true), q4 = quantize_weights(w, WeightFormat::int4, 32, true);
  Tensor x = randn(DType::bf16, {4, 64}, 2);
  Tensor gl = mt::ints({2}, {1, 3});
  EXPECT_OT_ERROR(grouped_matmul(x, q4.view(), gl, GroupListType::count, {}, gemm::Act::none, kA8), "weight");
  EXPECT_OT_ERROR(gemm::prepack_quantized(q4.view(), kA8), "weight");
  gemm::PackedQuantB plain = gemm::prepack_quantized(q8.view()), a8 = gemm::prepack_quantized(q8.view(), kA8);
  std::vector<int8_t> codes(64, 1);
  std::vector<float> y(32, -7.f);
  gemm::QuantGroup g;
  g.M = 1, g.a = codes.data(), g.a_dtype = DType::i8, g.lda = 64, g.c = {y.data(), DType::f32, 32};
  EXPECT_OT_ERROR(gemm::grouped_gemm_quant(plain, &g, 1), "a");       // int8 rows need a W8A8 pack
  EXPECT_OT_ERROR(gemm::grouped_gemm_quant(a8, &g, 1), "a_scale");    // ... and their scales
  EXPECT_EQ(y, std::vector<float>(32, -7.f));                         // nothing written
}

// A row holding NaN or Inf gives NaN outputs in that row only; a zero row gives the bias.
TEST(GroupedMatmulW8A8, NonFiniteRowReachesOnlyItsRow) {
  const int64_t K = 96, N = 40;
  QuantizedWeights q = quantize_weights(randn(DType::f32, {1, K, N}, 7u, 0.05f), WeightFormat::int8, 0, true);
  Tensor bias = randn(DType::f32, {1, N}, 9u, 0.1f);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()})
    for (cpu::Isa isa : paths()) {
      cpu::ScopedMaxIsa cap(isa);
      Tensor x = randn(DType::f32, {3, K}, 8u);
      x.ptr<float>()[K + 5] = bad;
      for (int64_t k = 0; k < K; ++k) x.ptr<float>()[2 * K + k] = 0.f;
      Tensor y = grouped_matmul(x, q.view(), mt::ints({1}, {3}), GroupListType::count, bias, gemm::Act::none, kA8);
      for (int64_t n = 0; n < N; ++n) {
        EXPECT_TRUE(std::isfinite(y.ptr<float>()[n])) << cpu::isa_name(isa);
        EXPECT_TRUE(std::isnan(y.ptr<float>()[N + n])) << cpu::isa_name(isa);
        EXPECT_EQ(y.ptr<float>()[2 * N + n], bias.ptr<float>()[n]) << cpu::isa_name(isa);
      }
    }
}

}  // namespace test_grouped_w8a8
