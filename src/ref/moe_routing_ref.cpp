// Routing references: the spec's pseudo-code, literally (std::stable_sort on the spec's keys,
// element-wise copies through get_as_double / set_from_double).
#include "src/ref/moe_routing_ref.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

namespace ot::moe::refimpl {

static std::vector<int64_t> stable_order(const std::vector<int64_t>& key) {
  std::vector<int64_t> perm(key.size());
  std::iota(perm.begin(), perm.end(), 0);
  std::stable_sort(perm.begin(), perm.end(), [&](int64_t a, int64_t b) { return key[size_t(a)] < key[size_t(b)]; });
  return perm;
}
static int64_t at(const TensorView& v, int64_t i) { return int64_t(get_as_double(v, i)); }
static std::vector<int64_t> ints(const TensorView& v) {
  std::vector<int64_t> r(static_cast<size_t>(v.numel()));
  for (size_t i = 0; i < r.size(); ++i) r[i] = at(v, int64_t(i));
  return r;
}
static void copy_row(const TensorView& src, int64_t srow, const TensorView& dst, int64_t drow, int64_t H) {
  for (int64_t h = 0; h < H; ++h) set_from_double(dst, drow * H + h, get_as_double(src, srow * H + h));
}
// int8 code of v: round half to even, saturate; NaN gives 0 (ot/quant.h).
static int8_t to_i8(float v) {
  if (std::isnan(v)) return 0;
  float r = std::nearbyint(v);
  return int8_t(std::clamp(r, -128.f, 127.f));
}

InitRoutingResult init_routing(const TensorView& x, const TensorView& row_idx, const TensorView& expert_idx, int64_t active_num) {
  const int64_t N = x.size(0), H = x.size(1), K = expert_idx.size(1);
  const int64_t active = std::min(N, active_num);
  InitRoutingResult r;
  r.expanded_x = Tensor::empty(x.dtype, {active * K, H});
  r.expanded_row_idx = Tensor::empty(DType::i32, {N * K});
  r.expanded_expert_idx = Tensor::empty(DType::i32, {N * K});
  std::vector<int64_t> key = ints(expert_idx), rid = ints(row_idx);
  std::vector<int64_t> perm = stable_order(key);
  for (size_t i = 0; i < perm.size(); ++i) {
    int64_t src = rid[size_t(perm[i])];  // a row index value: token src % N
    r.expanded_row_idx.ptr<int32_t>()[src] = int32_t(i);
    r.expanded_expert_idx.ptr<int32_t>()[i] = int32_t(key[size_t(perm[i])]);
    if (int64_t(i) < active * K) copy_row(x, src % N, r.expanded_x, int64_t(i), H);
  }
  return r;
}

InitRoutingV2Result init_routing_v2(const TensorView& x, const TensorView& expert_idx, const InitRoutingV2Options& o) {
  const int64_t N = x.size(0), H = x.size(1), K = expert_idx.size(1), NK = N * K;
  std::vector<int64_t> ids = ints(expert_idx);
  int64_t E = o.expert_num;
  if (E == -1) E = NK > 0 ? *std::max_element(ids.begin(), ids.end()) + 1 : 0;
  const bool range_given = o.active_expert_range[0] != 0 || o.active_expert_range[1] != 0;
  const int64_t s = range_given ? o.active_expert_range[0] : 0, e_ = range_given ? o.active_expert_range[1] : E;
  const bool drop_pad = o.drop_pad_mode == 1;
  const int64_t C = drop_pad ? o.expert_capacity : 0;
  // What the optional scale tensor is.
  const bool quant = o.quant_mode >= 0;
  const bool per_token = o.quant_mode == -1 && o.scale.defined();
  const bool smooth = o.quant_mode == 1 && o.scale.defined();
  const bool smooth_one = smooth && o.scale.size(0) == 1;
  const bool want_scale = o.quant_mode == 1 || per_token;

  std::vector<int64_t> key(static_cast<size_t>(NK));
  int64_t available = 0;
  for (int64_t j = 0; j < NK; ++j) {
    int64_t id = ids[size_t(j)];
    key[size_t(j)] = id < s ? std::numeric_limits<int32_t>::max() : id;  // below the range: sorts last
    available += id >= s && id < e_;
  }
  std::vector<int64_t> perm = stable_order(key);
  InitRoutingV2Result r;
  r.available = available;
  DType xt = quant ? DType::i8 : x.dtype;
  std::vector<int64_t> counts(static_cast<size_t>(e_ - s), 0);
  for (int64_t i = 0; i < available; ++i) ++counts[size_t(key[size_t(perm[size_t(i)])] - s)];
  std::vector<int64_t> dst(static_cast<size_t>(NK), -1);  // expanded row of sorted position i
  if (drop_pad) {
    std::vector<int64_t> slot(static_cast<size_t>(E), 0);
    for (int64_t i = 0; i < available; ++i) {
      int64_t e = key[size_t(perm[size_t(i)])];
      if (slot[size_t(e)] < C) dst[size_t(i)] = e * C + slot[size_t(e)]++; else ++r.dropped;
    }
    r.expanded_x = Tensor::zeros(xt, {E, C, H});
    if (want_scale) r.expanded_scale = Tensor::zeros(DType::f32, {E * C});
    r.expert_tokens = Tensor::empty(DType::i64, {E});
    for (int64_t e = 0; e < E; ++e) r.expert_tokens.ptr<int64_t>()[e] = counts[size_t(e)];
  } else {
    int64_t rows = o.active_num > 0 ? std::min(o.active_num, available) : available;
    r.dropped = available - rows;
    for (int64_t i = 0; i < rows; ++i) dst[size_t(i)] = i;
    r.expanded_x = Tensor::zeros(xt, {rows, H});
    if (want_scale) r.expanded_scale = Tensor::zeros(DType::f32, {rows});
    if (o.expert_tokens_num_type == 2) {
      r.expert_tokens = Tensor::zeros(DType::i64, {E, 2});
      int64_t n = 0;
      for (int64_t e = s; e < e_; ++e)
        if (counts[size_t(e - s)] > 0) {
          r.expert_tokens.ptr<int64_t>()[2 * n] = e;
          r.expert_tokens.ptr<int64_t>()[2 * n + 1] = counts[size_t(e - s)];
          ++n;
        }
    } else {
      r.expert_tokens = Tensor::empty(DType::i64, {e_ - s});
      int64_t run = 0;
      for (int64_t e = 0; e < e_ - s; ++e) {
        run += counts[size_t(e)];
        r.expert_tokens.ptr<int64_t>()[e] = o.expert_tokens_num_type == 0 ? run : counts[size_t(e)];
      }
    }
  }
  r.expanded_row_idx = Tensor::empty(DType::i32, {NK});
  int32_t* eri = r.expanded_row_idx.ptr<int32_t>();
  for (int64_t j = 0; j < NK; ++j) eri[j] = -1;
  for (int64_t i = 0; i < available; ++i) {
    if (o.row_idx_type == 1) eri[i] = int32_t(perm[size_t(i)]);
    else eri[perm[size_t(i)]] = int32_t(drop_pad ? dst[size_t(i)] : i);
  }
  std::vector<float> xs(static_cast<size_t>(H));
  for (int64_t i = 0; i < available; ++i) {
    int64_t d = dst[size_t(i)];
    if (d < 0) continue;
    int64_t n = perm[size_t(i)] / K, e = key[size_t(perm[size_t(i)])];
    if (!quant) {
      copy_row(x, n, r.expanded_x, d, H);
      if (per_token) r.expanded_scale.ptr<float>()[d] = float(get_as_double(o.scale, n));
      continue;
    }
    int8_t* q = r.expanded_x.ptr<int8_t>() + d * H;
    for (int64_t h = 0; h < H; ++h) xs[size_t(h)] = float(get_as_double(x, n * H + h));
    if (o.quant_mode == 0) {
      const float sc = float(get_as_double(o.scale, 0)), off = o.offset.defined() ? float(get_as_double(o.offset, 0)) : 0.f;
      for (int64_t h = 0; h < H; ++h) q[h] = to_i8(xs[size_t(h)] * sc + off);
      continue;
    }
    if (smooth)
      for (int64_t h = 0; h < H; ++h) xs[size_t(h)] *= float(get_as_double(o.scale, (smooth_one ? 0 : e - s) * H + h));
    float amax = 0;
    bool finite = true;
    for (float v : xs) { amax = std::max(amax, std::fabs(v)); finite = finite && std::isfinite(v); }
    float dq = finite ? amax / 127.f : std::nanf("");  // a NaN / Inf row: scale NaN, codes 0 (ot/quant.h)
    for (int64_t h = 0; h < H; ++h) q[h] = dq > 0 ? to_i8(xs[size_t(h)] / dq) : 0;
    r.expanded_scale.ptr<float>()[d] = dq;
  }
  return r;
}

TokenPermuteResult token_permute(const TensorView& tokens, const TensorView& indices, int64_t num_out_tokens, bool padded) {
  const int64_t T = tokens.size(0), H = tokens.size(1);
  std::vector<int64_t> idx = ints(indices);
  TokenPermuteResult r;
  if (padded) {  // indices [E, C]: row i is token indices[i]
    const int64_t rows = int64_t(idx.size());
    r.permuted_tokens = Tensor::empty(tokens.dtype, {rows, H});
    r.sorted_indices = Tensor::empty(DType::i32, {rows});
    for (int64_t i = 0; i < rows; ++i) {
      r.sorted_indices.ptr<int32_t>()[i] = int32_t(idx[size_t(i)]);
      copy_row(tokens, idx[size_t(i)], r.permuted_tokens, i, H);
    }
    return r;
  }
  const int64_t K = indices.ndim == 2 ? indices.size(1) : 1, n = T * K;
  const int64_t rows = num_out_tokens == 0 ? n : num_out_tokens > 0 ? std::min(num_out_tokens, n) : std::max<int64_t>(0, n + num_out_tokens);
  r.permuted_tokens = Tensor::empty(tokens.dtype, {rows, H});
  r.sorted_indices = Tensor::empty(DType::i32, {n});
  std::vector<int64_t> perm = stable_order(idx);
  for (size_t i = 0; i < perm.size(); ++i) {
    r.sorted_indices.ptr<int32_t>()[perm[i]] = int32_t(i);
    if (int64_t(i) < rows) copy_row(tokens, perm[i] / K, r.permuted_tokens, int64_t(i), H);
  }
  return r;
}

Tensor token_unpermute(const TensorView& permuted, const TensorView& sorted_indices, const TensorView& probs, bool padded,
                       int64_t restore_rows) {
  const int64_t P = permuted.size(0), H = permuted.size(1);
  std::vector<int64_t> idx = ints(sorted_indices);
  int64_t T, K = 1;
  if (padded) T = restore_rows;
  else if (probs.defined()) T = probs.size(0), K = probs.size(1);
  else T = sorted_indices.size(0);
  std::vector<double> acc(static_cast<size_t>(T * H), 0.0);
  if (padded) {  // row i goes back to token idx[i]
    for (int64_t i = 0; i < P; ++i) {
      double w = probs.defined() ? get_as_double(probs, i) : 1.0;
      for (int64_t h = 0; h < H; ++h) acc[size_t(idx[size_t(i)] * H + h)] += w * get_as_double(permuted, i * H + h);
    }
  } else {
    for (int64_t t = 0; t < T; ++t)
      for (int64_t k = 0; k < K; ++k) {
        int64_t d = idx[size_t(t * K + k)];
        double w = probs.defined() ? get_as_double(probs, t * K + k) : 1.0;
        if (d < 0 || d >= P || w == 0.0) continue;
        for (int64_t h = 0; h < H; ++h) acc[size_t(t * H + h)] += w * get_as_double(permuted, d * H + h);
      }
  }
  Tensor out = Tensor::empty(permuted.dtype, {T, H});
  for (size_t i = 0; i < acc.size(); ++i) set_from_double(out, int64_t(i), acc[i]);
  return out;
}

Tensor compute_expert_tokens(const TensorView& sorted_experts, int64_t num_experts) {
  std::vector<int64_t> v = ints(sorted_experts);
  Tensor out = Tensor::empty(DType::i32, {num_experts});
  for (int64_t e = 0; e < num_experts; ++e) {
    int32_t n = 0;
    for (int64_t id : v) n += id <= e;
    out.ptr<int32_t>()[e] = n;
  }
  return out;
}

ReRoutingResult re_routing(const TensorView& tokens, const TensorView& counts, const TensorView& scales) {
  const int64_t A = tokens.size(0), H = tokens.size(1), R = counts.size(0), El = counts.size(1);
  std::vector<int64_t> cnt = ints(counts);
  ReRoutingResult r;
  r.permute_tokens = Tensor::empty(tokens.dtype, {A, H});
  r.permute_token_idx = Tensor::empty(DType::i32, {A});
  r.expert_token_num = Tensor::zeros(DType::i64, {El});
  if (scales.defined()) r.permute_per_token_scales = Tensor::empty(DType::f32, {A});
  auto c = [&](int64_t i, int64_t j) { return cnt[size_t(i * El + j)]; };
  for (int64_t i = 0; i < R; ++i)
    for (int64_t j = 0; j < El; ++j) {
      // Block (rank i, expert j) starts after the blocks before it rank-major in the input and
      // expert-major in the output.
      int64_t src = 0, dst = 0;
      for (int64_t i2 = 0; i2 < R; ++i2) for (int64_t j2 = 0; j2 < El; ++j2) if (i2 < i || (i2 == i && j2 < j)) src += c(i2, j2);
      for (int64_t j2 = 0; j2 < El; ++j2) for (int64_t i2 = 0; i2 < R; ++i2) if (j2 < j || (j2 == j && i2 < i)) dst += c(i2, j2);
      for (int64_t x = 0; x < c(i, j); ++x) {
        copy_row(tokens, src + x, r.permute_tokens, dst + x, H);
        r.permute_token_idx.ptr<int32_t>()[dst + x] = int32_t(src + x);
        if (scales.defined()) r.permute_per_token_scales.ptr<float>()[dst + x] = float(get_as_double(scales, src + x));
      }
      r.expert_token_num.ptr<int64_t>()[j] += c(i, j);
    }
  return r;
}

}  // namespace ot::moe::refimpl
