#include "src/moe/router_plan.h"

#include <algorithm>

#include "src/moe/common.h"

namespace ot::moe::impl {

static void plan_common(RouterSpec& s, const char* op, const TensorView& x, int64_t k, const TensorView& allowed) {
  check_float(op, "x", x);
  OT_CHECK(x.ndim >= 1, op, "x", "[.., E]", x.shape_str());
  s.E = x.size(-1);
  s.R = s.E > 0 ? x.numel() / s.E : 0;
  OT_CHECK(s.E >= 1, op, "x", "at least one expert (E >= 1)", x.shape_str());
  OT_CHECK(k >= 1 && k <= s.E && k <= 1024, op, "k", detail::cat("1 <= k <= min(E, 1024) with E = ", s.E), k);
  s.k = k;
  s.x = contig(x, s.hold_x);  // finiteness: checked by the executors (see RouterSpec::x)
  if (allowed.defined()) {
    check_dtype(op, "allowed", allowed, DType::u8);
    OT_CHECK(allowed.shape() == x.shape(), op, "allowed", "the shape of x", allowed.shape_str(), " vs ", x.shape_str());
    TensorView a = contig(allowed, s.hold_allowed);
    s.allowed = a.ptr<uint8_t>();  // rows allowing >= k experts: checked like x (see RouterSpec::x)
  }
}

void check_rows(const char* op, const RouterSpec& s) {
  check_finite(op, "x", s.x);
  if (!s.allowed) return;
  for (int64_t r = 0; r < s.R; ++r) {
    int64_t n = 0;
    for (int64_t e = 0; e < s.E; ++e) n += s.allowed[r * s.E + e] != 0;
    OT_CHECK(n >= s.k, op, "allowed", detail::cat("at least k = ", s.k, " allowed experts per token"), n, " in row ", r);
  }
}

RouterSpec plan_softmax(const char* op, const TensorView& x, int64_t k, const TensorView& finished, const TensorView& allowed) {
  RouterSpec s;
  OT_CHECK(x.ndim == 2 || x.ndim == 3, op, "x", "[T, E] or [B, S, E]", x.shape_str());
  plan_common(s, op, x, k, allowed);
  if (finished.defined()) {
    check_dtype(op, "finished", finished, DType::u8);
    std::vector<int64_t> want(x.sizes, x.sizes + x.ndim - 1);
    OT_CHECK(finished.shape() == want, op, "finished", "x.shape[:-1]", finished.shape_str());
    s.finished = contig(finished, s.hold_fin).ptr<uint8_t>();
  }
  return s;
}

RouterSpec plan_gating(const TensorView& x, const GatingTopKOptions& o) {
  const char* op = "moe_gating_top_k";
  RouterSpec s;
  s.select = Select::gating;
  OT_CHECK(x.ndim == 2, op, "x", "[T, E]", x.shape_str());
  plan_common(s, op, x, o.k, o.allowed);
  OT_CHECK(s.E <= 2048, op, "x", "E <= 2048", s.E);
  OT_CHECK(o.group_count >= 1 && s.E % o.group_count == 0, op, "group_count", detail::cat("a divisor of E = ", s.E), o.group_count);
  OT_CHECK(o.k_group >= 1 && o.k_group <= o.group_count, op, "k_group", detail::cat("1 <= k_group <= group_count = ", o.group_count), o.k_group);
  OT_CHECK(o.group_select_mode == 0 || o.group_select_mode == 1, op, "group_select_mode", "0 (max) or 1 (top-2 sum)", o.group_select_mode);
  OT_CHECK(o.group_select_mode == 0 || s.E / o.group_count >= 2, op, "group_count", "at least 2 experts per group with group_select_mode 1",
           s.E / o.group_count);
  OT_CHECK(o.k <= o.k_group * (s.E / o.group_count), op, "k", "k <= k_group * E / group_count", o.k);
  OT_CHECK(o.norm_type == 0 || o.norm_type == 1, op, "norm_type", "0 (softmax) or 1 (sigmoid)", o.norm_type);
  OT_CHECK(o.renorm == 0, op, "renorm", "0 (the only mode upstream supports)", o.renorm);
  OT_CHECK(std::isfinite(o.routed_scaling_factor), op, "routed_scaling_factor", "a finite number", o.routed_scaling_factor);
  OT_CHECK(o.eps >= 0, op, "eps", ">= 0", o.eps);
  if (o.bias.defined()) {
    check_float(op, "bias", o.bias);
    OT_CHECK(o.bias.ndim == 1 && o.bias.size(0) == s.E, op, "bias", detail::cat("[E] = [", s.E, "]"), o.bias.shape_str());
    // One vector conversion (a strided bias is copied first; bf16 / fp16 Inf and NaN stay
    // non-finite in fp32), not a dtype switch per element: ~1 us a call at E 256.
    s.bias.resize(size_t(s.E));
    Tensor hold;
    load_f32(contig(o.bias, hold), 0, s.bias.data(), s.E);
    if (!all_finite(s.bias.data(), s.E)) check_finite(op, "bias", o.bias);  // throws, naming the index
  }
  s.sigmoid = o.norm_type == 1;
  s.groups = o.group_count;
  s.k_group = o.k_group;
  s.group_mode = o.group_select_mode;
  s.scale = o.routed_scaling_factor;
  s.eps = o.eps;
  s.scores = o.out_flag;
  return s;
}

GatingResult alloc_outputs(const RouterSpec& s, const TensorView& x) {
  GatingResult r;
  std::vector<int64_t> shape(x.sizes, x.sizes + x.ndim);
  std::vector<int64_t> kshape = shape;
  kshape.back() = s.k;
  Tensor* out[4] = {&r.y, &r.expert_idx, s.row_idx ? &r.row_idx : nullptr, s.scores ? &r.scores : nullptr};
  TensorView v[4] = {TensorView(nullptr, x.dtype, kshape), TensorView(nullptr, DType::i32, kshape), TensorView(nullptr, DType::i32, kshape),
                     TensorView(nullptr, DType::f32, shape)};
  size_t off[4], total = 0;
  for (int i = 0; i < 4; ++i) {
    off[i] = total;
    if (out[i]) total += (v[i].nbytes() + 63) / 64 * 64;
  }
  // Small calls (decode steps) take one allocation for all outputs, which share it: at T 1 the
  // three aligned_allocs and their frees were ~1/3 of a call's instructions. Large outputs keep a
  // buffer each (a caller keeping only the ids does not hold the rest).
  if (total > 16384) {
    for (int i = 0; i < 4; ++i)
      if (out[i]) *out[i] = Tensor::empty(v[i].dtype, v[i].shape());
    return r;
  }
  Tensor buf = Tensor::empty(DType::u8, {int64_t(std::max<size_t>(total, 1))});
  for (int i = 0; i < 4; ++i)
    if (out[i]) {
      v[i].data = buf.ptr<char>() + off[i];
      *out[i] = Tensor::from_storage(buf.storage(), v[i]);
    }
  return r;
}

}  // namespace ot::moe::impl
