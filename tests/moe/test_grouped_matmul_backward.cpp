// grouped_matmul_backward and act_backward: the reference against finite differences of an fp64
// forward, the fast path against the reference (dtypes, group_list forms, empty groups,
// activations, stored pre-activation, strided and accumulated weight gradients), bad input.
#include <gtest/gtest.h>

#include <cmath>

#include "moe/moe_bwd_test_util.h"
#include "ot/cpu.h"
#include "ot/error.h"
#include "ot/moe_bwd.h"

namespace test_grouped_matmul_backward {
using namespace ot;
using namespace ot::moe;
using namespace ot::moe::bwdtest;
using gemm::Act;

namespace {

double act_f(Act a, double z) {
  switch (a) {
    case Act::relu: return z > 0 ? z : 0;
    case Act::gelu: return 0.5 * z * (1 + std::erf(z / std::sqrt(2.0)));
    case Act::silu: return z / (1 + std::exp(-z));
    default: return z;
  }
}

struct GmmCase {
  std::vector<int64_t> counts;  // rows per group
  int64_t K, N;
  Act act;
  bool bias;
};

// fp64 forward: y = act(x_g @ W_g + b_g), rows grouped by counts.
std::vector<double> gmm_fwd64(const GmmCase& c, const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b) {
  int64_t K = c.K, N = c.N, no = c.act == Act::swiglu ? N / 2 : N, off = 0, M = 0;
  for (auto n : c.counts) M += n;
  std::vector<double> y(static_cast<size_t>(M * no)), z(static_cast<size_t>(N));
  for (size_t g = 0; g < c.counts.size(); ++g) {
    for (int64_t m = off; m < off + c.counts[g]; ++m) {
      for (int64_t n = 0; n < N; ++n) {
        double s = c.bias ? b[g * N + n] : 0;
        for (int64_t k = 0; k < K; ++k) s += x[m * K + k] * w[(g * K + k) * N + n];
        z[size_t(n)] = s;
      }
      for (int64_t n = 0; n < no; ++n)
        y[size_t(m * no + n)] = c.act == Act::swiglu ? act_f(Act::silu, z[size_t(n)]) * z[size_t(n + no)] : act_f(c.act, z[size_t(n)]);
    }
    off += c.counts[g];
  }
  return y;
}

Tensor group_list_of(const std::vector<int64_t>& counts, int type, DType t = DType::i64) {
  int64_t G = int64_t(counts.size());
  if (type == 2) {
    std::vector<int64_t> kv;
    for (int64_t g = 0; g < G; ++g)
      if (counts[size_t(g)]) { kv.push_back(g); kv.push_back(counts[size_t(g)]); }
    while (int64_t(kv.size()) < 2 * G) kv.push_back(0);
    return ints(t, {G, 2}, kv);
  }
  std::vector<int64_t> v(counts);
  if (type == 0)
    for (size_t g = 1; g < v.size(); ++g) v[g] += v[g - 1];
  return ints(t, {G}, v);
}

class GmmBwdFd : public ::testing::TestWithParam<Act> {};

TEST_P(GmmBwdFd, ReferenceMatchesFiniteDifferences) {
  GmmCase c{{3, 0, 4, 2}, 5, 6, GetParam(), true};
  int64_t G = 4, M = 9, no = c.act == Act::swiglu ? c.N / 2 : c.N;
  Tensor x = randn(DType::f32, {M, c.K}, 1), w = randn(DType::f32, {G, c.K, c.N}, 2, 0.5), b = randn(DType::f32, {G, c.N}, 3, 0.3);
  Tensor gy = randn(DType::f32, {M, no}, 4);
  auto xv = to_vec(x), wv = to_vec(w), bv = to_vec(b), gv = to_vec(gy);
  auto loss = [&] {
    auto y = gmm_fwd64(c, xv, wv, bv);
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += y[i] * gv[i];
    return s;
  };
  GroupedMatmulBackwardOptions opt;
  opt.act = c.act;
  opt.group_list_type = 1;
  opt.bias = b;
  opt.need_dbias = true;
  auto gl = group_list_of(c.counts, 1);
  auto r = ref::grouped_matmul_backward(gy, x, w, gl, opt);
  EXPECT_LT(rel_err(to_vec(r.dx), fd_grad(xv, loss)), 1e-6);
  EXPECT_LT(rel_err(to_vec(r.dweight), fd_grad(wv, loss)), 1e-6);
  auto fdb = fd_grad(bv, loss);
  EXPECT_LT(rel_err(to_vec(r.dbias), fdb), 1e-6);
  // Group 1 has no rows: its weight and bias gradients are exactly zero.
  for (int64_t i = 0; i < c.K * c.N; ++i) EXPECT_EQ(r.dweight.ptr<float>()[c.K * c.N + i], 0.f);
}
INSTANTIATE_TEST_SUITE_P(Acts, GmmBwdFd, ::testing::Values(Act::none, Act::relu, Act::gelu, Act::silu, Act::swiglu));

struct FastCase {
  std::vector<int64_t> counts;
  int64_t K, N;
  Act act;
  DType dt;
  int type;
};

void check_fast_vs_ref(const FastCase& c, bool with_bias, bool give_pre_act) {
  int64_t G = int64_t(c.counts.size()), M = 0, no = c.act == Act::swiglu ? c.N / 2 : c.N;
  for (auto n : c.counts) M += n;
  Tensor x = randn(c.dt, {M, c.K}, 11), w = randn(c.dt, {G, c.K, c.N}, 12, 0.2), b = randn(DType::f32, {G, c.N}, 13, 0.1);
  Tensor dy = randn(c.dt, {M, no}, 14);
  GroupedMatmulBackwardOptions opt;
  opt.group_list_type = c.type;
  opt.act = c.act;
  if (with_bias) opt.bias = b;
  opt.need_dbias = true;
  Tensor z;
  if (give_pre_act && c.act != Act::none) {  // z from the fp64 forward, stored as fp32
    GmmCase gc{c.counts, c.K, c.N, Act::none, with_bias};
    z = from_vec(DType::f32, {M, c.N}, gmm_fwd64(gc, to_vec(x), to_vec(w), to_vec(b)));
    opt.pre_act = z;
  }
  auto gl = group_list_of(c.counts, c.type, c.type == 1 ? DType::i32 : DType::i64);
  auto want = ref::grouped_matmul_backward(dy, x, w, gl, opt);
  auto got = grouped_matmul_backward(dy, x, w, gl, opt);
  double t = tol(c.dt);
  EXPECT_LT(rel_err(got.dx, want.dx), t) << "dx";
  EXPECT_LT(rel_err(got.dweight, want.dweight), t) << "dweight";
  EXPECT_LT(rel_err(got.dbias, want.dbias), t) << "dbias";
  EXPECT_EQ(got.dx.dtype(), c.dt);
  EXPECT_EQ(got.dweight.dtype(), DType::f32);
}

TEST(GmmBwdFast, MatchesReference) {
  for (DType dt : {DType::f32, DType::bf16})
    for (int type : {0, 1, 2})
      for (Act act : {Act::none, Act::swiglu, Act::gelu}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " type " + std::to_string(type) + " " + gemm::act_name(act));
        check_fast_vs_ref({{5, 0, 17, 1, 0, 9}, 24, 16, act, dt, type}, true, false);
      }
}

TEST(GmmBwdFast, EdgeShapes) {
  check_fast_vs_ref({{0, 0, 0}, 8, 6, Act::swiglu, DType::f32, 0}, true, false);  // M = 0
  check_fast_vs_ref({{1}, 3, 2, Act::silu, DType::f32, 1}, false, false);          // one row, one group
  check_fast_vs_ref({{33}, 7, 10, Act::relu, DType::bf16, 0}, true, false);        // all rows on one group
  check_fast_vs_ref({{2, 3, 1, 4, 2, 1, 0, 3, 2, 1}, 12, 8, Act::swiglu, DType::f32, 1}, false, true);  // many groups, stored z
  check_fast_vs_ref({{4, 6}, 9, 12, Act::swiglu, DType::bf16, 2}, true, true);
}

TEST(GmmBwdFast, ForceRefRoutesToReference) {
  cpu::ScopedForceRef force(true);
  check_fast_vs_ref({{3, 2}, 4, 6, Act::swiglu, DType::bf16, 0}, true, false);
}

TEST(GmmBwdFast, StridedAccumulatedWeightGradient) {
  // The weight is a transposed view of torch's [G, N, K]; dW goes into a [G, N, K] fp32 buffer
  // through its transposed view, added to what is there (gradient accumulation).
  int64_t G = 3, K = 10, N = 6, M = 9;
  std::vector<int64_t> counts{4, 0, 5};
  Tensor wt = randn(DType::f32, {G, N, K}, 21);
  TensorView w(wt.view().data, DType::f32, {G, K, N}, {N * K, 1, K});
  Tensor x = randn(DType::f32, {M, K}, 22), dy = randn(DType::f32, {M, N}, 23);
  auto gl = group_list_of(counts, 1);
  Tensor acc = randn(DType::f32, {G, N, K}, 24);
  auto before = to_vec(acc);
  GroupedMatmulBackwardOptions opt;
  opt.group_list_type = 1;
  opt.dweight_out = TensorView(acc.view().data, DType::f32, {G, K, N}, {N * K, 1, K});
  opt.accumulate = true;
  auto got = grouped_matmul_backward(dy, x, w, gl, opt);
  EXPECT_FALSE(got.dweight.defined());
  GroupedMatmulBackwardOptions plain;
  plain.group_list_type = 1;
  auto want = ref::grouped_matmul_backward(dy, x, w, gl, plain);
  std::vector<double> expect(before);
  for (int64_t g = 0; g < G; ++g)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t n = 0; n < N; ++n) expect[size_t((g * N + n) * K + k)] += want.dweight.ptr<float>()[(g * K + k) * N + n];
  EXPECT_LT(rel_err(to_vec(acc), expect), 1e-6);
  EXPECT_LT(rel_err(got.dx, want.dx), 1e-5);
}

TEST(GmmBwdFast, KeyValueWithRepeatedGroup) {
  // (group, count) rows may name a group twice: both blocks add into its gradient.
  int64_t K = 5, N = 4, M = 7;
  Tensor x = randn(DType::f32, {M, K}, 31), w = randn(DType::f32, {3, K, N}, 32), dy = randn(DType::f32, {M, N}, 33);
  Tensor gl = ints(DType::i64, {3, 2}, {2, 3, 0, 1, 2, 3});
  GroupedMatmulBackwardOptions opt;
  opt.group_list_type = 2;
  opt.need_dbias = true;
  auto want = ref::grouped_matmul_backward(dy, x, w, gl, opt);
  auto got = grouped_matmul_backward(dy, x, w, gl, opt);
  EXPECT_LT(rel_err(got.dweight, want.dweight), 1e-5);
  EXPECT_LT(rel_err(got.dbias, want.dbias), 1e-5);
  double s = 0;
  for (int64_t i = 0; i < K * N; ++i) s += std::fabs(got.dweight.ptr<float>()[K * N + i]);
  EXPECT_EQ(s, 0.0);  // group 1 never appears
}

TEST(ActBackward, FastMatchesReferenceAndFd) {
  for (Act act : {Act::relu, Act::gelu, Act::silu, Act::swiglu}) {
    int64_t M = 5, N = 8, no = act == Act::swiglu ? 4 : 8;
    Tensor z = randn(DType::f32, {M, N}, 41), dy = randn(DType::f32, {M, no}, 42);
    Tensor a = Tensor::empty(DType::f32, {M, N}), b = Tensor::empty(DType::f32, {M, N});
    act_backward(act, z, dy, a);
    ref::act_backward(act, z, dy, b);
    EXPECT_LT(rel_err(a, b), 1e-6) << gemm::act_name(act);
    auto zv = to_vec(z), gv = to_vec(dy);
    auto loss = [&] {
      double s = 0;
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < no; ++n) {
          double y = act == Act::swiglu ? act_f(Act::silu, zv[size_t(m * N + n)]) * zv[size_t(m * N + n + no)] : act_f(act, zv[size_t(m * N + n)]);
          s += y * gv[size_t(m * no + n)];
        }
      return s;
    };
    EXPECT_LT(rel_err(to_vec(b), fd_grad(zv, loss)), 1e-6) << gemm::act_name(act);
  }
}

// The SwiGLU pass's vector forms (AVX-512, AVX2) and the scalar one at every ISA level up to the
// detected one: widths below, at and past the vector lengths (tails of 1..7 and 1..15 columns),
// fp32 and bf16 storage, against the reference.
TEST(ActBackward, SwigluFormsAcrossIsasWidthsAndDtypes) {
  for (int i = 0; i <= int(cpu::detected_isa()); ++i) {
    cpu::ScopedMaxIsa cap{cpu::Isa(i)};
    for (DType dt : {DType::f32, DType::bf16})
      for (int64_t no : {3, 8, 19, 40}) {
        const int64_t M = 3;
        Tensor z = randn(dt, {M, 2 * no}, uint64_t(50 + no)), dy = randn(dt, {M, no}, uint64_t(60 + no));
        Tensor a = Tensor::empty(dt, {M, 2 * no}), b = Tensor::empty(dt, {M, 2 * no});
        act_backward(Act::swiglu, z, dy, a);
        ref::act_backward(Act::swiglu, z, dy, b);
        // bf16 dz: both round once, fp32 math against fp64 can fall on either side of a tie
        EXPECT_LT(rel_err(a, b), dt == DType::bf16 ? 8e-3 : 1e-6) << cpu::isa_name(cpu::Isa(i)) << " " << dtype_name(dt) << " N " << no;
      }
  }
}

TEST(GmmBwdErrors, BadInputNamesTheArgument) {
  Tensor x = randn(DType::f32, {6, 4}, 1), w = randn(DType::f32, {2, 4, 3}, 2), dy = randn(DType::f32, {6, 3}, 3);
  auto arg_of = [&](const TensorView& dyv, const TensorView& xv, const TensorView& wv, const TensorView& gl, GroupedMatmulBackwardOptions o) {
    try {
      grouped_matmul_backward(dyv, xv, wv, gl, o);
    } catch (const Error& e) {
      return e.arg();
    }
    return std::string("no error");
  };
  GroupedMatmulBackwardOptions o;
  EXPECT_EQ(arg_of(dy, x, w, ints(DType::i64, {2}, {4, 3}), o), "group_list");       // cumsum not monotone
  EXPECT_EQ(arg_of(dy, x, w, ints(DType::i64, {2}, {2, 5}), o), "group_list");       // total 5 != 6
  EXPECT_EQ(arg_of(dy, x, w, ints(DType::i64, {3}, {2, 4, 6}), o), "group_list");    // 3 entries for 2 groups
  o.group_list_type = 2;
  EXPECT_EQ(arg_of(dy, x, w, ints(DType::i64, {1, 2}, {2, 6}), o), "group_list");    // group id 2 >= G
  o.group_list_type = 1;
  EXPECT_EQ(arg_of(dy, x, w, ints(DType::i64, {2}, {-1, 7}), o), "group_list");      // negative count
  EXPECT_EQ(arg_of(dy, x, w, randn(DType::f32, {2}, 4), o), "group_list");           // not integer
  auto gl = ints(DType::i64, {2}, {2, 4});
  EXPECT_EQ(arg_of(randn(DType::f32, {6, 4}, 5), x, w, gl, o), "dy");                // wrong N
  EXPECT_EQ(arg_of(dy, x, randn(DType::f32, {2, 5, 3}, 6), gl, o), "weight");        // K mismatch
  EXPECT_EQ(arg_of(dy, ints(DType::i32, {6, 4}, std::vector<int64_t>(24, 0)), w, gl, o), "x");
  o.act = Act::swiglu;
  EXPECT_EQ(arg_of(randn(DType::f32, {6, 1}, 7), x, w, gl, o), "weight");            // odd N for swiglu
  o.act = Act::none;
  o.bias = randn(DType::f32, {2, 4}, 8);
  EXPECT_EQ(arg_of(dy, x, w, gl, o), "bias");
  o.bias = {};
  o.dweight_out = randn(DType::f32, {2, 3, 4}, 9);
  EXPECT_EQ(arg_of(dy, x, w, gl, o), "dweight_out");
  // Nothing written before the error: the caller's buffer is unchanged.
  Tensor keep = randn(DType::f32, {2, 4, 3}, 10);
  auto before = to_vec(keep);
  o.dweight_out = keep;
  o.accumulate = true;
  EXPECT_EQ(arg_of(dy, x, w, ints(DType::i64, {2}, {2, 5}), o), "group_list");
  EXPECT_EQ(to_vec(keep), before);
}

}  // namespace

}  // namespace test_grouped_matmul_backward
