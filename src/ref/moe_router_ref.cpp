// Routers, reference: per token, scores in fp64, a full stable sort of the experts by score
// (descending; the stable sort keeps the lower id first on ties), then the selected values.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "src/moe/common.h"
#include "src/moe/router_plan.h"

namespace ot::moe::impl {

static std::vector<int32_t> sorted_desc(const std::vector<double>& key) {
  std::vector<int32_t> ids(key.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return key[size_t(a)] > key[size_t(b)]; });
  return ids;
}

void route_ref(const RouterSpec& s, GatingResult& r) {
  const double ninf = -std::numeric_limits<double>::infinity();
  const size_t E = size_t(s.E);
  for (int64_t row = 0; row < s.R; ++row) {
    std::vector<double> x(E), sc(E, 0.0), key(E);
    auto ok = [&](size_t e) { return !s.allowed || s.allowed[size_t(row) * E + e]; };
    for (size_t e = 0; e < E; ++e) x[e] = get_as_double(s.x, row * s.E + int64_t(e));
    if (s.sigmoid) {
      for (size_t e = 0; e < E; ++e) sc[e] = 1.0 / (1.0 + std::exp(-x[e]));
    } else {
      double m = ninf, sum = 0;
      for (size_t e = 0; e < E; ++e) if (ok(e)) m = std::max(m, x[e]);
      for (size_t e = 0; e < E; ++e) if (ok(e)) sum += std::exp(x[e] - m);
      for (size_t e = 0; e < E; ++e) sc[e] = ok(e) ? std::exp(x[e] - m) / sum : 0.0;
    }
    for (size_t e = 0; e < E; ++e) {
      double b = s.bias.empty() ? 0.0 : s.bias[e];
      key[e] = !ok(e) ? ninf : (s.select == Select::topk_softmax ? x[e] : sc[e] + b);
    }
    if (s.select == Select::gating && s.groups > 1 && s.k_group < s.groups) {
      size_t gsz = E / size_t(s.groups);
      std::vector<double> gscore(static_cast<size_t>(s.groups));
      for (size_t g = 0; g < gscore.size(); ++g) {
        std::vector<double> v(key.begin() + long(g * gsz), key.begin() + long((g + 1) * gsz));
        std::sort(v.rbegin(), v.rend());
        gscore[g] = s.group_mode == 0 ? v[0] : v[0] + v[1];
      }
      std::vector<int32_t> order = sorted_desc(gscore);
      std::vector<bool> keep(gscore.size(), false);
      for (int64_t j = 0; j < s.k_group; ++j) keep[size_t(order[size_t(j)])] = true;
      for (size_t e = 0; e < E; ++e) if (!keep[e / gsz]) key[e] = ninf;
    }
    std::vector<int32_t> ids = sorted_desc(key);
    ids.resize(size_t(s.k));
    std::vector<double> vals(static_cast<size_t>(s.k));
    double sum = 0;
    for (size_t j = 0; j < vals.size(); ++j) {
      size_t e = size_t(ids[j]);
      vals[j] = s.select == Select::topk_softmax ? std::exp(x[e] - x[size_t(ids[0])]) : (ok(e) ? sc[e] : 0.0);
      sum += vals[j];
    }
    for (auto& v : vals) {
      if (s.select == Select::topk_softmax) v /= sum;
      if (s.select == Select::gating) v = s.sigmoid ? v / (sum + s.eps) * s.scale : v * s.scale;
    }
    bool fin = s.finished && s.finished[row];
    for (int64_t j = 0; j < s.k; ++j) {
      r.expert_idx.ptr<int32_t>()[row * s.k + j] = fin ? int32_t(s.E) : ids[size_t(j)];
      set_from_double(r.y.view(), row * s.k + j, vals[size_t(j)]);
    }
    if (s.scores)
      for (size_t e = 0; e < E; ++e) r.scores.ptr<float>()[size_t(row) * E + e] = float(sc[e]);
  }
}

}  // namespace ot::moe::impl
