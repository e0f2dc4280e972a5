// moe_ffn on quantised experts (ot/moe/quant_experts.h): the layer of ffn.cpp with the expert FFN
// as two calls of the quantised grouped GEMM:
//   1. h[sorted rows] = swiglu(x[gather rows] @ Wgu)   (rows gathered while A is converted to fp32)
//   2. d[sorted rows] = h @ Wd                        (fp32, one row per routed pair)
// then each output row adds scale * d of its pairs in sorted-row order (the quantised GEMM's work
// items split columns across experts, so a scatter-add in its epilogue could race; the combine
// keeps the sums race-free and in one fixed order).
#include <algorithm>
#include <cstring>

#include "ot/moe/quant_experts.h"
#include "ot/numeric.h"
#include "ot/parallel.h"
#include "src/moe/common.h"
#include "src/moe/ffn_plan.h"
#include "src/ref/moe_ffn_ref.h"
#include "src/ref/quant_ref.h"

namespace ot::moe {

namespace {

// out[o] (+)= sum over sorted rows i with scatter[i] = o, ascending i, of scale[i] * d[i].
void combine_rows(const float* d, int64_t A, int64_t H, const ExpertRows& rows, const TensorView& out, bool accumulate) {
  const int64_t R = out.size(0);
  // Sorted rows bucketed by output row (counting sort, stable).
  std::vector<int64_t> start(size_t(R) + 1, 0);
  std::vector<int64_t> order(static_cast<size_t>(A));
  for (int64_t i = 0; i < A; ++i) ++start[size_t(rows.scatter ? rows.scatter[i] : i) + 1];
  for (int64_t o = 0; o < R; ++o) start[size_t(o) + 1] += start[size_t(o)];
  {
    std::vector<int64_t> fill(start.begin(), start.end() - 1);
    for (int64_t i = 0; i < A; ++i) order[size_t(fill[size_t(rows.scatter ? rows.scatter[i] : i)]++)] = i;
  }
  std::vector<int64_t> touched;
  for (int64_t o = 0; o < R; ++o)
    if (start[size_t(o) + 1] > start[size_t(o)]) touched.push_back(o);
  char* base = static_cast<char*>(out.data);
  const size_t os = dtype_size(out.dtype);
  parallel_for(int64_t(touched.size()), [&](int64_t t0, int64_t t1) {
    std::vector<float> acc(static_cast<size_t>(H));
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t o = touched[size_t(t)];
      char* dst = base + size_t(o * H) * os;
      if (accumulate) convert_to_f32(dst, out.dtype, acc.data(), H);
      else std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t j = start[size_t(o)]; j < start[size_t(o) + 1]; ++j) {
        const int64_t i = order[size_t(j)];
        const float s = rows.scale ? rows.scale[i] : 1.f;
        const float* src = d + i * H;
        for (int64_t h = 0; h < H; ++h) acc[size_t(h)] += s * src[h];
      }
      convert_from_f32(acc.data(), dst, out.dtype, H);
    }
  });
}

}  // namespace

void moe_expert_ffn(const TensorView& x, const QuantMoeExperts& ex, const ExpertRows& rows, const TensorView& out, bool accumulate,
                    const TensorView& x_scale) {
  const char* op = "moe_expert_ffn";
  OT_CHECK(!ex.empty(), op, "experts", "a quantised store with at least one expert", "an empty QuantMoeExperts");
  impl::check_ndim(op, "x", x, 2);
  const bool i8 = x.dtype == DType::i8;
  if (i8) {
    OT_CHECK(ex.activation_quant() == gemm::ActivationQuant::int8_per_token, op, "x",
             "bf16, fp16 or fp32 rows (int8 rows need a W8A8 store)", "int8");
    OT_CHECK(x_scale.defined() && x_scale.dtype == DType::f32 && x_scale.ndim == 1 && x_scale.size(0) == x.size(0) && x_scale.is_contiguous(), op,
             "x_scale", detail::cat("fp32 [", x.size(0), "] (one scale per int8 row)"), x_scale.defined() ? x_scale.shape_str() : "undefined");
  } else {
    impl::check_float(op, "x", x);
    OT_CHECK(!x_scale.defined(), op, "x_scale", "undefined for float rows", x_scale.shape_str());
  }
  OT_CHECK(x.size(1) == ex.hidden() && x.is_contiguous(), op, "x", detail::cat("a contiguous [*, H] with H = ", ex.hidden()), x.shape_str());
  impl::check_out_and_rows(op, out, ex.hidden(), rows, ex.num_experts(), x.size(0));
  const int64_t EL = int64_t(rows.offsets.size()) - 1, A = rows.rows(), H = ex.hidden(), I = ex.intermediate();
  if (A == 0) return;
  // h is stored in x's dtype, as the unquantised path and the reference do (int8 rows: out's).
  const DType hdt = i8 ? out.dtype : x.dtype;
  const size_t xs = dtype_size(x.dtype), hs = dtype_size(hdt);
  char* h = static_cast<char*>(impl::scratch(0, size_t(A * I) * hs));
  float* d = static_cast<float*>(impl::scratch(2, size_t(A * H) * 4));
  std::vector<gemm::QuantGroup> up, down;
  for (int64_t e = 0; e < EL; ++e) {
    const int64_t off = rows.offsets[size_t(e)], M = rows.offsets[size_t(e + 1)] - off;
    if (M == 0) continue;
    gemm::QuantGroup g;
    g.M = M;
    g.a = rows.gather ? x.data : static_cast<const char*>(x.data) + size_t(off * H) * xs;
    g.a_rows = rows.gather ? rows.gather + off : nullptr;
    g.a_dtype = x.dtype;
    g.a_scale = i8 ? x_scale.ptr<float>() : nullptr;
    g.lda = H;
    g.expert = rows.first_expert + e;
    g.c = {h + size_t(off * I) * hs, hdt, I};
    g.act = gemm::Act::swiglu;
    up.push_back(g);
    gemm::QuantGroup dg;
    dg.M = M;
    dg.a = h + size_t(off * I) * hs;
    dg.a_dtype = hdt;
    dg.lda = I;
    dg.expert = g.expert;
    dg.c = {d + off * H, DType::f32, H};
    down.push_back(dg);
  }
  gemm::grouped_gemm_quant(ex.gate_up(), up.data(), int64_t(up.size()));
  gemm::grouped_gemm_quant(ex.down(), down.data(), int64_t(down.size()));
  combine_rows(d, A, H, rows, out, accumulate);
}

MoeFfnResult moe_ffn(const TensorView& x_in, const gemm::PackedB& router, const QuantMoeExperts& ex, const MoeFfnOptions& o) {
  OT_CHECK(!ex.empty(), "moe_ffn", "experts", "a quantised store with at least one expert", "an empty QuantMoeExperts");
  impl::FfnPlan p = impl::plan_ffn(x_in, router.K(), router.N(), ex.hidden(), ex.intermediate(), x_in.dtype, ex.num_experts(), o,
                                   o.shared ? o.shared->hidden() : 0, o.shared ? o.shared->dtype() : DType::f32);
  const QuantMoeExperts* sq = o.shared_quant;
  OT_CHECK(!sq || !o.shared, "moe_ffn", "shared_quant", "null when opt.shared is given (one shared expert)", "both given");
  OT_CHECK(!sq || (!sq->empty() && sq->hidden() == ex.hidden()), "moe_ffn", "shared_quant",
           detail::cat("a quantised store with H = ", ex.hidden()), sq && !sq->empty() ? sq->hidden() : 0);
  impl::FfnExperts run;
  run.intermediate = ex.intermediate();
  run.kernel = [&](int64_t) { return std::string(gemm::quant_kernel_name(ex.format(), ex.activation_quant())); };
  run.run = [&](const TensorView& x, const ExpertRows& rows, const TensorView& acc, const MoeExperts* shared) {
    if (shared) impl::shared_ffn(x, *shared, acc);  // bf16 shared expert on the bf16 engine, then the quantised grouped GEMMs
    if (sq) {  // the quantised shared expert: its expert 0 on every row, weight 1
      ExpertRows all;
      all.offsets = {0, x.size(0)};
      moe_expert_ffn(x, *sq, all, acc, true);
    }
    moe_expert_ffn(x, ex, rows, acc, true);
  };
  return impl::run_ffn(p, x_in, router, o, run);
}

namespace ref {
MoeFfnResult moe_ffn(const TensorView& x, const TensorView& router_weight, const QuantWeightView& gate_up, const QuantWeightView& down,
                     const MoeFfnOptions& o, const TensorView& sg, const TensorView& su, const TensorView& sd, gemm::ActivationQuant aq) {
  const char* op = "moe_ffn";
  const QuantShape a = quant_weight_shape(op, gate_up), b = quant_weight_shape(op, down);
  OT_CHECK(a.N >= 2 && a.N % 2 == 0 && b.G == a.G && b.K == a.N / 2 && b.N == a.K, op, "down",
           "gate_up [E, H, 2I] and down [E, I, H]", "[", a.G, ", ", a.K, ", ", a.N, "], [", b.G, ", ", b.K, ", ", b.N, "]");
  impl::check_ndim(op, "router_weight", router_weight, 2);
  OT_CHECK((!o.shared && !o.shared_quant) || sg.defined(), op, "shared", "the shared expert's unpacked (for shared_quant: dequantised) weights",
           "none");
  const int64_t I = a.N / 2;
  impl::plan_ffn(x, router_weight.size(1), router_weight.size(0), a.K, I, x.dtype, a.G, o, o.shared ? a.K : 0, x.dtype);
  Tensor gu = ot::refimpl::dequantize_weights(gate_up), dn = ot::refimpl::dequantize_weights(down);
  const bool a8 = aq == gemm::ActivationQuant::int8_per_token;
  OT_CHECK(!a8 || gate_up.format == WeightFormat::int8, op, "gate_up", "int8 codes for int8 activations (W8A8)", weight_format_name(gate_up.format));
  const bool shared_a8 = o.shared_quant && o.shared_quant->activation_quant() == gemm::ActivationQuant::int8_per_token;
  return refimpl::moe_ffn(x, router_weight, gu.view().narrow(2, 0, I), gu.view().narrow(2, I, I), dn, o, sg, su, sd, a8, shared_a8);
}
}  // namespace ref

}  // namespace ot::moe
