// grouped_matmul on stacked weights ([G, K, N], or a transposed view of torch's [G, N, K]), on
// prepacked weights and on quantised weights (int8 / int4 per channel, symmetric or not, weight-only
// or W8A8); group_list int32 / int64 as cumsum, count or key_value; bias; every act.
#include "fuzz/fuzz_util.h"
#include "ot/moe.h"
#include "ot/quant_weights.h"

using namespace ot;
using namespace ot::moe;

OT_FUZZ_TARGET(in, ar) {
  const DType t = in.pick({DType::f32, DType::bf16, DType::f16, DType::f32});
  const int64_t M = in.range(0, 12), K = in.range(1, 20), N = in.range(1, 20), G = in.range(1, 5);
  const gemm::Act act = in.pick({gemm::Act::none, gemm::Act::relu, gemm::Act::gelu, gemm::Act::silu, gemm::Act::swiglu});
  const auto type = GroupListType(in.arg(0, 2));
  const bool torch_layout = in.flag(), packed = in.byte() < 64, quant = in.byte() < 80;
  fz::Buf& x = ar.add("x", t, {M, in.byte() < 250 ? K : K + 1}, in.byte() < 40 ? in.range(1, 3) : 0);
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, in.grid(8, -1, 1));
  // torch layout: [G, N, K] storage seen as [G, K, N] through its strides.
  fz::Buf& wb = ar.add("weight", in.byte() < 250 ? t : DType::f32, torch_layout ? std::vector<int64_t>{G, N, K} : std::vector<int64_t>{G, K, N});
  for (int64_t i = 0; i < wb.numel(); ++i) wb.set(i, in.grid(8, -1, 1));
  TensorView w = wb.view();
  if (torch_layout) {
    std::swap(w.sizes[1], w.sizes[2]);
    std::swap(w.strides[1], w.strides[2]);
  }
  // Group sizes summing to M (rarely not), written in the chosen form.
  std::vector<int64_t> cnt(size_t(G), 0);
  for (int64_t r = 0; r < M; ++r) ++cnt[size_t(in.range(0, G - 1))];
  if (in.byte() < 6) cnt[0] += in.pick<int64_t>({1, -1});
  const DType gt = in.pick({DType::i64, DType::i32, DType::i64, DType::f32});
  fz::Buf* gl;
  if (type == GroupListType::key_value) {
    const int64_t rows = in.range(0, G + 1);
    gl = &ar.add("group_list", gt, {rows, 2});
    for (int64_t i = 0; i < rows; ++i) {
      int64_t g = in.byte() < 250 ? in.range(0, G - 1) : G;
      gl->set(2 * i, double(g));
      gl->set(2 * i + 1, double(i < G ? cnt[size_t(i)] : 0));
    }
  } else {
    gl = &ar.add("group_list", gt, {in.byte() < 250 ? G : G + 1});
    int64_t run = 0;
    for (int64_t g = 0; g < gl->numel(); ++g) {
      int64_t c = g < G ? cnt[size_t(g)] : 0;
      run += c;
      gl->set(g, double(type == GroupListType::cumsum ? run : c));
    }
  }
  TensorView bias;
  if (in.flag()) bias = ar.values(in, "bias", in.pick({DType::f32, t}), {G, in.byte() < 250 ? N : N + 1});
  ar.seal();
  const double atol = fz::rtol_of(t) * double(K + 1) + 1e-5 * double(K);
  auto cmp = [&](auto& a, auto& b) { fz::expect_close("y", a, b, fz::rtol_of(t), atol); };
  if (quant) {
    // The codes of the (finite) weights; the float weights' dtype does not matter here.
    const WeightFormat f = in.flag() ? WeightFormat::int4 : WeightFormat::int8;
    const bool sym = in.flag();
    const gemm::ActivationQuant aq = f == WeightFormat::int8 && in.flag() ? gemm::ActivationQuant::int8_per_token : gemm::ActivationQuant::none;
    const QuantizedWeights q = quantize_weights(w, f, 0, sym);
    fz::run_both(
        "grouped_matmul (quantised)", [&] { return grouped_matmul(x, q.view(), *gl, type, bias, act, aq); },
        [&] { return ref::grouped_matmul(x, q.view(), *gl, type, bias, act, aq); }, cmp);
  } else if (packed) {
    fz::run_both(
        "grouped_matmul (packed)",
        [&] {
          std::vector<gemm::PackedB> pk;
          for (int64_t g = 0; g < G; ++g)
            pk.push_back(torch_layout ? gemm::prepack(wb.view().select(0, g), gemm::BLayout::NK) : gemm::prepack(w.select(0, g), gemm::BLayout::KN));
          std::vector<const gemm::PackedB*> ptrs;
          for (auto& p : pk) ptrs.push_back(&p);
          return grouped_matmul(x, ptrs, *gl, type, bias, act);
        },
        [&] { return ref::grouped_matmul(x, w, *gl, type, bias, act); }, cmp);
  } else {
    fz::run_both(
        "grouped_matmul", [&] { return grouped_matmul(x, w, *gl, type, bias, act); },
        [&] { return ref::grouped_matmul(x, w, *gl, type, bias, act); }, cmp);
  }
  ar.check();
}
