// moe_finalize_routing (v1) and moe_finalize_routing_v2 (drop_pad_mode 0-3: column / row layout,
// dropless [N*K, H] or drop/pad [E, C, H] with -1 rows), each optional input present or not.
#include "fuzz/fuzz_util.h"
#include "ot/moe.h"

using namespace ot;
using namespace ot::moe;

OT_FUZZ_TARGET(in, ar) {
  const bool v1 = in.byte() < 64;
  const int mode = v1 ? 0 : int(in.arg(0, 3));
  const bool pad = mode == 1 || mode == 3;
  const DType t = in.pick({DType::f32, DType::bf16, DType::f16, DType::i32});
  const int64_t N = in.range(0, 6), K = in.range(1, 4), H = in.range(0, 12), E = in.range(1, 5), C = in.range(1, 4);
  std::vector<int64_t> xs = pad ? std::vector<int64_t>{E, C, H} : std::vector<int64_t>{N * K, H};
  if (in.byte() < 6) xs = {N * K + 1};
  fz::Buf& ex = ar.add("expanded_x", t, xs, in.byte() < 40 ? in.range(1, 3) : 0);
  for (int64_t i = 0; i < ex.numel(); ++i) ex.set(i, is_float(t) ? in.grid() : 1.0);
  const int64_t R = pad ? E * C : N * K;
  fz::Buf& idx = ar.add("expanded_row_idx", in.byte() < 252 ? DType::i32 : DType::i64, {in.byte() < 250 ? N * K : N * K + 1});
  for (int64_t i = 0; i < idx.numel(); ++i) idx.set(i, double(in.byte() < 250 ? in.range(pad ? -1 : 0, R - 1) : in.pick<int64_t>({-2, R})));
  auto opt = [&](bool present, const char* name, DType dt, std::vector<int64_t> shape, double lo, double hi) -> TensorView {
    if (!present) return {};
    if (in.byte() < 4) shape.back() += 1;
    fz::Buf& b = ar.add(name, dt, shape);
    for (int64_t i = 0; i < b.numel(); ++i) b.set(i, is_float(dt) ? in.grid(8, lo, hi) : double(in.range(int64_t(lo), int64_t(hi))));
    return b;
  };
  const DType skip_t = in.byte() < 250 ? t : DType::f32;
  TensorView x1 = opt(v1 || in.flag(), "x1", skip_t, {N, H}, -4, 4);
  TensorView x2 = opt(in.flag(), "x2", skip_t, {N, H}, -4, 4);
  TensorView bias = opt(v1 || in.flag(), "bias", skip_t, {E, H}, -4, 4);
  TensorView scales = opt(v1 || in.byte() < 200, "scales", in.pick({DType::f32, DType::bf16, t}), {N, K}, 0, 1);
  fz::Buf* eid = nullptr;
  if (v1 || in.flag()) {
    eid = &ar.add("expert_idx", in.byte() < 252 ? DType::i32 : DType::i64, {N, in.byte() < 250 ? K : K + 1});
    for (int64_t i = 0; i < eid->numel(); ++i) eid->set(i, double(in.byte() < 250 ? in.range(0, E - 1) : in.pick<int64_t>({-1, E})));
  }
  TensorView eidx = eid ? eid->view() : TensorView{};
  ar.seal();
  // Sums of up to 2 + K terms of size <= 8 each.
  const double atol = fz::rtol_of(t) * 8.0 * double(K + 2);
  auto cmp = [&](auto& a, auto& b) { fz::expect_close("out", a, b, fz::rtol_of(t), atol); };
  if (v1) {
    // v1 has no reference entry of its own: it is v2 in mode 0 with x1 = skip1, x2 = skip2.
    fz::run_both(
        "moe_finalize_routing", [&] { return moe_finalize_routing(ex, x1, x2, bias, scales, idx, eidx); },
        [&] { return ref::moe_finalize_routing_v2(ex, idx, x1, x2, bias, scales, eidx, 0); }, cmp);
  } else {
    fz::run_both(
        "moe_finalize_routing_v2", [&] { return moe_finalize_routing_v2(ex, idx, x1, x2, bias, scales, eidx, mode); },
        [&] { return ref::moe_finalize_routing_v2(ex, idx, x1, x2, bias, scales, eidx, mode); }, cmp);
  }
  ar.check();
}
