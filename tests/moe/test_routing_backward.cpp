// Backward of permute / unpermute, init routing v1/v2 and finalize: the reference against finite
// differences of fp64 forwards written from the spec, the fast path against the reference
// (fp32 and bf16), dropped rows (capacity, active_num, -1), and bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "moe/moe_bwd_test_util.h"
#include "ot/error.h"
#include "ot/moe_bwd.h"

namespace test_routing_backward {
using namespace ot;
using namespace ot::moe;
using namespace ot::moe::bwdtest;

namespace {

// Distinct random expert ids per token, [T, K] token-major.
std::vector<int64_t> random_ids(int64_t T, int64_t K, int64_t E, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<int64_t> ids;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int64_t> e(static_cast<size_t>(E));
    std::iota(e.begin(), e.end(), 0);
    std::shuffle(e.begin(), e.end(), g);
    ids.insert(ids.end(), e.begin(), e.begin() + K);
  }
  return ids;
}
// perm[i] = source j at destination i (stable by expert); inv[j] = i.
std::vector<int64_t> stable_perm(const std::vector<int64_t>& ids) {
  std::vector<int64_t> perm(ids.size());
  std::iota(perm.begin(), perm.end(), 0);
  std::stable_sort(perm.begin(), perm.end(), [&](int64_t a, int64_t b) { return ids[size_t(a)] < ids[size_t(b)]; });
  return perm;
}
std::vector<int64_t> invert(const std::vector<int64_t>& perm) {
  std::vector<int64_t> inv(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inv[size_t(perm[i])] = int64_t(i);
  return inv;
}
TEST(TokenPermuteBackward, FdAndFast) {
  const int64_t T = 7, K = 3, E = 5, H = 4, P = T * K - 4;  // num_out_tokens cuts the last 4 rows
  auto ids = random_ids(T, K, E, 1);
  auto perm = stable_perm(ids), inv = invert(perm);
  Tensor si = ints(DType::i32, {T * K}, inv);
  Tensor tok = randn(DType::f32, {T, H}, 2), G = randn(DType::f32, {P, H}, 3);
  auto tv = to_vec(tok), gv = to_vec(G);
  auto loss = [&] {  // permuted[i] = tokens[perm[i] / K], i < P
    double s = 0;
    for (int64_t i = 0; i < P; ++i)
      for (int64_t h = 0; h < H; ++h) s += gv[size_t(i * H + h)] * tv[size_t(perm[size_t(i)] / K * H + h)];
    return s;
  };
  auto r = ref::moe_token_permute_backward(G, si, K);
  EXPECT_LT(rel_err(to_vec(r), fd_grad(tv, loss)), 1e-6);
  for (DType dt : {DType::f32, DType::bf16}) {
    Tensor Gd = randn(dt, {P, H}, 4);
    EXPECT_LT(rel_err(moe_token_permute_backward(Gd, si, K), ref::moe_token_permute_backward(Gd, si, K)), tol(dt));
  }
}

TEST(TokenUnpermuteBackward, FdAndFast) {
  const int64_t T = 6, K = 2, E = 4, H = 5, P = T * K;
  auto ids = random_ids(T, K, E, 5);
  auto inv = invert(stable_perm(ids));
  inv[3] = -1;  // a dropped pair (init routing V3 with a non-local expert)
  Tensor si = ints(DType::i32, {T * K}, inv);
  Tensor pm = randn(DType::f32, {P, H}, 6), pr = randn(DType::f32, {T, K}, 7), G = randn(DType::f32, {T, H}, 8);
  pr.ptr<float>()[5] = 0.f;  // zero prob: skipped in the forward, still has a prob gradient
  auto pv = to_vec(pm), qv = to_vec(pr), gv = to_vec(G);
  auto loss = [&] {
    double s = 0;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t k = 0; k < K; ++k) {
        int64_t d = inv[size_t(t * K + k)];
        if (d < 0) continue;
        for (int64_t h = 0; h < H; ++h) s += gv[size_t(t * H + h)] * qv[size_t(t * K + k)] * pv[size_t(d * H + h)];
      }
    return s;
  };
  auto r = ref::moe_token_unpermute_backward(G, pm, si, pr);
  EXPECT_LT(rel_err(to_vec(r.d_permuted), fd_grad(pv, loss)), 1e-6);
  EXPECT_LT(rel_err(to_vec(r.d_probs), fd_grad(qv, loss)), 1e-6);
  for (DType dt : {DType::f32, DType::bf16}) {
    Tensor pmd = randn(dt, {P, H}, 9), Gd = randn(dt, {T, H}, 10);
    auto a = moe_token_unpermute_backward(Gd, pmd, si, pr), b = ref::moe_token_unpermute_backward(Gd, pmd, si, pr);
    EXPECT_LT(rel_err(a.d_permuted, b.d_permuted), tol(dt));
    EXPECT_LT(rel_err(a.d_probs, b.d_probs), 1e-5);
  }
  // Without probs K = 1.
  Tensor si1 = ints(DType::i32, {T}, {5, 0, 1, 4, 3, 2});
  Tensor pm1 = randn(DType::f32, {T, H}, 11);
  auto a = moe_token_unpermute_backward(G, pm1, si1), b = ref::moe_token_unpermute_backward(G, pm1, si1);
  EXPECT_FALSE(a.d_probs.defined());
  EXPECT_LT(rel_err(a.d_permuted, b.d_permuted), 1e-6);
  EXPECT_EQ(get_as_double(a.d_permuted, 5 * H + 2), get_as_double(G, 0 * H + 2));
}

// Gather-form map (token-major src -> dst) of init routing v2 in drop/pad mode: e*C + slot or -1.
std::vector<int64_t> drop_pad_map(const std::vector<int64_t>& ids, int64_t E, int64_t C) {
  auto perm = stable_perm(ids);
  std::vector<int64_t> dst(ids.size(), -1), slot(static_cast<size_t>(E), 0);
  for (int64_t j : perm) {
    int64_t e = ids[size_t(j)];
    if (slot[size_t(e)] < C) dst[size_t(j)] = e * C + slot[size_t(e)]++;
  }
  return dst;
}

TEST(InitRoutingBackward, V2DroplessDropPadScatterAndV1) {
  const int64_t N = 9, K = 2, E = 3, H = 4;
  auto ids = random_ids(N, K, E, 12);
  auto perm = stable_perm(ids), inv = invert(perm);
  struct Case { std::string name; std::vector<int64_t> dst; std::vector<int64_t> shape; };
  const int64_t rows = N * K - 5;  // active_num cut
  std::vector<int64_t> cut(inv);
  for (auto& d : cut) if (d >= rows) d = -1;  // the forward marks nothing, the backward skips dst >= rows
  std::vector<Case> cases{{"dropless", inv, {rows, H}}, {"droppad", drop_pad_map(ids, E, 4), {E, 4, H}}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    int64_t P = c.shape.size() == 3 ? c.shape[0] * c.shape[1] : c.shape[0];
    Tensor idx = ints(DType::i32, {N * K}, c.dst);
    Tensor x = randn(DType::f32, {N, H}, 13), G = randn(DType::f32, c.shape, 14);
    auto xv = to_vec(x), gv = to_vec(G);
    auto loss = [&] {  // expanded[dst[j]] = x[j / K] for kept pairs
      double s = 0;
      for (int64_t j = 0; j < N * K; ++j) {
        int64_t d = c.dst[size_t(j)];
        if (d < 0 || d >= P) continue;
        for (int64_t h = 0; h < H; ++h) s += gv[size_t(d * H + h)] * xv[size_t(j / K * H + h)];
      }
      return s;
    };
    auto r = ref::moe_init_routing_v2_backward(G, idx, N, K, 0);
    EXPECT_LT(rel_err(to_vec(r), fd_grad(xv, loss)), 1e-6);
    for (DType dt : {DType::f32, DType::bf16}) {
      Tensor Gd = randn(dt, c.shape, 15);
      EXPECT_LT(rel_err(moe_init_routing_v2_backward(Gd, idx, N, K, 0), ref::moe_init_routing_v2_backward(Gd, idx, N, K, 0)), tol(dt));
    }
    if (c.name == "dropless") {  // scatter form: dst -> src for the first rows
      Tensor sidx = ints(DType::i32, {N * K}, perm);
      Tensor G2 = randn(DType::f32, {rows, H}, 16);
      auto want = ref::moe_init_routing_v2_backward(G2, idx, N, K, 0);
      EXPECT_LT(rel_err(moe_init_routing_v2_backward(G2, sidx, N, K, 1), want), 1e-6);
      EXPECT_LT(rel_err(ref::moe_init_routing_v2_backward(G2, sidx, N, K, 1), want), 1e-6);
    }
  }
  // v1: expanded_row_idx indexed k-major (c = k*N + n).
  std::vector<int64_t> kmaj(static_cast<size_t>(N * K));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) kmaj[size_t(k * N + n)] = inv[size_t(n * K + k)];
  Tensor G = randn(DType::f32, {N * K, H}, 17);
  Tensor want = ref::moe_init_routing_v2_backward(G, ints(DType::i32, {N * K}, inv), N, K, 0);
  EXPECT_LT(rel_err(moe_init_routing_backward(G, ints(DType::i32, {N * K}, kmaj), N, K), want), 1e-6);
  EXPECT_LT(rel_err(ref::moe_init_routing_backward(G, ints(DType::i32, {N * K}, kmaj), N, K), want), 1e-6);
}

TEST(FinalizeRoutingBackward, AllModesFdAndFast) {
  const int64_t N = 6, K = 2, E = 3, H = 4, C = 3;
  auto ids = random_ids(N, K, E, 20);
  auto inv = invert(stable_perm(ids));
  auto dp = drop_pad_map(ids, E, C);
  for (int mode = 0; mode < 4; ++mode) {
    SCOPED_TRACE("mode " + std::to_string(mode));
    bool pad = mode & 1, col = mode < 2;
    const auto& tm = pad ? dp : inv;  // token-major j -> dst
    std::vector<int64_t> idxv(static_cast<size_t>(N * K));
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) idxv[size_t(col ? k * N + n : n * K + k)] = tm[size_t(n * K + k)];
    std::vector<int64_t> shape = pad ? std::vector<int64_t>{E, C, H} : std::vector<int64_t>{N * K, H};
    int64_t P = pad ? E * C : N * K;
    Tensor idx = ints(DType::i32, {N * K}, idxv), eid = ints(DType::i32, {N, K}, ids);
    Tensor ex = randn(DType::f32, shape, 21), sc = randn(DType::f32, {N, K}, 22), bias = randn(DType::f32, {E, H}, 23);
    Tensor G = randn(DType::f32, {N, H}, 24);
    auto xv = to_vec(ex), sv = to_vec(sc), bv = to_vec(bias), gv = to_vec(G);
    auto loss = [&] {
      double s = 0;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k) {
          int64_t d = tm[size_t(n * K + k)], e = ids[size_t(n * K + k)];
          for (int64_t h = 0; h < H; ++h)
            s += gv[size_t(n * H + h)] * sv[size_t(n * K + k)] * ((d >= 0 ? xv[size_t(d * H + h)] : 0.0) + bv[size_t(e * H + h)]);
        }
      return s;
    };
    auto r = ref::moe_finalize_routing_v2_backward(G, ex, idx, sc, bias, eid, mode);
    EXPECT_LT(rel_err(to_vec(r.d_expanded_x), fd_grad(xv, loss)), 1e-6);
    EXPECT_LT(rel_err(to_vec(r.d_scales), fd_grad(sv, loss)), 1e-6);
    EXPECT_LT(rel_err(to_vec(r.d_bias), fd_grad(bv, loss)), 1e-6);
    EXPECT_EQ(P, r.d_expanded_x.numel() / H);
    for (DType dt : {DType::f32, DType::bf16}) {
      Tensor exd = randn(dt, shape, 25), Gd = randn(dt, {N, H}, 26), bd = randn(dt, {E, H}, 27);
      auto a = moe_finalize_routing_v2_backward(Gd, exd, idx, sc, bd, eid, mode);
      auto b = ref::moe_finalize_routing_v2_backward(Gd, exd, idx, sc, bd, eid, mode);
      EXPECT_LT(rel_err(a.d_expanded_x, b.d_expanded_x), tol(dt));
      EXPECT_LT(rel_err(a.d_scales, b.d_scales), 1e-5);
      EXPECT_LT(rel_err(a.d_bias, b.d_bias), 1e-5);
      // No scales, no bias: K = 1 and the gradient is d_out moved to the rows.
      if (!pad) {
        Tensor idx1 = ints(DType::i32, {N}, {2, 0, 5, 1, 3, 4});
        Tensor ex1 = randn(dt, {N, H}, 28);
        auto c1 = moe_finalize_routing_v2_backward(Gd, ex1, idx1, {}, {}, {}, mode);
        EXPECT_LT(rel_err(c1.d_expanded_x, ref::moe_finalize_routing_v2_backward(Gd, ex1, idx1, {}, {}, {}, mode).d_expanded_x), 1e-6);
        EXPECT_FALSE(c1.d_scales.defined());
      }
    }
  }
}

TEST(RoutingBackwardErrors, BadInputNamesTheArgument) {
  Tensor d = randn(DType::f32, {6, 4}, 1);
  EXPECT_EQ(err_arg([&] { moe_token_permute_backward(d, randn(DType::f32, {6}, 2), 2); }), "sorted_indices");
  EXPECT_EQ(err_arg([&] { moe_token_permute_backward(d, ints(DType::i32, {5}, {0, 1, 2, 3, 4}), 2); }), "sorted_indices");
  EXPECT_EQ(err_arg([&] { moe_token_permute_backward(d, ints(DType::i32, {6}, {0, 1, 2, 3, 4, 5}), 0); }), "topk");
  EXPECT_EQ(err_arg([&] { moe_token_unpermute_backward(d, randn(DType::f32, {6, 4}, 3), ints(DType::i32, {6}, {0, 1, 1, 3, 4, 5})); }),
            "sorted_indices");  // destination used twice
  EXPECT_EQ(err_arg([&] { moe_token_unpermute_backward(d, randn(DType::f32, {6, 3}, 3), ints(DType::i32, {6}, {0, 1, 2, 3, 4, 5})); }),
            "permuted_tokens");
  EXPECT_EQ(err_arg([&] { moe_token_unpermute_backward(d, d, ints(DType::i32, {6}, {0, 1, 2, 3, 4, 5}), randn(DType::f32, {5, 1}, 4)); }),
            "probs");
  EXPECT_EQ(err_arg([&] { moe_init_routing_v2_backward(d, ints(DType::i32, {6}, {0, 1, 2, 3, 4, 5}), 3, 2, 2); }), "row_idx_type");
  EXPECT_EQ(err_arg([&] { moe_init_routing_v2_backward(d, ints(DType::i32, {6}, {0, 1, 2, 3, 4, 9}), 3, 2, 1); }), "expanded_row_idx");
  EXPECT_EQ(err_arg([&] { moe_init_routing_v2_backward(ints(DType::i32, {6, 4}, std::vector<int64_t>(24, 0)), ints(DType::i32, {6}, {0, 1, 2, 3, 4, 5}), 3, 2, 0); }),
            "d_expanded_x");
  Tensor idx = ints(DType::i32, {6}, {0, 1, 2, 3, 4, 5});
  EXPECT_EQ(err_arg([&] { moe_finalize_routing_v2_backward(randn(DType::f32, {3, 4}, 5), d, idx, randn(DType::f32, {3, 2}, 6), {}, {}, 4); }),
            "drop_pad_mode");
  EXPECT_EQ(err_arg([&] { moe_finalize_routing_v2_backward(randn(DType::f32, {3, 4}, 5), d, ints(DType::i32, {6}, {0, 1, 2, 3, 4, -1}), randn(DType::f32, {3, 2}, 6)); }),
            "expanded_row_idx");  // -1 only in drop/pad modes
  EXPECT_EQ(err_arg([&] { moe_finalize_routing_v2_backward(randn(DType::f32, {3, 4}, 5), d, idx, randn(DType::f32, {3, 2}, 6), randn(DType::f32, {2, 4}, 7)); }),
            "expert_idx");  // bias without expert_idx
  EXPECT_EQ(err_arg([&] { moe_finalize_routing_v2_backward(randn(DType::f32, {3, 4}, 5), d, idx, randn(DType::f32, {3, 2}, 6), randn(DType::f32, {2, 4}, 7), ints(DType::i32, {3, 2}, {0, 1, 2, 0, 1, 0})); }),
            "expert_idx");  // id 2 >= E = 2
  EXPECT_EQ(err_arg([&] { moe_finalize_routing_v2_backward(randn(DType::f32, {3, 5}, 5), d, idx, randn(DType::f32, {3, 2}, 6)); }), "expanded_x");
}

}  // namespace

}  // namespace test_routing_backward
