// gated_delta_net_decode (ot/gdn_layer.h): the decode step of the whole GDN layer as the calls the
// layer makes one by one (in-projection, conv update, recurrent step with fused gates, gated norm,
// out-projection) on views of one projection buffer: no copies between them but z's rows.
#include <cmath>
#include <utility>
#include <vector>

#include "ot/error.h"
#include "ot/gdn.h"
#include "ot/gdn_layer.h"
#include "ot/gemm.h"
#include "ot/numeric.h"
#include "ot/output_pool.h"
#include "ot/trace.h"
#include "src/core/elem_at.h"

namespace ot::gdn {

Tensor gated_delta_net_decode(const TensorView& x, const GdnDecodeLayer& L, const TensorView& conv_state, const TensorView& state) {
  const char* op = "gated_delta_net_decode";
  trace::OpScope scope(op);
  OT_CHECK(L.in_proj && !L.in_proj->empty() && L.out_proj && !L.out_proj->empty(), op, "layer", "packed in_proj and out_proj", "missing");
  const int64_t HK = L.HK, HV = L.HV, DK = L.DK, DV = L.DV;
  OT_CHECK(HK > 0 && HV > 0 && DK > 0 && DV > 0 && HV % HK == 0, op, "layer", "HK, HV, DK, DV > 0 with HV a multiple of HK",
           ::ot::detail::cat(HK, ", ", HV, ", ", DK, ", ", DV));
  const int64_t C = 2 * HK * DK + HV * DV, Np = C + HV * DV + 2 * HV, H = L.in_proj->K();
  OT_CHECK(L.in_proj->N() == Np, op, "in_proj", ::ot::detail::cat("[", Np, ", H] rows (q k v | z | b | a)"), L.in_proj->N());
  OT_CHECK(L.out_proj->K() == HV * DV && L.out_proj->N() == H, op, "out_proj", ::ot::detail::cat("[", H, ", ", HV * DV, "]"),
           ::ot::detail::cat("[", L.out_proj->N(), ", ", L.out_proj->K(), "]"));
  OT_CHECK(x.defined() && x.ndim == 2 && x.sizes[1] == H && x.strides[1] == 1, op, "x", ::ot::detail::cat("[B, ", H, "] rows"),
           x.defined() ? x.shape_str() : "undefined");
  OT_CHECK(x.dtype == L.in_proj->dtype(), op, "x", dtype_name(L.in_proj->dtype()), dtype_name(x.dtype));
  const int64_t B = x.sizes[0];
  OT_CHECK(state.defined() && state.dtype == DType::f32 && state.ndim == 4 && state.sizes[0] == B && state.is_contiguous(), op, "state",
           ::ot::detail::cat("contiguous fp32 [", B, ", ", HV, ", ", DK, ", ", DV, "]"), state.defined() ? state.shape_str() : "undefined");
  // Everything the steps check that could fail after the conv update has written conv_state.
  OT_CHECK(L.conv_weight.defined() && L.conv_weight.ndim == 2 && L.conv_weight.sizes[0] == C, op, "conv_weight",
           ::ot::detail::cat("[", C, ", W]"), L.conv_weight.defined() ? L.conv_weight.shape_str() : "undefined");
  const int64_t W = L.conv_weight.sizes[1];
  OT_CHECK(conv_state.defined() && conv_state.ndim == 3 && conv_state.sizes[0] == B && conv_state.sizes[1] == C && conv_state.sizes[2] == W - 1,
           op, "conv_state", ::ot::detail::cat("[", B, ", ", C, ", ", W - 1, "]"), conv_state.defined() ? conv_state.shape_str() : "undefined");
  for (auto [v, name] : {std::pair{&L.A_log, "A_log"}, {&L.dt_bias, "dt_bias"}})
    OT_CHECK(v->defined() && v->dtype == DType::f32 && v->numel() == HV && v->is_contiguous(), op, name,
             ::ot::detail::cat("contiguous fp32 [", HV, "]"), v->defined() ? v->shape_str() : "undefined");
  OT_CHECK(L.norm_weight.defined() && L.norm_weight.ndim == 1 && L.norm_weight.sizes[0] == DV, op, "norm_weight",
           ::ot::detail::cat("[", DV, "]"), L.norm_weight.defined() ? L.norm_weight.shape_str() : "undefined");
  std::vector<float> row(static_cast<size_t>(H));
  for (int64_t b = 0; b < B; ++b) {
    convert_to_f32(elem_at(x.data, x.dtype, b * x.strides[0]), x.dtype, row.data(), H);
    for (float v : row) OT_CHECK(std::isfinite(v), op, "x", "finite values", ::ot::detail::cat("a non-finite value in row ", b));
  }
  const DType dt = x.dtype;
  Tensor y = pooled_empty(dt, {B, H});
  if (B == 0) return y;
  // The projection [B, Np] and views of its columns.
  Tensor proj = pooled_empty(dt, {B, Np});
  gemm::gemm(B, {x.data, dt, B > 1 ? x.strides[0] : H}, *L.in_proj, {proj.view().data, dt, Np});
  auto cols = [&](int64_t c0, std::vector<int64_t> sizes, std::vector<int64_t> strides) {
    return TensorView(elem_at(proj.view().data, dt, c0), dt, std::move(sizes), std::move(strides));
  };
  CausalConv1dUpdateOptions co;
  co.activation = Activation::silu;
  const Tensor mixed = causal_conv1d_update(cols(0, {B, C}, {Np, 1}), conv_state, L.conv_weight, co);  // [B, C]
  auto part = [&](int64_t c0, int64_t heads, int64_t d) {
    return TensorView(elem_at(mixed.view().data, dt, c0), dt, {B, 1, heads, d}, {C, C, d, 1});
  };
  RecurrentOptions ro;
  ro.use_qk_l2norm_in_kernel = true;
  ro.A_log = L.A_log;
  ro.dt_bias = L.dt_bias;
  ro.beta_sigmoid = true;
  ro.state_cache = state;
  std::vector<int32_t> slots(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) slots[size_t(b)] = int32_t(b);
  ro.state_indices = TensorView(slots.data(), DType::i32, {B});
  const int64_t cz = C, cb = C + HV * DV, ca = cb + HV;
  const RecurrentOut r = recurrent_gated_delta_rule(part(0, HK, DK), part(HK * DK, HK, DK), part(2 * HK * DK, HV, DV),
                                                    cols(ca, {B, 1, HV}, {Np, Np, 1}), cols(cb, {B, 1, HV}, {Np, Np, 1}), ro);
  RmsNormGatedOptions no;
  no.eps = L.eps;
  const Tensor o = rms_norm_gated(r.o.view().reshape({B, HV, DV}), cols(cz, {B, HV, DV}, {Np, DV, 1}), L.norm_weight, no).y;
  gemm::gemm(B, {o.view().data, dt, HV * DV}, *L.out_proj, {y.view().data, dt, H});
  return y;
}

}  // namespace ot::gdn
