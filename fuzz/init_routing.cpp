// moe_init_routing (v1: any row_idx permutation, active_num) and moe_init_routing_v2 (dropless /
// drop-pad with capacity, expert_num given or derived, cumsum / count / key_value counts, active
// expert ranges, gather / scatter row_idx, no quant / per-token scale / static / dynamic int8).
#include "fuzz/fuzz_util.h"
#include "ot/moe.h"

using namespace ot;
using namespace ot::moe;

namespace {

// Expert ids: mostly in [0, E] (E = finished), sometimes anything.
void fill_ids(fz::Input& in, fz::Buf& b, int64_t E) {
  for (int64_t i = 0; i < b.numel(); ++i) b.set(i, in.byte() < 250 ? double(in.range(0, E)) : double(in.pick<int64_t>({-1, E + 1, 1 << 24})));
}

void v1(fz::Input& in, fz::Arena& ar) {
  const DType xt = in.pick({DType::f32, DType::bf16, DType::f16, DType::i8});
  const int64_t N = in.range(0, 8), H = in.range(0, 12), K = in.range(1, 4), E = in.range(1, 10);
  fz::Buf& x = ar.values(in, "x", xt, {N, H}, in.byte() < 40 ? in.range(1, 3) : 0);
  fz::Buf& eid = ar.add("expert_idx", in.byte() < 250 ? DType::i32 : DType::i64, {N, K});
  fill_ids(in, eid, E);
  // row_idx: the router's k-major numbering, or a permutation from the input; rarely broken.
  const int64_t kN = in.byte() < 250 ? K : K + 1;
  fz::Buf& rid = ar.add("row_idx", DType::i32, {N, kN});
  std::vector<int64_t> perm(size_t(N * kN));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < kN; ++k) perm[size_t(n * kN + k)] = k * N + n;
  if (in.flag())
    for (size_t i = perm.size(); i > 1; --i) std::swap(perm[i - 1], perm[size_t(in.range(0, int64_t(i) - 1))]);
  if (!perm.empty() && in.byte() < 6) perm[size_t(in.range(0, int64_t(perm.size()) - 1))] = in.pick<int64_t>({-1, 0, N * K});
  for (size_t i = 0; i < perm.size(); ++i) rid.set(int64_t(i), double(perm[i]));
  const int64_t active = in.arg(0, N + 1);
  ar.seal();
  fz::run_both(
      "moe_init_routing", [&] { return moe_init_routing(x, rid, eid, active); }, [&] { return ref::moe_init_routing(x, rid, eid, active); },
      [&](auto& a, auto& b) {
        fz::expect_close("expanded_x", a.expanded_x, b.expanded_x);
        fz::expect_close("expanded_row_idx", a.expanded_row_idx, b.expanded_row_idx);
        fz::expect_close("expanded_expert_idx", a.expanded_expert_idx, b.expanded_expert_idx);
      });
}

void v2(fz::Input& in, fz::Arena& ar) {
  const DType xt = in.pick({DType::f32, DType::bf16, DType::f16, DType::f32});
  const int64_t N = in.range(0, 8), H = in.range(0, 12), K = in.range(1, 4), E = in.range(1, 10);
  fz::Buf& x = ar.values(in, "x", xt, {N, H}, in.byte() < 40 ? in.range(1, 3) : 0);
  if (x.numel() > 0 && in.byte() < 4) x.set(in.range(0, x.numel() - 1), in.pick({std::nan(""), HUGE_VAL}));
  fz::Buf& eid = ar.add("expert_idx", DType::i32, {N, K});
  fill_ids(in, eid, E);
  InitRoutingV2Options o;
  o.expert_num = in.byte() < 64 ? -1 : in.arg(1, E);
  o.drop_pad_mode = int(in.arg(0, 1));
  o.expert_capacity = in.arg(1, std::max<int64_t>(N, 1));
  o.expert_tokens_num_type = int(in.arg(0, 2));
  o.quant_mode = int(in.arg(-1, 1));
  o.row_idx_type = int(in.arg(0, 1));
  o.active_num = in.pick<int64_t>({-1, 0, in.range(1, N * K + 1), -2});
  if (in.byte() < 80) {
    o.active_expert_range[0] = in.arg(0, E);
    o.active_expert_range[1] = in.arg(0, E);
  }
  // Scales: the shape each mode wants, mostly; per expert of the active range for dynamic quant.
  int64_t range_len = std::max<int64_t>(o.expert_num, 1);
  if ((o.active_expert_range[0] || o.active_expert_range[1]) &&
      __builtin_sub_overflow(o.active_expert_range[1], o.active_expert_range[0], &range_len))
    range_len = 0;  // the extreme ends the input can pick: the call must reject them
  if (in.byte() < 160) {
    std::vector<int64_t> shape = o.quant_mode == 0 ? std::vector<int64_t>{1}
                                 : o.quant_mode == 1 ? (in.flag() ? std::vector<int64_t>{1, H} : std::vector<int64_t>{std::clamp<int64_t>(range_len, 0, 16), H})
                                                     : std::vector<int64_t>{N};
    if (in.byte() < 8) shape.push_back(2);
    fz::Buf& s = ar.add("scale", in.byte() < 250 ? DType::f32 : DType::bf16, shape);
    for (int64_t i = 0; i < s.numel(); ++i) s.set(i, in.pick({0.5, 2.0, 1.0, 0.25, 8.0, in.byte() < 8 ? 0.0 : 1.5}));
    o.scale = s;
  }
  if (in.byte() < 40) {
    fz::Buf& off = ar.add("offset", DType::f32, {1});
    off.set(0, in.grid());
    o.offset = off;
  }
  ar.seal();
  fz::run_both(
      "moe_init_routing_v2", [&] { return moe_init_routing_v2(x, eid, o); }, [&] { return ref::moe_init_routing_v2(x, eid, o); },
      [&](auto& a, auto& b) {
        // int8 rows: the quantisation rounds x * scale, which the two sides may round apart by 1.
        fz::expect_close("expanded_x", a.expanded_x, b.expanded_x, 0, a.expanded_x.dtype() == DType::i8 ? 1 : 0);
        fz::expect_close("expanded_row_idx", a.expanded_row_idx, b.expanded_row_idx);
        fz::expect_close("expert_tokens", a.expert_tokens, b.expert_tokens);
        fz::expect_close("expanded_scale", a.expanded_scale, b.expanded_scale, 1e-5, 1e-7);
        FZ_ASSERT(a.dropped == b.dropped, "dropped ", a.dropped, " vs reference ", b.dropped);
        FZ_ASSERT(a.available == b.available, "available ", a.available, " vs reference ", b.available);
      });
}

}  // namespace

OT_FUZZ_TARGET(in, ar) {
  if (in.flag()) v1(in, ar);
  else v2(in, ar);
  ar.check();
}
