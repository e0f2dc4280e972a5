// Routers, reference: per token, scores in fp64, a full stable sort of the experts by score
// (descending; the stable sort keeps the lower id first on ties), then the selected values.
#include "src/ref/moe_router_ref.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

namespace ot::moe::refimpl {
namespace {

enum class Select { softmax_topk, topk_softmax, gating };

// One router call in plain terms.
struct Call {
  Select select = Select::softmax_topk;
  int64_t k = 1;
  bool sigmoid = false;  // gating norm_type 1
  TensorView finished, allowed, bias;
  int64_t groups = 1, k_group = 1;
  int group_mode = 0;
  double scale = 1, eps = 0;
  bool row_idx = false, scores = false;
};

std::vector<int32_t> sorted_desc(const std::vector<double>& key) {
  std::vector<int32_t> ids(key.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return key[size_t(a)] > key[size_t(b)]; });
  return ids;
}

GatingResult route(const TensorView& xv, const Call& s) {
  const double ninf = -std::numeric_limits<double>::infinity();
  const int64_t E = xv.size(-1), R = E > 0 ? xv.numel() / E : 0, k = s.k;
  std::vector<int64_t> shape = xv.shape(), kshape = shape;
  kshape.back() = k;
  GatingResult r;
  r.y = Tensor::empty(xv.dtype, kshape);
  r.expert_idx = Tensor::empty(DType::i32, kshape);
  if (s.row_idx) r.row_idx = Tensor::empty(DType::i32, kshape);
  if (s.scores) r.scores = Tensor::empty(DType::f32, shape);
  for (int64_t row = 0; row < R; ++row) {
    std::vector<double> x(static_cast<size_t>(E)), sc(static_cast<size_t>(E), 0.0), key(static_cast<size_t>(E));
    auto ok = [&](int64_t e) { return !s.allowed.defined() || get_as_double(s.allowed, row * E + e) != 0; };
    for (int64_t e = 0; e < E; ++e) x[size_t(e)] = get_as_double(xv, row * E + e);
    if (s.sigmoid) {
      for (int64_t e = 0; e < E; ++e) sc[size_t(e)] = 1.0 / (1.0 + std::exp(-x[size_t(e)]));
    } else {  // softmax over the allowed experts
      double m = ninf, sum = 0;
      for (int64_t e = 0; e < E; ++e) if (ok(e)) m = std::max(m, x[size_t(e)]);
      for (int64_t e = 0; e < E; ++e) if (ok(e)) sum += std::exp(x[size_t(e)] - m);
      for (int64_t e = 0; e < E; ++e) sc[size_t(e)] = ok(e) ? std::exp(x[size_t(e)] - m) / sum : 0.0;
    }
    for (int64_t e = 0; e < E; ++e) {
      double b = s.bias.defined() ? get_as_double(s.bias, e) : 0.0;
      key[size_t(e)] = !ok(e) ? ninf : (s.select == Select::topk_softmax ? x[size_t(e)] : sc[size_t(e)] + b);
    }
    if (s.select == Select::gating && s.groups > 1 && s.k_group < s.groups) {  // keep the k_group best groups
      size_t gsz = size_t(E / s.groups);
      std::vector<double> gscore(static_cast<size_t>(s.groups));
      for (size_t g = 0; g < gscore.size(); ++g) {
        std::vector<double> v(key.begin() + long(g * gsz), key.begin() + long((g + 1) * gsz));
        std::sort(v.rbegin(), v.rend());
        gscore[g] = s.group_mode == 0 ? v[0] : v[0] + v[1];
      }
      std::vector<int32_t> order = sorted_desc(gscore);
      std::vector<bool> keep(gscore.size(), false);
      for (int64_t j = 0; j < s.k_group; ++j) keep[size_t(order[size_t(j)])] = true;
      for (size_t e = 0; e < size_t(E); ++e) if (!keep[e / gsz]) key[e] = ninf;
    }
    std::vector<int32_t> ids = sorted_desc(key);
    ids.resize(size_t(k));
    std::vector<double> vals(static_cast<size_t>(k));
    double sum = 0;
    for (size_t j = 0; j < vals.size(); ++j) {
      int64_t e = ids[j];
      vals[j] = s.select == Select::topk_softmax ? std::exp(x[size_t(e)] - x[size_t(ids[0])]) : (ok(e) ? sc[size_t(e)] : 0.0);
      sum += vals[j];
    }
    for (auto& v : vals) {
      if (s.select == Select::topk_softmax) v /= sum;
      if (s.select == Select::gating) v = s.sigmoid ? v / (sum + s.eps) * s.scale : v * s.scale;
    }
    bool fin = s.finished.defined() && get_as_double(s.finished, row) != 0;
    for (int64_t j = 0; j < k; ++j) {
      r.expert_idx.ptr<int32_t>()[row * k + j] = fin ? int32_t(E) : ids[size_t(j)];
      set_from_double(r.y.view(), row * k + j, vals[size_t(j)]);
      if (s.row_idx) r.row_idx.ptr<int32_t>()[row * k + j] = int32_t(j * R + row);  // k-major
    }
    if (s.scores)
      for (int64_t e = 0; e < E; ++e) r.scores.ptr<float>()[row * E + e] = float(sc[size_t(e)]);
  }
  return r;
}

}  // namespace

GatingResult gating_top_k_softmax(const TensorView& x, int64_t k, const TensorView& finished, const TensorView& allowed) {
  Call c;
  c.k = k;
  c.finished = finished;
  c.allowed = allowed;
  c.row_idx = true;
  return route(x, c);
}

GatingResult gating_top_k_softmax_v2(const TensorView& x, int64_t k, const TensorView& finished, int renorm, bool output_softmax,
                                     const TensorView& allowed) {
  Call c;
  c.select = renorm ? Select::topk_softmax : Select::softmax_topk;
  c.k = k;
  c.finished = finished;
  c.allowed = allowed;
  c.scores = output_softmax && renorm == 0;
  return route(x, c);
}

GatingResult gating_top_k(const TensorView& x, const GatingTopKOptions& o) {
  Call c;
  c.select = Select::gating;
  c.k = o.k;
  c.sigmoid = o.norm_type == 1;
  c.allowed = o.allowed;
  c.bias = o.bias;
  c.groups = o.group_count;
  c.k_group = o.k_group;
  c.group_mode = o.group_select_mode;
  c.scale = o.routed_scaling_factor;
  c.eps = o.eps;
  c.scores = o.out_flag;
  return route(x, c);
}

}  // namespace ot::moe::refimpl
