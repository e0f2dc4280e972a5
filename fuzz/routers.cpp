// Routers: moe_gating_top_k_softmax (v1), _v2 (renorm 0/1, output_softmax), moe_gating_top_k
// (softmax / sigmoid, bias, groups, scaling), each with finished / allowed masks, strided x, NaN/Inf.
#include "fuzz/fuzz_util.h"
#include "ot/moe.h"

using namespace ot;
using namespace ot::moe;

namespace {

void compare(const GatingResult& a, const GatingResult& b, DType xt) {
  fz::expect_close("expert_idx", a.expert_idx, b.expert_idx);
  fz::expect_close("row_idx", a.row_idx, b.row_idx);
  fz::expect_close("y", a.y, b.y, fz::rtol_of(xt), 1e-6);
  fz::expect_close("scores", a.scores, b.scores, 1e-5, 1e-6);
}

}  // namespace

OT_FUZZ_TARGET(in, ar) {
  const int kind = int(in.range(0, 2));  // 0 v1, 1 v2, 2 gating_top_k
  const DType xt = in.pick({DType::f32, DType::bf16, DType::f16, DType::f32, DType::i32});
  const bool three_d = kind < 2 && in.byte() < 64;
  const int64_t E = in.range(1, 72);
  std::vector<int64_t> shape = three_d ? std::vector<int64_t>{in.range(0, 3), in.range(0, 4), E} : std::vector<int64_t>{in.range(0, 9), E};
  const int64_t k = in.arg(1, std::min<int64_t>(E, 9));
  const int64_t pad = in.byte() < 48 ? in.range(1, 5) : 0;

  GatingTopKOptions g;
  bool top2_sum = false;
  if (kind == 2) {
    g.k = k;
    g.norm_type = int(in.arg(0, 1));
    // Groups: a divisor of E mostly, sometimes anything.
    std::vector<int64_t> divs;
    for (int64_t d = 1; d <= E; ++d)
      if (E % d == 0) divs.push_back(d);
    g.group_count = in.byte() < 240 ? divs[size_t(in.range(0, int64_t(divs.size()) - 1))] : in.arg(1, E);
    g.k_group = in.arg(1, std::max<int64_t>(1, g.group_count));
    g.group_select_mode = int(in.arg(0, 1));
    top2_sum = g.group_select_mode == 1;
    g.renorm = in.byte() < 8 ? 1 : 0;
    g.out_flag = in.flag();
    g.routed_scaling_factor = in.pick({1.f, 2.5f, 0.5f, 1.f, std::numeric_limits<float>::infinity()});
    g.eps = in.pick({1e-20f, 0.f, 1e-6f, -1.f});
  }
  // Top-2 group sums of different experts must not tie up to rounding: logits on a coarser grid
  // in [0, 4] (no sigmoid/exp identities there) and one bias value for the whole row.
  fz::Buf& x = ar.add("x", xt, shape, pad);
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, top2_sum ? in.grid(4, 0, 4) : in.grid());
  if (x.numel() > 0 && in.byte() < 6 && is_float(xt))
    x.set(in.range(0, x.numel() - 1), in.pick({std::nan(""), HUGE_VAL, -HUGE_VAL}));

  std::vector<int64_t> row_shape(shape.begin(), shape.end() - 1);
  TensorView finished, allowed;
  if (kind < 2 && in.byte() < 96) {
    // Mostly the right shape, sometimes a wrong one or a wrong dtype.
    std::vector<int64_t> fs = in.byte() < 245 ? row_shape : std::vector<int64_t>{in.range(0, 9)};
    fz::Buf& f = ar.add("finished", in.byte() < 250 ? DType::u8 : DType::i32, fs);
    for (int64_t i = 0; i < f.numel(); ++i) f.set(i, in.byte() % 3 == 0);
    finished = f;
  }
  if (in.byte() < 96) {
    std::vector<int64_t> as = in.byte() < 245 ? shape : std::vector<int64_t>{shape[0], E + 1};
    fz::Buf& a = ar.add("allowed", DType::u8, as);
    const int dens = in.byte();
    for (int64_t i = 0; i < a.numel(); ++i) a.set(i, in.byte() < dens ? 0 : 1 + in.byte() % 3);
    allowed = a;
  }
  if (kind == 2) {
    g.allowed = allowed;
    if (in.byte() < 96) {
      const DType bt = in.pick({DType::f32, DType::bf16, DType::f32, DType::i32});
      fz::Buf& b = ar.add("bias", bt, {in.byte() < 245 ? E : E + 1});
      const double b0 = in.range(-2, 2) * 0.5;
      for (int64_t i = 0; i < b.numel(); ++i) b.set(i, top2_sum ? b0 : in.range(-2, 2) * 0.5);
      if (in.byte() < 4 && is_float(bt)) b.set(0, std::nan(""));
      g.bias = b;
    }
  }
  ar.seal();

  const int renorm = int(in.arg(0, 1));
  const bool out_softmax = in.flag();
  if (kind == 0)
    fz::run_both(
        "moe_gating_top_k_softmax", [&] { return moe_gating_top_k_softmax(x, k, finished, allowed); },
        [&] { return ref::moe_gating_top_k_softmax(x, k, finished, allowed); }, [&](auto& a, auto& b) { compare(a, b, xt); });
  else if (kind == 1)
    fz::run_both(
        "moe_gating_top_k_softmax_v2", [&] { return moe_gating_top_k_softmax_v2(x, k, finished, renorm, out_softmax, allowed); },
        [&] { return ref::moe_gating_top_k_softmax_v2(x, k, finished, renorm, out_softmax, allowed); },
        [&](auto& a, auto& b) { compare(a, b, xt); });
  else
    fz::run_both(
        "moe_gating_top_k", [&] { return moe_gating_top_k(x, g); }, [&] { return ref::moe_gating_top_k(x, g); },
        [&](auto& a, auto& b) { compare(a, b, xt); });
  ar.check();
}
