// Routers, fast path: one pass per token row in fp32, rows split over threads; top-k by insertion
// into a k-long sorted buffer (strict '>' keeps the lower expert id on ties).
#include <algorithm>
#include <cmath>
#include <limits>

#include "ot/cpu.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "src/moe/common.h"
#include "src/moe/router_plan.h"

namespace ot::moe {
namespace impl {

static constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Keeps the k largest (value, id) pairs, descending; equal values keep the earlier (lower) id first.
static void topk_insert(const float* key, int64_t E, int64_t k, float* kv, int32_t* ki) {
  int64_t n = 0;
  for (int64_t e = 0; e < E; ++e) {
    float v = key[e];
    if (n == k && !(v > kv[k - 1])) continue;
    int64_t pos = n < k ? n : k - 1;
    while (pos > 0 && v > kv[pos - 1]) { kv[pos] = kv[pos - 1]; ki[pos] = ki[pos - 1]; --pos; }
    kv[pos] = v;
    ki[pos] = int32_t(e);
    if (n < k) ++n;
  }
}

// Masks every expert outside the k_group best groups (group score: max, or sum of the top 2).
static void limit_groups(const RouterSpec& s, float* key, float* gscore) {
  if (s.groups <= 1 || s.k_group >= s.groups) return;
  int64_t gsz = s.E / s.groups;
  for (int64_t g = 0; g < s.groups; ++g) {
    float a = kNegInf, b = kNegInf;  // best and second best
    for (int64_t e = g * gsz; e < (g + 1) * gsz; ++e) {
      float v = key[e];
      if (v > a) { b = a; a = v; } else if (v > b) b = v;
    }
    gscore[g] = s.group_mode == 0 ? a : a + b;
  }
  for (int64_t kept = 0; kept < s.k_group; ++kept) {  // mark chosen groups with +inf-like sentinel
    int64_t best = -1;
    for (int64_t g = 0; g < s.groups; ++g)
      if (!std::isnan(gscore[g]) && (best < 0 || gscore[g] > gscore[best])) best = g;
    gscore[best] = std::numeric_limits<float>::quiet_NaN();  // taken
  }
  for (int64_t g = 0; g < s.groups; ++g)
    if (!std::isnan(gscore[g]))
      for (int64_t e = g * gsz; e < (g + 1) * gsz; ++e) key[e] = kNegInf;
}

void route_fast(const RouterSpec& s, GatingResult& r) {
  const int64_t E = s.E, k = s.k;
  parallel_for(s.R, [&](int64_t r0, int64_t r1) {
    std::vector<float> xr(static_cast<size_t>(E)), sc(static_cast<size_t>(E)), key(static_cast<size_t>(E));
    std::vector<float> gs(static_cast<size_t>(s.groups)), kv(static_cast<size_t>(k)), vals(static_cast<size_t>(k));
    std::vector<int32_t> ki(static_cast<size_t>(k));
    for (int64_t row = r0; row < r1; ++row) {
      load_f32(s.x, row * E, xr.data(), E);
      const uint8_t* al = s.allowed ? s.allowed + row * E : nullptr;
      if (s.select == Select::topk_softmax) {
        for (int64_t e = 0; e < E; ++e) key[size_t(e)] = !al || al[e] ? xr[size_t(e)] : kNegInf;
      } else {
        if (s.sigmoid) {
          for (int64_t e = 0; e < E; ++e) sc[size_t(e)] = 1.f / (1.f + std::exp(-xr[size_t(e)]));
        } else {
          float m = kNegInf, sum = 0;
          for (int64_t e = 0; e < E; ++e) if (!al || al[e]) m = std::max(m, xr[size_t(e)]);
          for (int64_t e = 0; e < E; ++e) { sc[size_t(e)] = !al || al[e] ? std::exp(xr[size_t(e)] - m) : 0.f; sum += sc[size_t(e)]; }
          float inv = 1.f / sum;
          for (int64_t e = 0; e < E; ++e) sc[size_t(e)] *= inv;
        }
        for (int64_t e = 0; e < E; ++e)
          key[size_t(e)] = !al || al[e] ? sc[size_t(e)] + (s.bias.empty() ? 0.f : s.bias[size_t(e)]) : kNegInf;
        if (s.select == Select::gating) limit_groups(s, key.data(), gs.data());
      }
      topk_insert(key.data(), E, k, kv.data(), ki.data());
      if (s.select == Select::topk_softmax) {
        float m = kv[0], sum = 0;
        for (int64_t j = 0; j < k; ++j) { vals[size_t(j)] = std::exp(kv[size_t(j)] - m); sum += vals[size_t(j)]; }
        for (int64_t j = 0; j < k; ++j) vals[size_t(j)] /= sum;
      } else {
        float sum = 0;
        for (int64_t j = 0; j < k; ++j) {
          int32_t e = ki[size_t(j)];
          vals[size_t(j)] = !al || al[e] ? sc[size_t(e)] : 0.f;
          sum += vals[size_t(j)];
        }
        if (s.select == Select::gating) {
          float mul = s.sigmoid ? s.scale / (sum + s.eps) : s.scale;
          for (int64_t j = 0; j < k; ++j) vals[size_t(j)] *= mul;
        }
      }
      bool fin = s.finished && s.finished[row];
      int32_t* ids = r.expert_idx.ptr<int32_t>() + row * k;
      for (int64_t j = 0; j < k; ++j) ids[j] = fin ? int32_t(E) : ki[size_t(j)];
      store_f32(r.y.view(), row * k, vals.data(), k);
      if (s.scores) std::copy(sc.begin(), sc.end(), r.scores.ptr<float>() + row * E);
    }
  });
}

static GatingResult run(const char* op, RouterSpec& s, const TensorView& x, bool force_ref) {
  trace::OpScope scope(op);
  scope.kernel(force_ref ? "ref" : "fp32_rows").args(x.shape_str()).bytes(double(x.nbytes()));
  GatingResult r = alloc_outputs(s, x);
  if (force_ref) route_ref(s, r); else route_fast(s, r);
  fill_row_idx(s, r);
  return r;
}

GatingResult v2_plan_run(const TensorView& x, int64_t k, const TensorView& finished, int renorm, bool output_softmax,
                         const TensorView& allowed, bool force_ref) {
  const char* op = "moe_gating_top_k_softmax_v2";
  OT_CHECK(renorm == 0 || renorm == 1, op, "renorm", "0 or 1", renorm);
  RouterSpec s = plan_softmax(op, x, k, finished, allowed);
  s.select = renorm ? Select::topk_softmax : Select::softmax_topk;
  s.scores = output_softmax && renorm == 0;
  return run(op, s, x, force_ref);
}
GatingResult v1_plan_run(const TensorView& x, int64_t k, const TensorView& finished, const TensorView& allowed, bool force_ref) {
  RouterSpec s = plan_softmax("moe_gating_top_k_softmax", x, k, finished, allowed);
  s.row_idx = true;
  return run("moe_gating_top_k_softmax", s, x, force_ref);
}
GatingResult gating_plan_run(const TensorView& x, const GatingTopKOptions& opt, bool force_ref) {
  RouterSpec s = plan_gating(x, opt);
  return run("moe_gating_top_k", s, x, force_ref);
}

}  // namespace impl

GatingResult moe_gating_top_k_softmax(const TensorView& x, int64_t k, const TensorView& finished, const TensorView& allowed) {
  return impl::v1_plan_run(x, k, finished, allowed, cpu::force_ref());
}
GatingResult moe_gating_top_k_softmax_v2(const TensorView& x, int64_t k, const TensorView& finished, int renorm, bool output_softmax,
                                         const TensorView& allowed) {
  return impl::v2_plan_run(x, k, finished, renorm, output_softmax, allowed, cpu::force_ref());
}
GatingResult moe_gating_top_k(const TensorView& x, const GatingTopKOptions& opt) {
  return impl::gating_plan_run(x, opt, cpu::force_ref());
}

namespace ref {
GatingResult moe_gating_top_k_softmax(const TensorView& x, int64_t k, const TensorView& finished, const TensorView& allowed) {
  return impl::v1_plan_run(x, k, finished, allowed, true);
}
GatingResult moe_gating_top_k_softmax_v2(const TensorView& x, int64_t k, const TensorView& finished, int renorm, bool output_softmax,
                                         const TensorView& allowed) {
  return impl::v2_plan_run(x, k, finished, renorm, output_softmax, allowed, true);
}
GatingResult moe_gating_top_k(const TensorView& x, const GatingTopKOptions& opt) { return impl::gating_plan_run(x, opt, true); }
}  // namespace ref

}  // namespace ot::moe
