// Routers, fast path: rows split over threads, each range through the first kernel of
// kRouterKernels that the ISA runs and that applies: the AVX-512 16-tokens-in-lanes kernel
// (router_t16__avx512.cpp: E a multiple of 16 up to 256, no mask), else with AVX2 the
// 8-tokens-in-lanes kernel (router_t8__avx2.cpp) or the row kernel (router__avx2.cpp), else the
// scalar row below, whose top-k is an insertion into a k-long sorted buffer (strict '>' keeps the
// lower expert id on ties).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <memory>

#include "ot/cpu.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "ot/workspace.h"
#include "src/core/kernel_list.h"
#include "src/core/knobs.h"
#include "src/moe/common.h"
#include "src/moe/router_plan.h"
#include "src/ref/moe_router_ref.h"

namespace ot::moe {
namespace impl {

static constexpr float kNegInf = -std::numeric_limits<float>::infinity();

RouterScratch::RouterScratch(const RouterSpec& s) {
  size_t ep = size_t((s.E + 15) / 16 * 16), kp = size_t(std::max<int64_t>(s.k, 16)), g = size_t(s.groups);
  const size_t rows = kRouterBlock;
  stride = int64_t(ep);
  size_t n = (2 * rows + std::max<size_t>(rows, kT16Rows) + kT16Rows) * ep + 2 * ep + g + 3 * kp + 2 * 80 + 9 * 16;  // floats, each piece rounded up to 16
  mem = aligned_alloc64(n * 4);
  float* f = static_cast<float*>(mem);
  auto take = [&](size_t n) { float* p = f; f += (n + 15) / 16 * 16; return p; };
  xr = take(std::max<size_t>(rows, kT16Rows) * ep); sc = take(rows * ep); key = take(rows * ep); key16 = take(kT16Rows * ep); gs = take(g); kv = take(kp); vals = take(kp); cand = take(ep + 80);
  ki = reinterpret_cast<int32_t*>(take(kp));
  cand_id = reinterpret_cast<int32_t*>(take(ep + 80));
  key_E = s.E; key_k = s.k; key_groups = s.groups;
}
RouterScratch::~RouterScratch() { aligned_free(mem); }

RouterScratch& RouterScratch::for_thread(const RouterSpec& s) {
  thread_local std::unique_ptr<RouterScratch> b;
  if (!b || b->key_E != s.E || b->key_k != s.k || b->key_groups != s.groups) b = std::make_unique<RouterScratch>(s);
  return *b;
}

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

void limit_groups(const RouterSpec& s, float* key, float* gscore) {
  int64_t gsz = s.E / s.groups;
  for (int64_t g = 0; g < s.groups; ++g) {
    float a = kNegInf, b = kNegInf;  // best and second best
    for (int64_t e = g * gsz; e < (g + 1) * gsz; ++e) {
      float v = key[e];
      if (v > a) { b = a; a = v; } else if (v > b) b = v;
    }
    gscore[g] = s.group_mode == 0 ? a : a + b;
  }
  keep_groups(s, key, gscore);
}

void keep_groups(const RouterSpec& s, float* key, float* gscore) {
  const int64_t gsz = s.E / s.groups;
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

void write_row(const RouterSpec& s, GatingResult& r, int64_t row, const int32_t* ids, const float* vals) {
  const int64_t k = s.k;
  bool fin = s.finished && s.finished[row];
  int32_t* out = r.expert_idx.ptr<int32_t>() + row * k;
  for (int64_t j = 0; j < k; ++j) out[j] = fin ? int32_t(s.E) : ids[j];
  store_f32(r.y.view(), row * k, vals, k);
  if (s.row_idx) {
    int32_t* p = r.row_idx.ptr<int32_t>() + row * k;
    for (int64_t j = 0; j < k; ++j) p[j] = int32_t(j * s.R + row);
  }
}

bool route_row_scalar(const RouterSpec& s, GatingResult& r, int64_t row, RouterScratch& b) {
  const int64_t E = s.E, k = s.k;
  float *xr = b.xr, *sc = b.sc, *key = b.key, *kv = b.kv, *vals = b.vals;
  load_f32(s.x, row * E, xr, E);
  const uint8_t* al = s.allowed ? s.allowed + row * E : nullptr;
  const bool finite = all_finite(xr, E);
  int64_t allowed = 0;
  if (al) for (int64_t e = 0; e < E; ++e) allowed += al[e] != 0;
  if (!finite || (al && allowed < k)) return false;
  if (s.select != Select::topk_softmax) {
    if (s.sigmoid) {
      for (int64_t e = 0; e < E; ++e) sc[e] = 1.f / (1.f + std::exp(-xr[e]));
    } else {
      float m = kNegInf, sum = 0;
      for (int64_t e = 0; e < E; ++e) if (!al || al[e]) m = std::max(m, xr[e]);
      for (int64_t e = 0; e < E; ++e) { sc[e] = !al || al[e] ? std::exp(xr[e] - m) : 0.f; sum += sc[e]; }
      float inv = 1.f / sum;
      for (int64_t e = 0; e < E; ++e) sc[e] *= inv;
    }
  }
  const bool on_x = select_on_logits(s);
  for (int64_t e = 0; e < E; ++e)
    key[e] = al && !al[e] ? kNegInf : on_x ? xr[e] : sc[e] + (s.bias.empty() ? 0.f : s.bias[size_t(e)]);
  if (limits_groups(s)) limit_groups(s, key, b.gs);
  topk_insert(key, E, k, kv, b.ki);
  if (s.select == Select::topk_softmax) {
    float m = kv[0], sum = 0;
    for (int64_t j = 0; j < k; ++j) { vals[j] = std::exp(kv[j] - m); sum += vals[j]; }
    for (int64_t j = 0; j < k; ++j) vals[j] /= sum;
  } else {
    float sum = 0;
    for (int64_t j = 0; j < k; ++j) {
      int32_t e = b.ki[j];
      vals[j] = !al || al[e] ? sc[e] : 0.f;
      sum += vals[j];
    }
    if (s.select == Select::gating) {
      float mul = s.sigmoid ? s.scale / (sum + s.eps) : s.scale;
      for (int64_t j = 0; j < k; ++j) vals[j] *= mul;
    }
  }
  write_row(s, r, row, b.ki, vals);
  if (s.scores) std::copy(sc, sc + E, r.scores.ptr<float>() + row * E);
  return true;
}

// 0 keeps the AVX2 row kernel where the 8-tokens-in-lanes one applies: the tests run both forms on
// the same shapes, and `ot bench moe_routing --ab moe.router_t8=0,1` compares them.
static knobs::Knob g_router_t8("moe.router_t8", 1, 0, 1, "AVX2 routers: 1 = 8 tokens in lanes where it applies, 0 = the row kernel");

// Rows [r0, r1) of a call; false when some row fails check_rows.
using RouteRows = bool (*)(const RouterSpec& s, GatingResult& r, int64_t r0, int64_t r1, RouterScratch& b);
using RouterKernel = cpu::KernelEntry<RouteRows, RouterSpec>;

static bool rows_scalar(const RouterSpec& s, GatingResult& r, int64_t r0, int64_t r1, RouterScratch& b) {
  bool ok = true;
  for (int64_t row = r0; row < r1; ++row) ok &= route_row_scalar(s, r, row, b);
  return ok;
}
// The vector kernels keep k <= 16 candidates in registers.
static bool small_k(const RouterSpec& s) { return s.k <= 16; }
static bool t8(const RouterSpec& s) { return g_router_t8.get() && t8_applies(s); }

// The AVX2 kernels also take what the AVX-512 one does not (masks, other E, cores without VBMI).
const RouterKernel kRouterKernels[] = {
    {cpu::Isa::avx512, t16_applies, route_rows_t16, "avx512_t16"},
    {cpu::Isa::avx2, t8, route_rows_t8, "avx2_t8"},
    {cpu::Isa::avx2, small_k, route_rows_avx2, "avx2_rows"},
    {cpu::Isa::scalar, nullptr, rows_scalar, "fp32_rows"},
};

static const RouterKernel& router_kernel(const RouterSpec& s) { return cpu::select_kernel("moe router", kRouterKernels, s); }

bool route_fast(const RouterSpec& s, GatingResult& r) {
  const RouteRows rows = router_kernel(s).fn;
  // About 256 KiB of fp32 logits per task: each task's first rows start a new memory stream (not yet
  // prefetched) and pay the kernel's set-up; 16 / 64 KiB tasks were 20-25% / 7-8% slower at 2
  // threads (T 16384: 32 tasks, still enough to balance).
  int64_t chunk = std::max<int64_t>(16, 65536 / std::max<int64_t>(s.E, 1));
  int64_t nt = num_threads();
  // A smaller call splits evenly into tasks of at least 16 Ki logits: waking the second thread costs
  // ~4-5 us, more than routing a few hundred rows (AMD Zen 5 VM, 2 threads, E 128 softmax: T 6
  // 5.2 -> 1.0 us, T 64 7.7 -> 2.9 us; the row kernel, 2x the time a row, breaks even near T 128).
  if (s.R <= chunk * nt) {
    const int64_t tasks = std::clamp<int64_t>(s.R * s.E / 16384, 1, nt);
    chunk = std::max<int64_t>(1, (s.R + tasks - 1) / tasks);
  }
  std::atomic<bool> valid{true};
  parallel_for_dynamic((s.R + chunk - 1) / chunk, 1, [&](int64_t c0, int64_t c1) {
    RouterScratch& b = RouterScratch::for_thread(s);
    if (!rows(s, r, c0 * chunk, std::min(s.R, c1 * chunk), b)) valid.store(false, std::memory_order_relaxed);
  });
  return valid.load();
}

// reference(): the plain router on the caller's arguments (src/ref/moe_router_ref.h).
template <class Reference>
static GatingResult run(const char* op, RouterSpec& s, const TensorView& x, bool force_ref, Reference&& reference) {
  trace::OpScope scope(op);
  if (scope.active())  // the name strings cost ~0.5 us a call (a quarter of a T 1 call) when tracing is off
    scope.kernel(force_ref ? "ref" : router_kernel(s).name)
        .args(x.shape_str())
        .bytes(double(x.nbytes()));
  if (force_ref) {
    check_rows(op, s);
    return reference();
  }
  GatingResult r = alloc_outputs(s, x);
  if (!route_fast(s, r)) {
    check_rows(op, s);  // throws, naming the first bad row or element
    // Every row is valid after all: the vector kernel's finiteness check also trips on finite
    // logits whose scaled exponent overflows fp32 (|x| above ~2.3e38) and left those rows unwritten.
    return reference();
  }
  return r;
}

GatingResult v2_plan_run(const TensorView& x, int64_t k, const TensorView& finished, int renorm, bool output_softmax,
                         const TensorView& allowed, bool force_ref) {
  const char* op = "moe_gating_top_k_softmax_v2";
  OT_CHECK(renorm == 0 || renorm == 1, op, "renorm", "0 or 1", renorm);
  RouterSpec s = plan_softmax(op, x, k, finished, allowed);
  s.select = renorm ? Select::topk_softmax : Select::softmax_topk;
  s.scores = output_softmax && renorm == 0;
  return run(op, s, x, force_ref, [&] { return refimpl::gating_top_k_softmax_v2(x, k, finished, renorm, output_softmax, allowed); });
}
GatingResult v1_plan_run(const TensorView& x, int64_t k, const TensorView& finished, const TensorView& allowed, bool force_ref) {
  RouterSpec s = plan_softmax("moe_gating_top_k_softmax", x, k, finished, allowed);
  s.row_idx = true;
  return run("moe_gating_top_k_softmax", s, x, force_ref, [&] { return refimpl::gating_top_k_softmax(x, k, finished, allowed); });
}
GatingResult gating_plan_run(const TensorView& x, const GatingTopKOptions& opt, bool force_ref) {
  RouterSpec s = plan_gating(x, opt);
  return run("moe_gating_top_k", s, x, force_ref, [&] { return refimpl::gating_top_k(x, opt); });
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
