// Megatron-style permute / unpermute, re-routing and expert token counts: validation, fast
// kernels (counting sort, rows copied in parallel, unpermute accumulated per token in fp32).
#include <algorithm>

#include "ot/cpu.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "src/moe/common.h"
#include "src/moe/routing_plan.h"
#include "src/ref/moe_routing_ref.h"

namespace ot::moe {
namespace impl {

static constexpr int64_t kMaxSortKey = (int64_t(1) << 24) - 1;

PermutePlan plan_permute(const TensorView& tokens, const TensorView& indices, int64_t num_out_tokens, bool padded) {
  const char* op = "moe_token_permute";
  PermutePlan p;
  check_ndim(op, "tokens", tokens, 2);
  OT_CHECK(is_float(tokens.dtype) || tokens.dtype == DType::i8, op, "tokens", "bf16, fp16, fp32 or int8", dtype_name(tokens.dtype));
  check_dtype(op, "indices", indices, DType::i32);
  p.T = tokens.size(0); p.H = tokens.size(1); p.padded = padded;
  if (padded) {
    check_ndim(op, "indices", indices, 2);
    p.experts = indices.size(0); p.cap = indices.size(1);
    check_ids(op, "indices", indices, 0, p.T - 1);
    p.rows = p.experts * p.cap;
  } else {
    OT_CHECK(indices.ndim == 1 || indices.ndim == 2, op, "indices", "[T, K] or [T]", indices.shape_str());
    check_dim(op, "indices", indices, 0, p.T);
    p.K = indices.ndim == 2 ? indices.size(1) : 1;
    OT_CHECK(p.K <= 1024, op, "indices", "K <= 1024", p.K);
    check_ids(op, "indices", indices, 0, kMaxSortKey - 1);
    int64_t n = p.T * p.K;
    p.rows = num_out_tokens == 0 ? n : (num_out_tokens > 0 ? std::min(num_out_tokens, n) : std::max<int64_t>(0, n + num_out_tokens));
  }
  p.tokens = contig(tokens, p.ht);
  p.indices = contig(indices, p.hi);
  return p;
}

void permute_fast(const PermutePlan& p, TokenPermuteResult& r) {
  const int32_t* idx = p.indices.ptr<int32_t>();
  int32_t* si = r.sorted_indices.ptr<int32_t>();
  if (p.padded) {
    std::copy(idx, idx + p.rows, si);
  } else {
    std::vector<int32_t> perm = stable_argsort(idx, p.T * p.K);
    for (size_t i = 0; i < perm.size(); ++i) si[perm[i]] = int32_t(i);
  }
  size_t rb = size_t(p.H) * dtype_size(p.tokens.dtype);
  char* out = static_cast<char*>(r.permuted_tokens.view().data);
  const bool stream = stream_output(size_t(p.rows) * rb);
  if (!p.padded) {
    // In token order: token t's rows are si[t * K + k] (the first p.rows are kept); each token row
    // is read once and written K times (see init_v1_fast).
    parallel_for(p.T, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t)
        for (int64_t j = t * p.K; j < (t + 1) * p.K; ++j)
          if (si[j] < p.rows) copy_row(out + size_t(si[j]) * rb, row_ptr(p.tokens, t, p.H), rb, stream);
      if (stream) stream_fence();
    });
    return;
  }
  parallel_for(p.rows, [&](int64_t i0, int64_t i1) {  // padded: row i is token idx[i] (tokens may repeat), in output order
    for (int64_t i = i0; i < i1; ++i)
      copy_row(out + size_t(i) * rb, row_ptr(p.tokens, idx[i], p.H), rb, stream, i + 1 < i1 ? row_ptr(p.tokens, idx[i + 1], p.H) : nullptr);
    if (stream) stream_fence();
  });
}

UnpermutePlan plan_unpermute(const TensorView& permuted, const TensorView& sorted, const TensorView& probs, bool padded, int64_t restore_rows) {
  const char* op = "moe_token_unpermute";
  UnpermutePlan p;
  check_ndim(op, "permuted_tokens", permuted, 2);
  check_float(op, "permuted_tokens", permuted);
  check_dtype(op, "sorted_indices", sorted, DType::i32);
  check_ndim(op, "sorted_indices", sorted, 1);
  p.P = permuted.size(0); p.H = permuted.size(1); p.padded = padded;
  if (probs.defined()) check_float(op, "probs", probs);
  if (padded) {
    OT_CHECK(restore_rows >= 0, op, "restore_rows", "the token count T (>= 0) in padded mode", restore_rows);
    checked_numel(op, "restore_rows", {restore_rows, p.H}, permuted.dtype);  // the [T, H] output
    p.T = restore_rows;
    check_dim(op, "sorted_indices", sorted, 0, p.P);
    check_ids(op, "sorted_indices", sorted, 0, p.T - 1);
    if (probs.defined()) OT_CHECK(probs.numel() == p.P, op, "probs", detail::cat("[E, C] with E*C = ", p.P, " elements"), probs.shape_str());
  } else {
    if (probs.defined()) {
      check_ndim(op, "probs", probs, 2);
      p.T = probs.size(0); p.K = probs.size(1);
      check_dim(op, "sorted_indices", sorted, 0, p.T * p.K);
    } else {
      p.T = sorted.size(0); p.K = 1;
    }
    OT_CHECK(restore_rows < 0 || restore_rows == p.T, op, "restore_rows", detail::cat("-1 or T = ", p.T), restore_rows);
  }
  p.permuted = contig(permuted, p.hp);
  p.sorted = contig(sorted, p.hi);
  p.probs = contig(probs, p.hpr);
  return p;
}

void unpermute_fast(const UnpermutePlan& p, const TensorView& out) {
  const int32_t* idx = p.sorted.ptr<int32_t>();
  if (p.padded) {  // scatter-add: several rows may hit one token, so accumulate serially in fp32
    std::vector<float> acc(static_cast<size_t>(p.T * p.H), 0.f);
    for (int64_t i = 0; i < p.P; ++i) {
      float w = p.probs.defined() ? load1(p.probs, i) : 1.f;
      accumulate_f32(row_ptr(p.permuted, i, p.H), p.permuted.dtype, w, acc.data() + idx[i] * p.H, p.H);
    }
    store_f32(out, 0, acc.data(), p.T * p.H);
    return;
  }
  const size_t ob = size_t(p.H) * dtype_size(out.dtype);
  const bool stream = stream_output(size_t(p.T) * ob);
  parallel_for(p.T, [&](int64_t t0, int64_t t1) {
    WeightedRow buf[2][64];  // this token's rows and the next one's (K <= 64 per batch)
    auto gather = [&](int64_t t, int64_t k0, WeightedRow* w) {
      int n = 0;
      for (int64_t k = k0; k < std::min(p.K, k0 + 64); ++k) {
        int64_t d = idx[t * p.K + k];
        float wt = p.probs.defined() ? load1(p.probs, t * p.K + k) : 1.f;
        if (d < 0 || d >= p.P || wt == 0.f) continue;
        w[n++] = {row_ptr(p.permuted, d, p.H), wt};
      }
      return n;
    };
    char* o = static_cast<char*>(out.data);
    if (p.K > 64) {  // rare: sum in batches of 64 through an fp32 row
      std::vector<float> acc(static_cast<size_t>(p.H)), part(static_cast<size_t>(p.H));
      for (int64_t t = t0; t < t1; ++t) {
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int64_t k0 = 0; k0 < p.K; k0 += 64) {
          int n = gather(t, k0, buf[0]);
          combine_rows(buf[0], n, p.permuted.dtype, p.H, part.data(), DType::f32);
          accumulate_f32(part.data(), DType::f32, 1.f, acc.data(), p.H);
        }
        store_f32(out, t * p.H, acc.data(), p.H);
      }
      return;
    }
    int n = gather(t0, 0, buf[0]);
    for (int64_t t = t0; t < t1; ++t) {
      WeightedRow* cur = buf[(t - t0) & 1];
      WeightedRow* nxt = buf[(t - t0 + 1) & 1];
      int nn = t + 1 < t1 ? gather(t + 1, 0, nxt) : 0;
      combine_rows(cur, n, p.permuted.dtype, p.H, o + size_t(t) * ob, out.dtype, nxt, nn, stream);
      n = nn;
    }
    if (stream) stream_fence();
  });
}

// ---- compute_expert_tokens and re_routing (small; validated here for both paths).
static std::vector<int64_t> check_sorted_experts(const TensorView& sorted, int64_t E) {
  const char* op = "moe_compute_expert_tokens";
  check_ndim(op, "sorted_experts", sorted, 1);
  OT_CHECK(E >= 1 && E <= 2048, op, "num_experts", "1..2048", E);
  check_ids(op, "sorted_experts", sorted, 0, E - 1);
  std::vector<int64_t> v = read_ints(op, "sorted_experts", sorted);
  for (size_t i = 1; i < v.size(); ++i)
    OT_CHECK(v[i - 1] <= v[i], op, "sorted_experts", "non-decreasing expert ids", v[i - 1], " then ", v[i], " at ", i);
  return v;
}

static ReRoutingResult re_routing_run(const TensorView& tokens_in, const TensorView& counts, const TensorView& scales_in, bool ref) {
  const char* op = "moe_re_routing";
  check_ndim(op, "tokens", tokens_in, 2);
  OT_CHECK(is_float(tokens_in.dtype) || tokens_in.dtype == DType::i8, op, "tokens", "bf16, fp16, fp32 or int8", dtype_name(tokens_in.dtype));
  check_ndim(op, "expert_token_num_per_rank", counts, 2);
  std::vector<int64_t> cnt = read_ints(op, "expert_token_num_per_rank", counts);
  int64_t A = tokens_in.size(0), R = counts.size(0), El = counts.size(1), total = 0;
  for (int64_t c : cnt) { OT_CHECK(c >= 0, op, "expert_token_num_per_rank", "counts >= 0", c); total += c; }
  OT_CHECK(total == A, op, "expert_token_num_per_rank", detail::cat("counts summing to the rows of tokens, A = ", A), total);
  if (scales_in.defined()) {
    check_dtype(op, "per_token_scales", scales_in, DType::f32);
    OT_CHECK(scales_in.ndim == 1 && scales_in.size(0) == A, op, "per_token_scales", detail::cat("[A] = [", A, "]"), scales_in.shape_str());
  }
  Tensor ht, hs;
  TensorView tokens = contig(tokens_in, ht), scales = contig(scales_in, hs);
  trace::OpScope scope(op);
  if (scope.active()) scope.kernel(ref ? "ref" : "memcpy_rows").args(tokens.shape_str()).bytes(2.0 * double(tokens.nbytes()));
  if (ref) return refimpl::re_routing(tokens_in, counts, scales_in);
  ReRoutingResult r;
  int64_t H = tokens.size(1);
  r.permute_tokens = pooled_empty(tokens.dtype, {A, H});
  r.permute_token_idx = Tensor::empty(DType::i32, {A});
  r.expert_token_num = Tensor::zeros(DType::i64, {El});
  if (scales.defined()) r.permute_per_token_scales = Tensor::empty(DType::f32, {A});
  // Source offsets are rank-major; destination offsets expert-major.
  std::vector<int64_t> src(static_cast<size_t>(R * El)), dst(size_t(R * El));
  for (int64_t i = 0, o = 0; i < R; ++i) for (int64_t j = 0; j < El; ++j) { src[size_t(i * El + j)] = o; o += cnt[size_t(i * El + j)]; }
  for (int64_t j = 0, o = 0; j < El; ++j) for (int64_t i = 0; i < R; ++i) { dst[size_t(i * El + j)] = o; o += cnt[size_t(i * El + j)]; r.expert_token_num.ptr<int64_t>()[j] += cnt[size_t(i * El + j)]; }
  size_t rb = size_t(H) * dtype_size(tokens.dtype);
  parallel_for_dynamic(R * El, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      int64_t s0 = src[size_t(b)], d0 = dst[size_t(b)], n = cnt[size_t(b)];
      std::memcpy(static_cast<char*>(r.permute_tokens.view().data) + size_t(d0) * rb, row_ptr(tokens, s0, H), size_t(n) * rb);
      for (int64_t x = 0; x < n; ++x) {
        r.permute_token_idx.ptr<int32_t>()[d0 + x] = int32_t(s0 + x);
        if (scales.defined()) r.permute_per_token_scales.ptr<float>()[d0 + x] = scales.ptr<float>()[s0 + x];
      }
    }
  });
  return r;
}

static Tensor expert_tokens_run(const TensorView& sorted, int64_t E, bool ref) {
  std::vector<int64_t> v = check_sorted_experts(sorted, E);
  trace::OpScope scope("moe_compute_expert_tokens");
  if (scope.active()) scope.kernel(ref ? "ref" : "binary_search").bytes(double(sorted.nbytes()));
  if (ref) return refimpl::compute_expert_tokens(sorted, E);
  Tensor out = Tensor::empty(DType::i32, {E});
  for (int64_t e = 0; e < E; ++e) out.ptr<int32_t>()[e] = int32_t(std::upper_bound(v.begin(), v.end(), e) - v.begin());
  return out;
}

static TokenPermuteResult permute_run(const TensorView& tokens, const TensorView& indices, int64_t num_out, bool padded, bool ref) {
  PermutePlan p = plan_permute(tokens, indices, num_out, padded);
  trace::OpScope scope("moe_token_permute");
  if (scope.active()) scope.kernel(ref ? "ref" : "counting_sort").args(tokens.shape_str()).bytes(double(p.rows) * double(p.H * int64_t(dtype_size(tokens.dtype))) * 2);
  if (ref) return refimpl::token_permute(tokens, indices, num_out, padded);
  TokenPermuteResult r;
  r.permuted_tokens = pooled_empty(tokens.dtype, {p.rows, p.H});
  r.sorted_indices = Tensor::empty(DType::i32, {padded ? p.rows : p.T * p.K});
  permute_fast(p, r);
  return r;
}

static Tensor unpermute_run(const TensorView& permuted, const TensorView& sorted, const TensorView& probs, bool padded, int64_t restore, bool ref) {
  UnpermutePlan p = plan_unpermute(permuted, sorted, probs, padded, restore);
  trace::OpScope scope("moe_token_unpermute");
  if (scope.active()) scope.kernel(ref ? "ref" : "fp32_rows").args(permuted.shape_str()).bytes(double(permuted.nbytes()) + double(p.T * p.H) * double(dtype_size(permuted.dtype)));
  if (ref) return refimpl::token_unpermute(permuted, sorted, probs, padded, restore);
  Tensor out = pooled_empty(permuted.dtype, {p.T, p.H});
  unpermute_fast(p, out);
  return out;
}

}  // namespace impl

Tensor moe_compute_expert_tokens(const TensorView& s, int64_t E) { return impl::expert_tokens_run(s, E, cpu::force_ref()); }
ReRoutingResult moe_re_routing(const TensorView& t, const TensorView& c, const TensorView& s) { return impl::re_routing_run(t, c, s, cpu::force_ref()); }
TokenPermuteResult moe_token_permute(const TensorView& t, const TensorView& i, int64_t n, bool padded) {
  return impl::permute_run(t, i, n, padded, cpu::force_ref());
}
Tensor moe_token_unpermute(const TensorView& p, const TensorView& s, const TensorView& pr, bool padded, int64_t rr) {
  return impl::unpermute_run(p, s, pr, padded, rr, cpu::force_ref());
}
namespace ref {
Tensor moe_compute_expert_tokens(const TensorView& s, int64_t E) { return impl::expert_tokens_run(s, E, true); }
ReRoutingResult moe_re_routing(const TensorView& t, const TensorView& c, const TensorView& s) { return impl::re_routing_run(t, c, s, true); }
TokenPermuteResult moe_token_permute(const TensorView& t, const TensorView& i, int64_t n, bool padded) { return impl::permute_run(t, i, n, padded, true); }
Tensor moe_token_unpermute(const TensorView& p, const TensorView& s, const TensorView& pr, bool padded, int64_t rr) {
  return impl::unpermute_run(p, s, pr, padded, rr, true);
}
}  // namespace ref

}  // namespace ot::moe
