// Init routing v1 and v2: validation, fast kernels (counting sort by expert, rows copied or
// quantised in parallel) and the public entry points.
#include <algorithm>
#include <cmath>
#include <limits>

#include "ot/cpu.h"
#include "ot/parallel.h"
#include "ot/quant.h"
#include "ot/trace.h"
#include "src/moe/common.h"
#include "src/moe/routing_plan.h"
#include "src/ref/moe_routing_ref.h"

namespace ot::moe {
namespace impl {

static constexpr int64_t kMaxSortKey = (int64_t(1) << 24) - 1;  // float sort keys upstream

InitV1Plan plan_init_v1(const TensorView& x, const TensorView& row_idx, const TensorView& expert_idx, int64_t active_num) {
  const char* op = "moe_init_routing";
  InitV1Plan p;
  check_ndim(op, "x", x, 2);
  check_float(op, "x", x);
  check_ndim(op, "expert_idx", expert_idx, 2);
  check_ndim(op, "row_idx", row_idx, 2);
  check_dim(op, "expert_idx", expert_idx, 0, x.size(0));
  OT_CHECK(row_idx.shape() == expert_idx.shape(), op, "row_idx", "the shape of expert_idx", row_idx.shape_str(), " vs ",
           expert_idx.shape_str());
  OT_CHECK(active_num >= 0, op, "active_num", ">= 0", active_num);
  p.N = x.size(0); p.H = x.size(1); p.K = expert_idx.size(1);
  check_ids(op, "expert_idx", expert_idx, 0, kMaxSortKey - 1);
  check_ids(op, "row_idx", row_idx, 0, p.N * p.K - 1);
  p.x = contig(x, p.hx); p.row_idx = contig(row_idx, p.hr); p.expert_idx = contig(expert_idx, p.he);
  std::vector<uint8_t> seen(static_cast<size_t>(p.N * p.K), 0);
  for (int64_t j = 0; j < p.N * p.K; ++j) {
    int32_t v = p.row_idx.ptr<int32_t>()[j];
    OT_CHECK(!seen[size_t(v)], op, "row_idx", "a permutation of [0, N*K)", "value ", v, " repeated");
    seen[size_t(v)] = 1;
  }
  p.active_tokens = std::min(p.N, active_num);
  return p;
}

InitRoutingResult alloc_init_v1(const InitV1Plan& p) {
  InitRoutingResult r;
  r.expanded_x = pooled_empty(p.x.dtype, {p.active_tokens * p.K, p.H});
  r.expanded_row_idx = Tensor::empty(DType::i32, {p.N * p.K});
  r.expanded_expert_idx = Tensor::empty(DType::i32, {p.N * p.K});
  return r;
}

void init_v1_fast(const InitV1Plan& p, InitRoutingResult& r) {
  const int32_t* ids = p.expert_idx.ptr<int32_t>();
  const int32_t* rid = p.row_idx.ptr<int32_t>();
  std::vector<int32_t> perm = stable_argsort(ids, p.N * p.K);
  int32_t* eri = r.expanded_row_idx.ptr<int32_t>();
  int32_t* eei = r.expanded_expert_idx.ptr<int32_t>();
  for (size_t i = 0; i < perm.size(); ++i) {
    eri[rid[perm[i]]] = int32_t(i);
    eei[i] = ids[perm[i]];
  }
  size_t es = dtype_size(p.x.dtype), rb = size_t(p.H) * es;
  const int64_t rows = p.active_tokens * p.K;
  const bool stream = stream_output(size_t(rows) * rb);
  char* ex = static_cast<char*>(r.expanded_x.view().data);
  // In token order: output row i holds the pair of row index value v = rid[perm[i]] (token v % N),
  // so token n's rows are eri[k * N + n], k < K. Each x row is read once and written K times (in
  // output order x was fetched K times from far caches or memory; AMD Zen 5 VM, 2026-12-01).
  parallel_for(p.N, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t k = 0; k < p.K; ++k) {
        int64_t i = eri[k * p.N + n];
        if (i < rows) copy_row(ex + size_t(i) * rb, row_ptr(p.x, n, p.H), rb, stream);
      }
    if (stream) stream_fence();
  });
}

InitV2Plan plan_init_v2(const TensorView& x, const TensorView& expert_idx, const InitRoutingV2Options& o) {
  const char* op = "moe_init_routing_v2";
  InitV2Plan p;
  p.o = o;
  check_ndim(op, "x", x, 2);
  check_float(op, "x", x);
  check_ndim(op, "expert_idx", expert_idx, 2);
  check_dtype(op, "expert_idx", expert_idx, DType::i32);
  check_dim(op, "expert_idx", expert_idx, 0, x.size(0));
  p.N = x.size(0); p.H = x.size(1); p.K = expert_idx.size(1);
  OT_CHECK(o.drop_pad_mode == 0 || o.drop_pad_mode == 1, op, "drop_pad_mode", "0 or 1", o.drop_pad_mode);
  OT_CHECK(o.expert_tokens_num_type >= 0 && o.expert_tokens_num_type <= 2, op, "expert_tokens_num_type", "0, 1 or 2", o.expert_tokens_num_type);
  OT_CHECK(o.quant_mode >= -1 && o.quant_mode <= 1, op, "quant_mode", "-1 (none), 0 (static int8) or 1 (dynamic int8)", o.quant_mode);
  OT_CHECK(o.row_idx_type == 0 || o.row_idx_type == 1, op, "row_idx_type", "0 (gather) or 1 (scatter)", o.row_idx_type);
  OT_CHECK(o.active_num >= -1, op, "active_num", ">= -1", o.active_num);
  OT_CHECK(o.expert_num == -1 || (o.expert_num >= 1 && o.expert_num <= 10240), op, "expert_num", "-1 or 1..10240", o.expert_num);
  bool range_given = o.active_expert_range[0] != 0 || o.active_expert_range[1] != 0;
  if (o.expert_num == -1) {
    OT_CHECK(o.drop_pad_mode == 0 && !range_given && o.expert_tokens_num_type != 2, op, "expert_num",
             "given (>= 1) with drop/pad, key_value counts or active_expert_range", o.expert_num);
    check_ids(op, "expert_idx", expert_idx, 0, kMaxSortKey - 1);
    p.x = contig(x, p.hx); p.expert_idx = contig(expert_idx, p.he);
    const int32_t* ids = p.expert_idx.ptr<int32_t>();
    p.E = p.N * p.K > 0 ? *std::max_element(ids, ids + p.N * p.K) + 1 : 0;
  } else {
    p.E = o.expert_num;
    check_ids(op, "expert_idx", expert_idx, 0, p.E);  // == E: finished rows, never routed
    p.x = contig(x, p.hx); p.expert_idx = contig(expert_idx, p.he);
  }
  p.start = range_given ? o.active_expert_range[0] : 0;
  p.end = range_given ? o.active_expert_range[1] : p.E;
  // A given range must be non-empty (the default [0, E) may be empty: no tokens, E derived as 0).
  OT_CHECK(!range_given || (p.start >= 0 && p.start < p.end && p.end <= p.E), op, "active_expert_range",
           detail::cat("0 <= start < end <= expert_num = ", p.E), "[", p.start, ", ", p.end, ")");
  if (o.drop_pad_mode == 1) {
    OT_CHECK(p.start == 0 && p.end == p.E, op, "active_expert_range", "[0, expert_num) in drop/pad mode", "[", p.start, ", ", p.end, ")");
    OT_CHECK(o.expert_capacity >= 1 && o.expert_capacity <= p.N, op, "expert_capacity", detail::cat("1 <= C <= N = ", p.N), o.expert_capacity);
    OT_CHECK(o.row_idx_type == 0, op, "row_idx_type", "0 (gather) in drop/pad mode", o.row_idx_type);
    p.C = o.expert_capacity;
  }
  if (o.quant_mode == 0) {
    OT_CHECK(o.scale.defined() && o.scale.numel() == 1 && o.scale.dtype == DType::f32, op, "scale", "[1] fp32 for static quant",
             o.scale.defined() ? o.scale.shape_str() : "none");
    OT_CHECK(!o.offset.defined() || (o.offset.numel() == 1 && o.offset.dtype == DType::f32), op, "offset", "[1] fp32", o.offset.shape_str());
    p.scale = InitV2Plan::Scale::static_q;
    p.static_scale = float(get_as_double(o.scale, 0));
    p.static_offset = o.offset.defined() ? float(get_as_double(o.offset, 0)) : 0.f;
  } else if (o.scale.defined()) {
    check_dtype(op, "scale", o.scale, DType::f32);
    if (o.quant_mode == 1) {
      bool one = o.scale.ndim == 2 && o.scale.size(0) == 1 && o.scale.size(1) == p.H;
      bool per_e = o.scale.ndim == 2 && o.scale.size(0) == p.end - p.start && o.scale.size(1) == p.H;
      OT_CHECK(one || per_e, op, "scale", detail::cat("[1, H] or [end - start, H] = [", p.end - p.start, ", ", p.H, "]"), o.scale.shape_str());
      p.scale = one ? InitV2Plan::Scale::smooth_one : InitV2Plan::Scale::smooth_expert;
    } else {
      OT_CHECK(o.scale.ndim == 1 && o.scale.size(0) == p.N, op, "scale", detail::cat("[N] = [", p.N, "] per-token scale"), o.scale.shape_str());
      p.scale = InitV2Plan::Scale::per_token;
    }
    p.smooth = contig(o.scale, p.hs);
  }
  OT_CHECK(o.quant_mode == 0 || !o.offset.defined(), op, "offset", "only with quant_mode 0 (static)", o.offset.shape_str());
  return p;
}

// Writes expanded row `i` (from token n, sorted expert e) into dst (quantised when asked).
// stream: see copy_row.
static void emit_row(const InitV2Plan& p, int64_t n, int64_t e, char* dst, float* scale_out, float* buf, bool stream) {
  if (p.o.quant_mode < 0) {
    copy_row(dst, row_ptr(p.x, n, p.H), size_t(p.H) * dtype_size(p.x.dtype), stream);
    if (scale_out && p.scale == InitV2Plan::Scale::per_token) *scale_out = p.smooth.ptr<float>()[n];
    return;
  }
  load_f32(p.x, n * p.H, buf, p.H);
  int8_t* q = reinterpret_cast<int8_t*>(dst);
  if (p.o.quant_mode == 0) {
    for (int64_t h = 0; h < p.H; ++h) q[h] = quant_i8(buf[h] * p.static_scale + p.static_offset);
    return;
  }
  if (p.scale == InitV2Plan::Scale::smooth_one || p.scale == InitV2Plan::Scale::smooth_expert) {
    const float* sm = p.smooth.ptr<float>() + (p.scale == InitV2Plan::Scale::smooth_one ? 0 : (e - p.start) * p.H);
    for (int64_t h = 0; h < p.H; ++h) buf[h] *= sm[h];
  }
  *scale_out = quantize_row_i8_dynamic(buf, p.H, q);
}

InitRoutingV2Result init_v2_fast(const InitV2Plan& p) {
  const int64_t NK = p.N * p.K, ER = p.end - p.start;
  const int32_t* ids = p.expert_idx.ptr<int32_t>();
  // Dense keys: experts of the range first (0..ER-1), everything else in one bucket ER.
  std::vector<int32_t> key(static_cast<size_t>(NK));
  for (int64_t j = 0; j < NK; ++j) key[size_t(j)] = ids[j] >= p.start && ids[j] < p.end ? int32_t(ids[j] - p.start) : int32_t(ER);
  std::vector<int32_t> perm = stable_argsort(key.data(), NK);
  std::vector<int64_t> counts(static_cast<size_t>(ER), 0);
  for (int64_t j = 0; j < NK; ++j) if (key[size_t(j)] < ER) ++counts[size_t(key[size_t(j)])];
  InitRoutingV2Result r;
  for (int64_t c : counts) r.available += c;
  DType xt = p.o.quant_mode >= 0 ? DType::i8 : p.x.dtype;
  bool want_scale = p.o.quant_mode == 1 || p.scale == InitV2Plan::Scale::per_token;
  r.expanded_row_idx = Tensor::empty(DType::i32, {NK});
  int32_t* eri = r.expanded_row_idx.ptr<int32_t>();
  std::vector<int32_t> dst(static_cast<size_t>(NK), -1);  // expanded row of sorted position i (-1: none)
  int64_t out_rows;
  if (p.o.drop_pad_mode == 1) {
    out_rows = p.E * p.C;
    std::vector<int64_t> slot(static_cast<size_t>(p.E), 0);
    for (int64_t i = 0; i < r.available; ++i) {
      int64_t e = key[size_t(perm[size_t(i)])];
      if (slot[size_t(e)] < p.C) dst[size_t(i)] = int32_t(e * p.C + slot[size_t(e)]++);
      else ++r.dropped;
    }
    r.expanded_x = Tensor::zeros(xt, {p.E, p.C, p.H});
    if (want_scale) r.expanded_scale = Tensor::zeros(DType::f32, {out_rows});
    r.expert_tokens = Tensor::empty(DType::i64, {p.E});
    std::copy(counts.begin(), counts.end(), r.expert_tokens.ptr<int64_t>());
  } else {
    out_rows = p.o.active_num > 0 ? std::min(p.o.active_num, r.available) : r.available;
    r.dropped = r.available - out_rows;
    for (int64_t i = 0; i < out_rows; ++i) dst[size_t(i)] = int32_t(i);
    r.expanded_x = pooled_empty(xt, {out_rows, p.H});
    if (want_scale) r.expanded_scale = Tensor::empty(DType::f32, {out_rows});
    if (p.o.expert_tokens_num_type == 2) {
      r.expert_tokens = Tensor::zeros(DType::i64, {p.E, 2});
      int64_t* kv = r.expert_tokens.ptr<int64_t>();
      for (int64_t e = 0, n = 0; e < ER; ++e)
        if (counts[size_t(e)] > 0) { kv[2 * n] = e + p.start; kv[2 * n + 1] = counts[size_t(e)]; ++n; }
    } else {
      r.expert_tokens = Tensor::empty(DType::i64, {ER});
      int64_t* c = r.expert_tokens.ptr<int64_t>();
      for (int64_t e = 0, run = 0; e < ER; ++e) { run += counts[size_t(e)]; c[e] = p.o.expert_tokens_num_type == 0 ? run : counts[size_t(e)]; }
    }
  }
  // Index maps.
  if (p.o.row_idx_type == 0) {
    std::fill(eri, eri + NK, -1);
    for (int64_t i = 0; i < r.available; ++i)
      eri[perm[size_t(i)]] = p.o.drop_pad_mode == 1 ? dst[size_t(i)] : int32_t(i);
  } else {
    for (int64_t i = 0; i < NK; ++i) eri[i] = i < r.available ? perm[size_t(i)] : -1;
  }
  // Rows, in parallel over sorted positions.
  size_t rb = size_t(p.H) * dtype_size(xt);
  char* ex = static_cast<char*>(r.expanded_x.view().data);
  float* es = want_scale ? r.expanded_scale.ptr<float>() : nullptr;
  const bool stream = stream_output(size_t(out_rows) * rb);
  // Rows in token order (each x row read once, written to its K places; see init_v1_fast).
  std::vector<int32_t> out_row(static_cast<size_t>(NK), -1);  // expanded row of pair j (-1: none)
  for (int64_t i = 0; i < r.available; ++i) out_row[size_t(perm[size_t(i)])] = dst[size_t(i)];
  parallel_for(p.N, [&](int64_t n0, int64_t n1) {
    std::vector<float> buf(static_cast<size_t>(p.H));
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t j = n * p.K; j < (n + 1) * p.K; ++j) {
        int32_t d = out_row[size_t(j)];
        if (d >= 0) emit_row(p, n, key[size_t(j)] + p.start, ex + size_t(d) * rb, es ? es + d : nullptr, buf.data(), stream);
      }
    if (stream) stream_fence();
  });
  return r;
}

static InitRoutingV2Result init_v2_run(const TensorView& x, const TensorView& expert_idx, const InitRoutingV2Options& o, bool ref) {
  InitV2Plan p = plan_init_v2(x, expert_idx, o);
  trace::OpScope scope("moe_init_routing_v2");
  if (scope.active()) scope.kernel(ref ? "ref" : "counting_sort").args(x.shape_str() + " K=" + std::to_string(p.K));
  scope.bytes(2.0 * double(x.nbytes()) * double(p.K));
  return ref ? refimpl::init_routing_v2(x, expert_idx, o) : init_v2_fast(p);
}

static InitRoutingResult init_v1_run(const TensorView& x, const TensorView& row_idx, const TensorView& expert_idx, int64_t active_num, bool ref) {
  InitV1Plan p = plan_init_v1(x, row_idx, expert_idx, active_num);
  trace::OpScope scope("moe_init_routing");
  if (scope.active()) scope.kernel(ref ? "ref" : "counting_sort").args(x.shape_str() + " K=" + std::to_string(p.K));
  scope.bytes(2.0 * double(x.nbytes()) * double(p.K));
  if (ref) return refimpl::init_routing(x, row_idx, expert_idx, active_num);
  InitRoutingResult r = alloc_init_v1(p);
  init_v1_fast(p, r);
  return r;
}

}  // namespace impl

InitRoutingResult moe_init_routing(const TensorView& x, const TensorView& row_idx, const TensorView& expert_idx, int64_t active_num) {
  return impl::init_v1_run(x, row_idx, expert_idx, active_num, cpu::force_ref());
}
InitRoutingV2Result moe_init_routing_v2(const TensorView& x, const TensorView& expert_idx, const InitRoutingV2Options& o) {
  return impl::init_v2_run(x, expert_idx, o, cpu::force_ref());
}
namespace ref {
InitRoutingResult moe_init_routing(const TensorView& x, const TensorView& row_idx, const TensorView& expert_idx, int64_t active_num) {
  return impl::init_v1_run(x, row_idx, expert_idx, active_num, true);
}
InitRoutingV2Result moe_init_routing_v2(const TensorView& x, const TensorView& expert_idx, const InitRoutingV2Options& o) {
  return impl::init_v2_run(x, expert_idx, o, true);
}
}  // namespace ref

}  // namespace ot::moe
