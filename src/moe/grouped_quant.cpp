// grouped_matmul on weight-only quantised experts (ot/moe/grouped.h): validation through the
// plain grouped matmul's plan, then ot::gemm::grouped_gemm_quant; the reference dequantises.
#include "ot/cpu.h"
#include "ot/trace.h"
#include "src/moe/common.h"
#include "src/moe/grouped_plan.h"
#include "src/ref/moe_grouped_ref.h"
#include "src/ref/quant_ref.h"

namespace ot::moe {

namespace {

constexpr const char* kOp = "grouped_matmul";

Tensor run_packed(const impl::GmmPlan& p, const gemm::PackedQuantB& w) {
  Tensor y = pooled_empty(p.x.dtype, {p.M, p.n_out});
  std::vector<gemm::QuantGroup> groups;
  const size_t xs = dtype_size(p.x.dtype), ys = dtype_size(p.x.dtype);
  for (const GroupSpan& s : p.spans) {
    gemm::QuantGroup g;
    g.M = s.count;
    g.a = static_cast<const char*>(p.x.data) + size_t(s.offset * p.K) * xs;
    g.a_dtype = p.x.dtype;
    g.lda = p.K;
    g.expert = s.group;
    g.c = {static_cast<char*>(y.view().data) + size_t(s.offset * p.n_out) * ys, p.x.dtype, p.n_out};
    g.bias = p.bias.empty() ? nullptr : p.bias.data() + s.group * p.N;
    g.act = p.act;
    groups.push_back(g);
  }
  gemm::grouped_gemm_quant(w, groups.data(), int64_t(groups.size()));
  return y;
}

std::string args_of(const TensorView& x, WeightFormat f, int64_t gs, bool offset, int64_t G, int64_t K, int64_t N, gemm::ActivationQuant aq) {
  return detail::cat(x.shape_str(), " x ", weight_format_name(f), offset ? " asym" : " sym", gs ? " g" : " per-channel", gs ? std::to_string(gs) : "",
                     " [", G, ", ", K, ", ", N, "]", aq == gemm::ActivationQuant::int8_per_token ? " a8" : "");
}

Tensor view_entry(const TensorView& x, const QuantWeightView& w, const TensorView& gl, GroupListType type, const TensorView& bias, gemm::Act act,
                  gemm::ActivationQuant aq, bool ref) {
  const QuantShape sh = quant_weight_shape(kOp, w);
  const bool a8 = aq == gemm::ActivationQuant::int8_per_token;
  OT_CHECK(!a8 || w.format == WeightFormat::int8, kOp, "weight", "int8 codes for int8 activations (W8A8)", weight_format_name(w.format));
  impl::GmmPlan p = impl::plan_gmm(kOp, x, sh.G, sh.K, sh.N, x.dtype, gl, type, bias, act);
  trace::OpScope scope(kOp);
  if (scope.active())
    scope.kernel(ref ? "ref" : gemm::quant_kernel_name(w.format, aq)).args(args_of(x, w.format, w.group_size, w.offset.defined(), sh.G, sh.K, sh.N, aq));
  scope.flops(2.0 * double(p.M) * double(p.K) * double(p.N));
  if (ref) {
    Tensor wd = ot::refimpl::dequantize_weights(w);
    if (!a8) return refimpl::grouped_matmul(x, wd, gl, type, bias, act);
    Tensor xq = ot::refimpl::quantize_dequantize_rows_i8(x);
    Tensor y = refimpl::grouped_matmul(xq, wd, gl, type, bias, act);  // fp32, then x's dtype
    Tensor out = Tensor::empty(x.dtype, y.shape());
    copy_into(y.view(), out.view());
    return out;
  }
  return run_packed(p, gemm::prepack_quantized(w, aq));
}

}  // namespace

Tensor grouped_matmul(const TensorView& x, const QuantWeightView& w, const TensorView& gl, GroupListType type, const TensorView& bias, gemm::Act act,
                      gemm::ActivationQuant aq) {
  return view_entry(x, w, gl, type, bias, act, aq, cpu::force_ref());
}

Tensor grouped_matmul(const TensorView& x, const gemm::PackedQuantB& w, const TensorView& gl, GroupListType type, const TensorView& bias,
                      gemm::Act act) {
  OT_CHECK(!w.empty(), kOp, "weight", "prepacked quantised weights", "empty PackedQuantB");
  impl::GmmPlan p = impl::plan_gmm(kOp, x, w.G(), w.K(), w.N(), x.dtype, gl, type, bias, act);
  trace::OpScope scope(kOp);
  if (scope.active())
    scope.kernel(gemm::quant_kernel_name(w.format(), w.activation_quant()))
        .args(args_of(x, w.format(), w.group_size(), w.has_offset(), w.G(), w.K(), w.N(), w.activation_quant()));
  scope.flops(2.0 * double(p.M) * double(p.K) * double(p.N));
  return run_packed(p, w);
}

namespace ref {
Tensor grouped_matmul(const TensorView& x, const QuantWeightView& w, const TensorView& gl, GroupListType type, const TensorView& bias, gemm::Act act,
                      gemm::ActivationQuant aq) {
  return view_entry(x, w, gl, type, bias, act, aq, true);
}
}  // namespace ref

}  // namespace ot::moe
