// Expert-to-rank placement: contiguous shards, explicit copies, and a greedy rebalancer.
#include <algorithm>
#include <numeric>

#include "ot/ep.h"
#include "ot/error.h"

namespace ot::ep {

Placement Placement::contiguous(int64_t E, int W) {
  OT_CHECK(W >= 1, "Placement", "world_size", ">= 1", W);
  OT_CHECK(E >= 1 && E % W == 0, "Placement", "num_experts", "a positive multiple of the world size", E, " (W=", W, ")");
  std::vector<std::vector<int>> c(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) c[size_t(e)] = {int(e / (E / W))};
  return from_copies(E, W, std::move(c));
}

Placement Placement::shared_ranks(int64_t E, int W, int S) {
  OT_CHECK(S >= 1 && S < W, "Placement", "shared_ranks", "in [1, world_size)", S, " (W=", W, ")");
  OT_CHECK(E >= 1 && E % (W - S) == 0, "Placement", "num_experts", "a positive multiple of the MoE ranks (W - S)", E, " (W=", W, ", S=", S,
           ")");
  std::vector<std::vector<int>> c(static_cast<size_t>(E + 1));
  for (int64_t e = 0; e < E; ++e) c[size_t(e)] = {S + int(e / (E / (W - S)))};
  for (int s = 0; s < S; ++s) c[size_t(E)].push_back(s);
  return from_copies(E + 1, W, std::move(c));
}

Placement Placement::from_copies(int64_t E, int W, std::vector<std::vector<int>> copies) {
  OT_CHECK(W >= 1, "Placement", "world_size", ">= 1", W);
  OT_CHECK(E >= 1 && int64_t(copies.size()) == E, "Placement", "copies", "one list per expert", copies.size(), " for E=", E);
  for (auto& c : copies) {
    OT_CHECK(!c.empty(), "Placement", "copies", "at least one rank per expert", "an empty list");
    std::sort(c.begin(), c.end());
    OT_CHECK(std::adjacent_find(c.begin(), c.end()) == c.end(), "Placement", "copies", "distinct ranks per expert", "a repeated rank");
    OT_CHECK(c.front() >= 0 && c.back() < W, "Placement", "copies", "ranks in [0, W)", c.back());
  }
  Placement p;
  p.world_ = W;
  p.copies_ = std::move(copies);
  p.build_local();
  return p;
}

void Placement::build_local() {
  local_.assign(size_t(world_), {});
  local_index_.assign(size_t(world_), std::vector<int>(copies_.size(), -1));
  for (int64_t e = 0; e < num_experts(); ++e)
    for (int q : copies_[size_t(e)]) {
      local_index_[size_t(q)][size_t(e)] = int(local_[size_t(q)].size());
      local_[size_t(q)].push_back(e);
    }
}

int Placement::local_index(int q, int64_t e) const { return local_index_[size_t(q)][size_t(e)]; }

int Placement::destination(int r, int64_t t, int64_t e) const {
  const auto& c = copies_[size_t(e)];
  if (c.size() == 1) return c[0];
  if (local_index(r, e) >= 0) return r;  // a local copy costs no traffic
  return c[size_t((int64_t(r) + t) % int64_t(c.size()))];
}

uint64_t Placement::hash() const {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over (W, E, copies)
  auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  mix(uint64_t(world_));
  mix(uint64_t(copies_.size()));
  for (const auto& c : copies_) {
    mix(c.size());
    for (int q : c) mix(uint64_t(q));
  }
  return h;
}

Placement Placement::rebalanced(int64_t E, int W, const std::vector<int64_t>& load, int extra_per_rank) {
  OT_CHECK(int64_t(load.size()) == E, "Placement::rebalanced", "load", "one count per expert", load.size());
  OT_CHECK(extra_per_rank >= 0, "Placement::rebalanced", "extra_per_rank", ">= 0", extra_per_rank);
  Placement base = contiguous(E, W);
  std::vector<std::vector<int>> copies = base.copies_;
  // Each expert's load is split evenly over its copies; repeatedly copy the expert with the highest
  // per-copy load onto the least loaded rank that lacks it and still has a free slot.
  std::vector<double> rank_load(size_t(W), 0);
  for (int64_t e = 0; e < E; ++e) rank_load[size_t(copies[size_t(e)][0])] += double(load[size_t(e)]);
  std::vector<int> extra(size_t(W), 0);
  for (int64_t step = 0; step < int64_t(W) * extra_per_rank; ++step) {
    int64_t hot = -1;
    double best = -1;
    for (int64_t e = 0; e < E; ++e) {
      double per = double(load[size_t(e)]) / double(copies[size_t(e)].size());
      if (int(copies[size_t(e)].size()) < W && per > best) { best = per; hot = e; }
    }
    if (hot < 0 || best <= 0) break;
    int target = -1;
    for (int q = 0; q < W; ++q) {
      auto& c = copies[size_t(hot)];
      if (extra[size_t(q)] >= extra_per_rank || std::find(c.begin(), c.end(), q) != c.end()) continue;
      if (target < 0 || rank_load[size_t(q)] < rank_load[size_t(target)]) target = q;
    }
    if (target < 0) break;
    auto& c = copies[size_t(hot)];
    double n = double(c.size());
    for (int q : c) rank_load[size_t(q)] -= best - best * n / (n + 1);
    rank_load[size_t(target)] += best * n / (n + 1);
    c.push_back(target);
    ++extra[size_t(target)];
  }
  return from_copies(E, W, std::move(copies));
}

}  // namespace ot::ep
