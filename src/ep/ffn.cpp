// Local expert compute (the seam to the MoE layer's grouped FFN) and the pipelined ep_moe_ffn:
// chunk c+1's dispatch and chunk c-1's combine are in flight while chunk c's experts run, and each
// chunk's own-rank rows are computed before its remote rows have arrived.
#include <algorithm>

#include "ot/moe/ffn.h"
#include "ot/moe/quant_experts.h"
#include "ot/numeric.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "src/core/elem_at.h"
#include "src/ep/internal.h"

namespace ot::ep {

// Float rows of x in the expert dtype.
static Tensor as_dtype(const ExpertBatch& b, DType dt) {
  const int64_t A = b.x.size(0), H = b.x.size(1);
  Tensor out = Tensor::empty(dt, {A, H});
  parallel_for(A, [&](int64_t r0, int64_t r1) {
    std::vector<float> row(static_cast<size_t>(H));
    for (int64_t r = r0; r < r1; ++r) {
      load_row_f32(row_at(b.x, r), b.x.dtype, H, row.data());
      convert_from_f32(row.data(), row_at(out, r), dt, H);
    }
  });
  return out;
}

ExpertFn swiglu_experts(std::vector<const gemm::PackedB*> gate_up, std::vector<const gemm::PackedB*> down) {
  OT_CHECK(gate_up.size() == down.size(), "swiglu_experts", "down", "one weight per local expert, as gate_up", down.size());
  for (size_t l = 0; l < gate_up.size(); ++l) {
    OT_CHECK(gate_up[l] && down[l], "swiglu_experts", "gate_up/down", "non-null packed weights", "null at ", l);
    OT_CHECK(gate_up[l]->N() == 2 * down[l]->K() && down[l]->N() == gate_up[l]->K(), "swiglu_experts", "down",
             "[I, H] with gate_up [H, 2I]", down[l]->K(), "x", down[l]->N(), " vs ", gate_up[l]->K(), "x", gate_up[l]->N());
  }
  return [gate_up = std::move(gate_up), down = std::move(down)](const ExpertBatch& b) {
    const int64_t A = b.x.size(0), H = b.x.size(1);
    int64_t I = 0;
    for (int64_t e : b.expert) {
      OT_CHECK(e >= 0 && e < int64_t(gate_up.size()), "swiglu_experts", "expert", "a local expert index", e);
      OT_CHECK(gate_up[size_t(e)]->K() == H, "swiglu_experts", "x", "H equal to the weights' H", H);
      I = std::max(I, down[size_t(e)]->K());
    }
    if (b.expert.empty()) return;
    // int8 rows (dispatch quant) go into the grouped GEMM as they are: the engine's int8 A operand
    // (exact i8 -> bf16/fp32 in the A pack, the row's dynamic scale on the accumulator before the
    // SwiGLU), never dequantised in memory.
    const TensorView& xin = b.x;
    const float* xscale = b.x.dtype == DType::i8 ? b.dynamic_scales.ptr<float>() : nullptr;
    Tensor hbuf = Tensor::empty(DType::f32, {std::max<int64_t>(A, 1), std::max<int64_t>(I, 1)});
    const size_t xes = dtype_size(xin.dtype), yes = dtype_size(b.y.dtype);
    std::vector<gemm::Group> up, dn;
    for (size_t g = 0; g < b.expert.size(); ++g) {
      int64_t r0 = b.row_begin[g], M = b.rows[g], l = b.expert[g];
      if (M == 0) continue;
      gemm::Group u;
      u.M = M;
      u.a = {static_cast<const char*>(xin.data) + r0 * xin.stride(0) * int64_t(xes), xin.dtype, xin.stride(0), nullptr,
             xscale ? xscale + r0 : nullptr};  // the scale is indexed like the rows
      u.b = gate_up[size_t(l)];
      u.c = {hbuf.ptr<float>() + r0 * I, DType::f32, I};
      u.ep.act = gemm::Act::swiglu;
      up.push_back(u);
      gemm::Group d;
      d.M = M;
      d.a = {hbuf.ptr<float>() + r0 * I, DType::f32, I, nullptr};
      d.b = down[size_t(l)];
      d.c = {static_cast<char*>(b.y.data) + r0 * b.y.stride(0) * int64_t(yes), b.y.dtype, b.y.stride(0)};
      dn.push_back(d);
    }
    // A few pieces with progress calls between them keep the transfers in flight moving.
    const int64_t n = int64_t(up.size()), piece = std::max<int64_t>(1, (n + 3) / 4);
    for (auto* gs : {&up, &dn})
      for (int64_t i = 0; i < n; i += piece) {
        gemm::grouped_gemm(gs->data() + i, std::min(piece, n - i));
        if (b.progress) b.progress();
      }
  };
}

// The batch's rows per local expert in batch order (gather = scatter = the expand_x row, so y keeps
// its layout), after checking x against the store's H; idx holds the row ids the returned
// ExpertRows point into.
static moe::ExpertRows rows_by_expert(const ExpertBatch& b, int64_t L, int64_t H, std::vector<int32_t>& idx) {
  const char* op = "ep::moe_experts";
  OT_CHECK(b.x.ndim == 2 && b.x.size(1) == H, op, "x", "[A, H] with the store's H", b.x.shape_str());
  std::vector<std::vector<int32_t>> by(static_cast<size_t>(L));
  for (size_t g = 0; g < b.expert.size(); ++g) {
    OT_CHECK(b.expert[g] >= 0 && b.expert[g] < L, op, "expert", "a local expert of the store", b.expert[g]);
    for (int64_t i = 0; i < b.rows[g]; ++i) by[size_t(b.expert[g])].push_back(int32_t(b.row_begin[g] + i));
  }
  moe::ExpertRows rows;
  rows.offsets.push_back(0);
  for (const auto& v : by) {
    idx.insert(idx.end(), v.begin(), v.end());
    rows.offsets.push_back(int64_t(idx.size()));
  }
  rows.gather = rows.scatter = idx.data();
  return rows;
}

ExpertFn moe_experts(const moe::MoeExperts& local) {
  return [&local](const ExpertBatch& b) {
    std::vector<int32_t> idx;
    const moe::ExpertRows rows = rows_by_expert(b, local.num_experts(), local.hidden(), idx);
    if (idx.empty()) return;
    Tensor conv;
    TensorView xin = b.x, xscale;
    if (b.x.dtype == DType::i8) {
      xscale = b.dynamic_scales;  // int8 rows straight into the grouped GEMM (int8 A operand)
    } else if (b.x.dtype != local.dtype()) {
      conv = as_dtype(b, local.dtype());
      xin = conv.view();
    }
    moe::moe_expert_ffn(xin, local, rows, b.y, false, xscale);
    if (b.progress) b.progress();
  };
}

ExpertFn moe_experts(const moe::QuantMoeExperts& local) {
  return [&local](const ExpertBatch& b) {
    std::vector<int32_t> idx;
    const moe::ExpertRows rows = rows_by_expert(b, local.num_experts(), local.hidden(), idx);
    if (idx.empty()) return;
    moe::moe_expert_ffn(b.x, local, rows, b.y, false, b.x.dtype == DType::i8 ? b.dynamic_scales : TensorView());
    if (b.progress) b.progress();
  };
}

// Groups of expand_x rows: for each local expert, rows from sources in [r_lo, r_hi).
static void add_groups(const DispatchResult& d, int r_lo, int r_hi, ExpertBatch& b) {
  const DispatchState& st = *d.handle;
  const int32_t* rc = d.ep_recv_counts.ptr<int32_t>();
  for (int64_t l = 0; l < st.L; ++l) {
    if (r_lo >= r_hi) continue;
    int64_t i0 = l * st.W + r_lo, i1 = l * st.W + r_hi - 1;
    int64_t begin = i0 == 0 ? 0 : rc[i0 - 1], end = rc[i1];
    if (end > begin) {
      b.expert.push_back(l);
      b.row_begin.push_back(begin);
      b.rows.push_back(end - begin);
    }
  }
}

ExpertBatch batch_of(const DispatchResult& d, const TensorView& y) {
  ExpertBatch b;
  b.x = d.expand_x.view();
  b.dynamic_scales = d.dynamic_scales.defined() ? d.dynamic_scales.view() : TensorView();
  b.y = y;
  if (d.handle) add_groups(d, 0, d.handle->W, b);
  return b;
}

Tensor ep_moe_ffn(Comm& comm, const TensorView& x, const TensorView& ids, const TensorView& w, const ExpertFn& experts,
                  const FfnOptions& opt, const TensorView& shared) {
  trace::OpScope scope("ep_moe_ffn");
  const int C = std::max(1, opt.chunks);
  // Chunk only well-formed inputs; anything else goes whole to the first dispatch, whose
  // records then make every rank fail.
  const TensorView& mask = opt.dispatch.x_active_mask;
  const bool shaped = x.ndim == 2 && ids.ndim == 2 && ids.size(0) == x.size(0) &&
                      (!w.defined() || (w.ndim == 2 && w.size(0) == x.size(0))) &&
                      (!shared.defined() || (shared.ndim == 2 && shared.size(0) == x.size(0))) &&
                      (!mask.defined() || (mask.ndim >= 1 && mask.size(0) == x.size(0)));
  const int64_t BS = shaped ? x.size(0) : 0;
  auto lo = [&](int c) { return BS * c / C; };
  auto part = [&](const TensorView& v, int c) { return v.defined() && shaped ? v.narrow(0, lo(c), lo(c + 1) - lo(c)) : v; };
  auto start = [&](int c) {
    DispatchOptions o = opt.dispatch;
    o.x_active_mask = part(mask, c);
    return dispatch_start_tagged(comm, part(x, c), part(ids, c), part(w, c), o, C, true);
  };

  std::vector<PendingDispatch> pend(static_cast<size_t>(C));
  std::vector<PendingCombine> comb(static_cast<size_t>(C));
  std::vector<Tensor> ys(static_cast<size_t>(C));
  Tensor out;
  auto collect = [&](int c) {
    Tensor o = comb[size_t(c)].wait();
    if (C == 1) out = o;  // one chunk: its combine output is the answer
    if (C == 1) {
      comb[size_t(c)] = PendingCombine();
      pend[size_t(c)] = PendingDispatch();
      return;
    }
    if (!out.defined()) out = comm.impl().tensors.get(o.dtype(), {BS, o.size(1)});
    if (o.numel() > 0) std::memcpy(row_at(out, lo(c)), o.view().data, o.view().nbytes());
    comb[size_t(c)] = PendingCombine();
    pend[size_t(c)] = PendingDispatch();
  };
  pend[0] = start(0);
  for (int c = 0; c < C; ++c) {
    if (c + 1 < C) pend[size_t(c + 1)] = start(c + 1);
    PendingDispatch& p = pend[size_t(c)];
    DispatchResult& d = p.result();
    const DispatchState& st = *d.handle;
    ys[size_t(c)] = comm.impl().tensors.get(st.dtype, {st.A, st.H});
    bool failed = false;
    try {
      // Rows from this rank are ready now; the rest after the wait.
      ExpertBatch local;
      local.x = d.expand_x.view();
      local.dynamic_scales = d.dynamic_scales.defined() ? d.dynamic_scales.view() : TensorView();
      local.y = ys[size_t(c)].view();
      local.progress = [&comm] { comm.progress(); };
      add_groups(d, st.me, st.me + 1, local);
      experts(local);
      p.wait();
      ExpertBatch remote = local;
      remote.expert.clear(), remote.row_begin.clear(), remote.rows.clear();
      add_groups(d, 0, st.me, remote);
      add_groups(d, st.me + 1, st.W, remote);
      experts(remote);
    } catch (const std::exception&) {
      p.wait();
      failed = true;
    }
    CombineInputs in;
    in.shared_expert_x = part(shared, c);
    if (opt.dispatch.copy_expert_num + opt.dispatch.const_expert_num > 0) in.ori_x = part(x, c);  // copy/const experts' input
    in.const_expert_alpha_1 = opt.const_expert_alpha_1;
    in.const_expert_alpha_2 = opt.const_expert_alpha_2;
    in.const_expert_v = opt.const_expert_v;
    comb[size_t(c)] = combine_start_impl(comm, ys[size_t(c)].view(), p.result(), in, failed);
    if (c > 0) collect(c - 1);
  }
  collect(C - 1);
  return out;
}

}  // namespace ot::ep
