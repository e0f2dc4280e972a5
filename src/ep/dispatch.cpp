// moe_distribute_dispatch: validate, pack each token once per destination rank, exchange, fan out
// this rank's own rows and the remote rows into the receive layout (local expert, source rank,
// token) of spec section 9.2. Every message starts with a record (validation outcome, options,
// counts), so agreement costs no round of its own: the blocking all_to_all form is ONE round (rows
// ride with the records); the split form and all_gather exchange the records first (the layout must
// be known before the own rows are placed / the gather is sized), then the rows.
#include <algorithm>

#include "ot/numeric.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "src/ep/internal.h"
#include "src/moe/common.h"

namespace ot::ep {

namespace {

constexpr const char* kOp = "moe_distribute_dispatch";

enum Code {
  kOk, kX, kXDtype, kIds, kIdsDtype, kK, kIdsRange, kIdsDup, kScales, kE, kEDiv, kPlacementE, kWorld, kRank, kType,
  kMisK, kMisH, kMisDtype, kMisE, kMisOpt, kMisPlacement, kMisTag, kMask, kSharedRanks, kSharedPlacement, kCommQuant,
  kSpecial, kSmooth, kMisForm, kMisSpecial, kMisSmooth, kPlacementL,
};
const std::vector<FaultText> kTable = {
    {"", ""},
    {"x", "a 2-D [BS, H] view with contiguous rows and H >= 1"},
    {"x", "bf16, fp16 or fp32"},
    {"expert_ids", "a [BS, K] view with contiguous rows (BS = rows of x)"},
    {"expert_ids", "int32"},
    {"expert_ids", "K in [1, min(moe_expert_num, 64)]"},
    {"expert_ids", "expert ids in [0, moe_expert_num + zero_expert_num + copy_expert_num + const_expert_num)"},
    {"expert_ids", "distinct expert ids within a row"},
    {"expert_scales", "fp32 [BS, K] with contiguous rows, or undefined"},
    {"moe_expert_num", ">= 1"},
    {"moe_expert_num", "a multiple of the EP world size"},
    {"moe_expert_num", "the number of experts of the Comm's placement"},
    {"ep_world_size", "0 or the communicator's size"},
    {"ep_rank_id", "-1 or the communicator's rank"},
    {"expert_token_nums_type", "0 (cumsum) or 1 (count)"},
    {"expert_ids", "the same K on every rank"},
    {"x", "the same H on every rank"},
    {"x", "the same dtype on every rank"},
    {"moe_expert_num", "the same value on every rank"},
    {"options", "the same dispatcher, quant_int8, dedup_combine, expert_token_nums_type, shared_expert_rank_num and comm_quant_mode on every rank"},
    {"placement", "the same expert placement on every rank"},
    {"chunks", "the same value on every rank"},
    {"x_active_mask", "u8 (bool) [BS] or [BS, K] with contiguous rows, or undefined"},
    {"shared_expert_rank_num", "in [0, W)"},
    {"shared_expert_rank_num", "the Comm's placement to be Placement::shared_ranks(moe_expert_num, W, S)"},
    {"comm_quant_mode", "0 (none) or 2 (int8 rows per-row scale)"},
    {"zero_expert_num/copy_expert_num/const_expert_num", ">= 0"},
    {"smooth_scales", "undefined, or fp32 [moe_expert_num + shared_expert_num, H] with contiguous rows and quant_int8 set"},
    {"call", "the same form (blocking or split) on every rank"},
    {"zero_expert_num/copy_expert_num/const_expert_num", "the same values on every rank"},
    {"smooth_scales", "given on every rank or on none"},
    {"placement", "the same local expert count on sender and receiver"},
};
enum Field {
  fBS, fK, fH, fE, fDtype, fQuant, fDisp, fDedup, fType, fHash, fTag, fRows, fShared, fCommQuant, fForm, fSpecial, fSmooth, fWindowNeed
};
static_assert(fWindowNeed < kMetaFields);

Fault validate(const Comm& comm, const TensorView& x, const TensorView& ids, const TensorView& w, const DispatchOptions& o) {
  const int W = comm.ep_world_size();
  if (x.ndim != 2 || !x.last_dim_contiguous() || x.size(1) < 1) return {kX, x.ndim == 2 ? x.size(1) : x.ndim};
  if (!is_float(x.dtype)) return {kXDtype, int64_t(x.dtype)};
  if (ids.ndim != 2 || ids.size(0) != x.size(0) || !ids.last_dim_contiguous()) return {kIds, ids.ndim == 2 ? ids.size(0) : ids.ndim};
  if (ids.dtype != DType::i32) return {kIdsDtype, int64_t(ids.dtype)};
  const int S = o.shared_expert_rank_num;
  if (S < 0 || S >= W) return {kSharedRanks, S};
  if (o.moe_expert_num < 1) return {kE, o.moe_expert_num};
  if (o.moe_expert_num % (W - S) != 0) return {kEDiv, o.moe_expert_num};
  if (o.moe_expert_num + (S > 0) != comm.placement().num_experts()) return {kPlacementE, o.moe_expert_num};
  if (S > 0) {  // the pseudo expert E (the shared one) lives exactly on ranks [0, S)
    const auto& c = comm.placement().copies(o.moe_expert_num);
    if (int(c.size()) != S || c.front() != 0 || c.back() != S - 1) return {kSharedPlacement, int64_t(c.size())};
  }
  if (o.ep_world_size != 0 && o.ep_world_size != W) return {kWorld, o.ep_world_size};
  if (o.ep_rank_id != -1 && o.ep_rank_id != comm.ep_rank_id()) return {kRank, o.ep_rank_id};
  if (o.expert_token_nums_type != 0 && o.expert_token_nums_type != 1) return {kType, o.expert_token_nums_type};
  if (o.comm_quant_mode != 0 && o.comm_quant_mode != 2) return {kCommQuant, o.comm_quant_mode};
  if (o.zero_expert_num < 0 || o.copy_expert_num < 0 || o.const_expert_num < 0)
    return {kSpecial, std::min({o.zero_expert_num, o.copy_expert_num, o.const_expert_num})};
  const int64_t K = ids.size(1), BS = x.size(0), E = o.moe_expert_num;
  const int64_t E_all = E + o.zero_expert_num + o.copy_expert_num + o.const_expert_num;  // ids may name special experts
  if (K < 1 || K > std::min<int64_t>(E_all, 64)) return {kK, K};
  const TensorView& sm = o.smooth_scales;
  if (sm.defined() && (!o.quant_int8 || sm.dtype != DType::f32 || sm.ndim != 2 || sm.size(0) != E + o.shared_expert_num ||
                       sm.size(1) != x.size(1) || !sm.last_dim_contiguous()))
    return {kSmooth, sm.ndim == 2 ? sm.size(0) : sm.ndim};
  if (w.defined() && (w.ndim != 2 || w.size(0) != BS || w.size(1) != K || w.dtype != DType::f32 || !w.last_dim_contiguous()))
    return {kScales, w.ndim == 2 ? w.size(1) : w.ndim};
  const TensorView& m = o.x_active_mask;
  if (m.defined() && (m.dtype != DType::u8 || !m.last_dim_contiguous() || m.size(0) != BS ||
                      !(m.ndim == 1 || (m.ndim == 2 && m.size(1) == K))))
    return {kMask, m.ndim >= 1 ? m.size(0) : m.ndim};
  std::vector<int64_t> seen(size_t(E_all), -1);
  for (int64_t t = 0; t < BS; ++t) {
    const int32_t* row = ids.ptr<int32_t>() + t * ids.stride(0);
    for (int64_t k = 0; k < K; ++k) {
      int32_t e = row[k];
      if (e < 0 || e >= E_all) return {kIdsRange, e};
      if (seen[size_t(e)] == t) return {kIdsDup, e};
      seen[size_t(e)] = t;
    }
  }
  return {};
}

}  // namespace

DispatchWireTamper dispatch_wire_tamper = nullptr;

PendingDispatch::PendingDispatch(PendingDispatch&& o) noexcept : res_(std::move(o.res_)), done_(o.done_) { o.done_ = true; }
PendingDispatch& PendingDispatch::operator=(PendingDispatch&& o) noexcept {
  if (this != &o) {
    if (!done_) wait();
    res_ = std::move(o.res_);
    done_ = o.done_;
    o.done_ = true;
  }
  return *this;
}
PendingDispatch::~PendingDispatch() {
  // A transfer must never be abandoned while peers take part in it.
  if (!done_) {
    try { wait(); } catch (...) {}
  }
}

const std::vector<PendingDispatch::Block>& PendingDispatch::local_blocks() const { return res_.handle->local_blocks; }

bool PendingDispatch::test() {
  if (done_) return true;
  DispatchState& st = *res_.handle;
  int flag = 0;
  MPI_Test(&st.req, &flag, MPI_STATUS_IGNORE);
  return flag != 0;
}

DispatchResult& PendingDispatch::wait() {
  if (done_) return res_;
  DispatchState& st = *res_.handle;
  trace::OpScope scope("moe_distribute_dispatch_wait", "comm");
  done_ = true;  // (a timeout below leaves the transfer to MPI: never waited for again)
  wait_row_collective(*st.comm, &st.req, res_.handle, kOp);
  st.finish_receive(res_);
  return res_;
}

PendingDispatch moe_distribute_dispatch_start(Comm& comm, const TensorView& x, const TensorView& ids, const TensorView& w,
                                              const DispatchOptions& opt) {
  return dispatch_start_tagged(comm, x, ids, w, opt, 0, true);
}

DispatchResult moe_distribute_dispatch(Comm& comm, const TensorView& x, const TensorView& ids, const TensorView& w,
                                       const DispatchOptions& opt) {
  // Blocking form: one round (records and rows in one message per peer) under all_to_all.
  PendingDispatch pd = dispatch_start_tagged(comm, x, ids, w, opt, 0, false);
  return std::move(pd.wait());
}

DispatchState::~DispatchState() {
  for (auto [r, g] : held) comm->impl().window.release_peer(r, SlotKind::dispatch, g);
}

// Receive layout from slot counts per (local expert l, source r): blocks in (l, r) order.
void DispatchState::plan(const std::vector<int64_t>& cnt, DispatchResult& res) {
  block.resize(size_t(L * W));
  fill.assign(size_t(L * W), 0);
  res.expert_token_nums = Tensor::empty(DType::i64, {L});
  res.ep_recv_counts = Tensor::empty(DType::i32, {L * W});
  A = 0;
  for (int64_t l = 0; l < L; ++l) {
    int64_t before = A;
    for (int r = 0; r < W; ++r) {
      block[size_t(l * W + r)] = A;
      A += cnt[size_t(l * W + r)];
      res.ep_recv_counts.ptr<int32_t>()[l * W + r] = int32_t(A);
    }
    res.expert_token_nums.ptr<int64_t>()[l] = opt.expert_token_nums_type == 0 ? A : A - before;
  }
  TensorPool& pool = comm->impl().tensors;  // reused storage once the caller drops earlier results
  res.expand_x = pool.get(opt.quant_int8 ? DType::i8 : dtype, {A, H});
  if (opt.quant_int8) res.dynamic_scales = pool.get(DType::f32, {A});
  res.assist_info_for_combine = pool.get(DType::i32, {A, 3});
  local_blocks.resize(size_t(L));
  for (int64_t l = 0; l < L; ++l) local_blocks[size_t(l)] = {block[size_t(l * W + me)], cnt[size_t(l * W + me)]};
  planned = true;
}

// This rank's own slots go straight from x into their expand_x rows (no wire, no packing).
void DispatchState::place_local(DispatchResult& res) {
  const Placement& P = comm->placement();
  struct Copy { int64_t dst, t; int l; };
  std::vector<Copy> copies;
  self_j.assign(size_t(BS), -1);
  for (int64_t t = 0; t < BS; ++t) {
    const int32_t* idr = ids_view.ptr<int32_t>() + t * ids_view.stride(0);
    bool any = false;
    for (int64_t k = 0; k < K; ++k) {
      if (slot_dest[size_t(t * K + k)] != me) continue;
      if (!any) {
        self_j[size_t(t)] = int64_t(recv.size());
        recv.push_back({int32_t(me), int32_t(t), -1});
        any = true;
      }
      int l = P.local_index(me, idr[k]);
      int64_t row = block[size_t(l * W + me)] + fill[size_t(l * W + me)]++;
      ent_row.push_back(row);
      ent_w.push_back(scales[size_t(t * K + k)]);
      slot_ret[size_t(t * K + k)] = row;
      int32_t* as = res.assist_info_for_combine.ptr<int32_t>() + row * 3;
      as[0] = me, as[1] = int32_t(t), as[2] = int32_t(k);
      copies.push_back({row, t, l});
    }
    if (any) ent_begin.push_back(int64_t(ent_row.size()));
  }
  const size_t xes = dtype_size(dtype), out_row = expand_row_bytes(H, dtype, opt.quant_int8);
  char* ex = static_cast<char*>(res.expand_x.view().data);
  const TensorView& x = x_view;
  // Streaming past 16 MB, as for init routing (here at H 7168 bf16: BS 512, 58 MB per rank, ~20 %
  // faster; BS 32, 3.6 MB, ~10 % slower when streamed).
  const bool stream = moe::impl::stream_output(size_t(A) * out_row);
  parallel_for(int64_t(copies.size()), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const char* src = static_cast<const char*>(x.data) + copies[size_t(i)].t * x.stride(0) * int64_t(xes);
      char* dst = ex + size_t(copies[size_t(i)].dst) * out_row;
      if (opt.quant_int8)
        res.dynamic_scales.ptr<float>()[copies[size_t(i)].dst] =
            quantize_row_int8(src, dtype, H, reinterpret_cast<int8_t*>(dst), smooth_row(copies[size_t(i)].l));
      else moe::impl::copy_row(dst, src, out_row, stream);
    }
    moe::impl::stream_fence();
  });
}

// Smooth-quant row of local expert l (spec 9.2: routed expert e uses row e + shared_expert_num; the
// shared-rank expert, id E, uses row 0 when there are shared rows), or null.
const float* DispatchState::smooth_row(int l) const {
  const TensorView& sm = opt.smooth_scales;
  if (!sm.defined()) return nullptr;
  const int64_t e = comm->placement().local_experts(me)[size_t(l)];
  const int64_t row = e < E ? e + opt.shared_expert_num : 0;
  if (e >= E && opt.shared_expert_num == 0) return nullptr;
  return sm.ptr<float>() + row * sm.stride(0);
}

PendingDispatch dispatch_start_tagged(Comm& comm, const TensorView& x, const TensorView& ids_in, const TensorView& wv_in,
                                      const DispatchOptions& opt, int64_t tag, bool split) {
  PendingDispatch pd;
  trace::OpScope scope(kOp, "comm");
  check_not_broken(comm, kOp);
  const int W = comm.ep_world_size(), me = comm.ep_rank_id();
  const Placement& P = comm.placement();
  const bool a2a = opt.dispatcher == Dispatcher::all_to_all;
  const bool one_round = a2a && !split;  // rows ride with the records

  // 1. Validate locally.
  Fault fault = validate(comm, x, ids_in, wv_in, opt);
  auto sp = std::make_shared<DispatchState>();
  DispatchState& st = *sp;
  st.comm = &comm;
  st.W = W;
  st.me = me;
  st.opt = opt;
  st.opt.x_active_mask = TensorView();  // not kept past this call
  st.dtype = x.dtype;
  Meta meta;
  meta.f[fE] = opt.moe_expert_num;
  meta.f[fDtype] = int64_t(x.dtype);
  meta.f[fQuant] = opt.quant_int8;
  meta.f[fDisp] = int64_t(opt.dispatcher);
  meta.f[fDedup] = opt.dedup_combine;
  meta.f[fType] = opt.expert_token_nums_type;
  meta.f[fHash] = int64_t(P.hash());
  meta.f[fTag] = tag;
  meta.f[fShared] = opt.shared_expert_rank_num;
  meta.f[fCommQuant] = opt.comm_quant_mode;
  meta.f[fForm] = split;
  meta.f[fSpecial] = opt.zero_expert_num | opt.copy_expert_num << 20 | opt.const_expert_num << 40;
  meta.f[fSmooth] = opt.smooth_scales.defined();

  // Shared-expert ranks: every token gets one more slot, expert id E (the shared expert) with scale
  // 1 (combine adds it unweighted), active unless the whole token is masked off.
  TensorView ids = ids_in, wv = wv_in, mask = opt.x_active_mask;
  Tensor ids_ext, w_ext, mask_ext;
  if (fault.code == 0 && opt.shared_expert_rank_num > 0) {
    const int64_t BS = x.size(0), K = ids_in.size(1);
    ids_ext = Tensor::empty(DType::i32, {BS, K + 1});
    w_ext = Tensor::empty(DType::f32, {BS, K + 1});
    if (mask.defined() && mask.ndim == 2) mask_ext = Tensor::empty(DType::u8, {BS, K + 1});
    for (int64_t t = 0; t < BS; ++t) {
      std::copy_n(ids_in.ptr<int32_t>() + t * ids_in.stride(0), K, ids_ext.ptr<int32_t>() + t * (K + 1));
      ids_ext.ptr<int32_t>()[t * (K + 1) + K] = int32_t(opt.moe_expert_num);
      for (int64_t k = 0; k < K; ++k) w_ext.ptr<float>()[t * (K + 1) + k] = wv_in.defined() ? wv_in.ptr<float>()[t * wv_in.stride(0) + k] : 1.f;
      w_ext.ptr<float>()[t * (K + 1) + K] = 1.f;
      if (mask_ext.defined()) {
        std::copy_n(mask.ptr<uint8_t>() + t * mask.stride(0), K, mask_ext.ptr<uint8_t>() + t * (K + 1));
        mask_ext.ptr<uint8_t>()[t * (K + 1) + K] = 1;
      }
    }
    ids = ids_ext, wv = w_ext;
    if (mask_ext.defined()) mask = mask_ext;
  }

  // 2. Route (valid arguments only): the destination of each active slot, one row per token and
  // remote destination rank, and slot counts per (destination, its local expert): they travel in
  // the records, so every rank knows its receive layout from the messages it gets.
  // Per q: [rows to q, slots per local expert of q, rows in this rank's window slot (pulled), the
  // window of that slot + 1 (0: the rows are in the message)].
  std::vector<std::vector<int64_t>> extra(static_cast<size_t>(W));
  std::vector<int64_t> gathered;  // all_gather: tokens this rank contributes (any sent slot)
  if (fault.code == 0) {
    st.BS = x.size(0), st.K = ids.size(1), st.H = x.size(1), st.E = opt.moe_expert_num;
    st.L = int64_t(P.local_experts(me).size());
    meta.f[fBS] = st.BS, meta.f[fK] = st.K, meta.f[fH] = st.H;
    const int64_t BS = st.BS, K = st.K, E = st.E;
    const int64_t K_routed = opt.shared_expert_rank_num > 0 ? K - 1 : K;  // the shared column is last
    for (int q = 0; q < W; ++q) extra[size_t(q)].assign(size_t(3) + P.local_experts(q).size(), 0);
    const TensorView& m = mask;
    auto active = [&](int64_t t, int64_t k) {
      if (!m.defined()) return true;
      return m.ndim == 1 ? m.ptr<uint8_t>()[t] != 0 : m.ptr<uint8_t>()[t * m.stride(0) + k] != 0;
    };
    if (m.defined() && m.ndim == 1) st.token_active.assign(m.ptr<uint8_t>(), m.ptr<uint8_t>() + BS);
    st.scales.assign(size_t(BS * K), 1.f);
    if (wv.defined())
      for (int64_t t = 0; t < BS; ++t) std::copy_n(wv.ptr<float>() + t * wv.stride(0), K, st.scales.begin() + t * K);
    st.slot_dest.assign(size_t(BS * K), -1);
    st.slot_ret.assign(size_t(BS * K), -1);
    st.token_pos.assign(size_t(BS * W), -1);
    st.send_rows.assign(size_t(W), 0);
    st.slots_to.assign(size_t(W), 0);
    const bool any_special = opt.zero_expert_num + opt.copy_expert_num + opt.const_expert_num > 0;
    if (any_special) st.special.assign(size_t(BS * K), -1);
    for (int64_t t = 0; t < BS; ++t) {
      const int32_t* row = ids.ptr<int32_t>() + t * ids.stride(0);
      bool any = false;
      for (int64_t k = 0; k < K; ++k) {
        if (!active(t, k)) continue;
        if (k < K_routed && row[k] >= E) {  // zero/copy/const expert: computed at combine, never sent
          st.special[size_t(t * K + k)] = row[k] - int32_t(E);
          continue;
        }
        any = true;
        int q = P.destination(me, t, row[k]);
        st.slot_dest[size_t(t * K + k)] = q;
        st.slot_ret[size_t(t * K + k)] = st.slots_to[size_t(q)]++;  // per-slot combine order (self: replaced later)
        ++extra[size_t(q)][size_t(1 + P.local_index(q, row[k]))];
        int32_t& pos = st.token_pos[size_t(t * W + q)];
        if (pos < 0) pos = int32_t(st.send_rows[size_t(q)]++);
      }
      if (any) gathered.push_back(t);
    }
    st.send_rows[size_t(me)] = 0;
    if (!a2a) std::fill(st.send_rows.begin(), st.send_rows.end(), 0);
    for (int q = 0; q < W; ++q) extra[size_t(q)][0] = st.send_rows[size_t(q)];
    meta.f[fRows] = int64_t(gathered.size());
  }

  // 3. One message per peer: [record][rows to it (one-round form)]. With smooth scales the rows
  // travel in x's dtype and are quantised per (token, expert) on arrival.
  const size_t xes = dtype_size(x.dtype);
  const bool sender_quant = opt.quant_int8 && !opt.smooth_scales.defined();
  st.fmt = RowFormat(st.K, st.H, sender_quant ? 1 : xes);
  const RowFormat& fmt = st.fmt;
  // One-round form: every token bound for a rank on this node is written once into this rank's
  // window slot, and those ranks read what they need from it in place (their message is the record
  // alone), when the slot is free and large enough; the slot size every rank wants travels in the
  // records.
  NodeWindow& win = comm.impl().window;
  std::vector<int> readers;       // on-node ranks that pull from this rank's slot
  std::vector<int64_t> pull_tok;  // tokens in the slot, ascending
  char* own_slot = nullptr;
  if (one_round && fault.code == 0) {
    size_t need = 0;
    const size_t ret_row = size_t(st.H) * std::max<size_t>(xes, 2) + 16;  // a combine row (dtype or int8 + scale)
    for (int q = 0; q < W; ++q) {
      if (q == me) continue;
      const size_t rows = size_t(st.send_rows[size_t(q)]);
      need = std::max(need, size_t(opt.dedup_combine ? rows : size_t(st.slots_to[size_t(q)])) * ret_row);
      if (rows > 0 && win.on_node(q)) readers.push_back(q);
    }
    for (int64_t t = 0; t < st.BS; ++t)
      for (int q : readers)
        if (st.token_pos[size_t(t * W + q)] >= 0) {
          pull_tok.push_back(t);
          break;
        }
    need = std::max(need, pull_tok.size() * fmt.stride);
    int64_t gen = 0;
    if ((own_slot = win.claim_own(SlotKind::dispatch, pull_tok.size() * fmt.stride, readers, &gen)))
      for (int q : readers) {
        std::vector<int64_t>& e = extra[size_t(q)];
        e[e.size() - 2] = int64_t(pull_tok.size());
        e.back() = gen + 1;
      }
    else readers.clear();
    meta.f[fWindowNeed] = int64_t(need);
  }
  std::vector<char> pulled_by(static_cast<size_t>(W), 0);
  for (int q : readers) pulled_by[size_t(q)] = 1;
  auto pack_row = [&](char* row, int64_t t, int q) {
    const int32_t* idr = ids.ptr<int32_t>() + t * ids.stride(0);
    RowFormat::token(row) = int32_t(t);
    for (int64_t k = 0; k < st.K; ++k) {
      const int d = st.slot_dest[size_t(t * st.K + k)];
      RowFormat::ids(row)[k] = d >= 0 && (q < 0 || d == q) ? idr[k] : -1;
      fmt.w(row)[k] = st.scales[size_t(t * st.K + k)];
    }
    const char* src = static_cast<const char*>(x.data) + t * x.stride(0) * int64_t(xes);
    if (sender_quant) RowFormat::qscale(row) = quantize_row_int8(src, x.dtype, st.H, reinterpret_cast<int8_t*>(fmt.payload(row)));
    else std::memcpy(fmt.payload(row), src, size_t(st.H) * xes);
  };
  auto pack_rows = [&](const std::vector<char*>& base) {  // base[q]: first row to q
    parallel_for(st.BS, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t)
        for (int q = 0; q < W; ++q) {
          int32_t pos = st.token_pos[size_t(t * W + q)];
          if (q != me && pos >= 0 && base[size_t(q)]) pack_row(base[size_t(q)] + size_t(pos) * fmt.stride, t, q);
        }
    });
  };
  const bool ok = fault.code == 0;
  MessageLayout msg(W);
  for (int q = 0; q < W; ++q) {
    if (q == me) continue;
    const size_t rec = record_bytes(extra[size_t(q)].size());
    msg.add(q, rec + (one_round && ok && !pulled_by[size_t(q)] ? size_t(st.send_rows[size_t(q)]) * fmt.stride : 0));
    st.bytes_sent += int64_t(rec);  // the record is on the wire too
  }
  st.msgbuf = PooledBuffer(comm.impl().pool, msg.buffer_bytes());
  for (int q = 0; q < W; ++q)
    if (q != me) write_record(st.msgbuf.data() + msg.off[size_t(q)], fault, meta, extra[size_t(q)].data(), extra[size_t(q)].size());
  const std::vector<char> own = own_record(fault, meta, extra[size_t(me)].data(), extra[size_t(me)].size());
  if (one_round && ok) {
    std::vector<char*> base(static_cast<size_t>(W));
    for (int q = 0; q < W; ++q)
      base[size_t(q)] = pulled_by[size_t(q)] ? nullptr : st.msgbuf.data() + msg.off[size_t(q)] + record_bytes(extra[size_t(q)].size());
    pack_rows(base);
    if (own_slot) {  // each token once, all its slots named; readers keep the ones placed on them
      parallel_for(int64_t(pull_tok.size()), [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) pack_row(own_slot + size_t(i) * fmt.stride, pull_tok[size_t(i)], -1);
      });
      win.publish();
    }
  }
  if (dispatch_wire_tamper && ok)  // (split forms: the record alone)
    for (int q = 0; q < W; ++q)
      if (q != me) dispatch_wire_tamper(q, st.msgbuf.data() + msg.off[size_t(q)], msg.len[size_t(q)], fmt);
  st.ex = std::make_unique<PeerExchange>();
  st.ex->start(comm, kTagDispatch, st.msgbuf.data(), msg.off, msg.len);
  st.scount.assign(size_t(W), 0);
  st.sdispl.assign(size_t(W), 0);
  st.rcount.assign(size_t(W), 0);
  st.rdispl.assign(size_t(W), 0);
  if (ok && a2a) {
    int64_t so = 0;
    for (int q = 0; q < W; ++q) {
      st.sdispl[size_t(q)] = checked_int(so, kOp, "send rows");
      st.scount[size_t(q)] = checked_int(st.send_rows[size_t(q)], kOp, "send rows");
      so += st.send_rows[size_t(q)];
      st.bytes_sent += st.send_rows[size_t(q)] * int64_t(fmt.stride);
    }
    if (!one_round) {  // packed while the records travel
      st.sendbuf = PooledBuffer(comm.impl().pool, size_t(so) * fmt.stride);
      std::vector<char*> base(static_cast<size_t>(W));
      for (int q = 0; q < W; ++q) base[size_t(q)] = st.sendbuf.data() + size_t(st.sdispl[size_t(q)]) * fmt.stride;
      pack_rows(base);
    }
  }
  st.ex->wait();
  // st.held (the window slots peers name) is freed by ~DispatchState if the decision throws.
  Decision dec = agree(kOp, *st.ex, me, own, -1, st.held, kTable,
                       {{fK, kMisK}, {fH, kMisH}, {fDtype, kMisDtype}, {fE, kMisE}, {fQuant, kMisOpt}, {fDisp, kMisOpt},
                        {fDedup, kMisOpt}, {fType, kMisOpt}, {fHash, kMisPlacement}, {fTag, kMisTag}, {fShared, kMisOpt},
                        {fCommQuant, kMisOpt}, {fForm, kMisForm}, {fSpecial, kMisSpecial}, {fSmooth, kMisSmooth}});
  const int64_t BS = st.BS, K = st.K, H = st.H, L = st.L;
  st.x_view = x;
  st.ids_view = ids;
  st.all_bs.resize(static_cast<size_t>(W));
  st.all_rows.resize(static_cast<size_t>(W));
  st.recv_rows.assign(size_t(W), 0);
  st.recv_slots.assign(size_t(W), 0);
  st.rows_from.assign(size_t(W), nullptr);
  st.pulled.assign(size_t(W), 0);
  std::vector<int64_t> cnt(size_t(L * W), 0);  // slots per (local expert l, source r)
  for (int r = 0; r < W; ++r) {
    if (one_round) st.window_need = std::max(st.window_need, size_t(dec.meta[size_t(r)].f[fWindowNeed]));
    st.all_bs[size_t(r)] = dec.meta[size_t(r)].f[fBS];
    st.all_rows[size_t(r)] = dec.meta[size_t(r)].f[fRows];
    if (dec.n_extra[size_t(r)] != 3 + L) throw Error(kOp, "placement", kTable[kPlacementL].expected, detail::cat("rank ", r, ": ", dec.n_extra[size_t(r)] - 1));
    const int64_t* rec = dec.extra[size_t(r)];
    st.recv_rows[size_t(r)] = rec[0];
    for (int64_t l = 0; l < L; ++l) {
      cnt[size_t(l * W + r)] = rec[1 + l];
      if (r != me) st.recv_slots[size_t(r)] += rec[1 + l];
    }
  }
  // Counts from peers bound what this rank allocates and reads: a malformed record is rejected here,
  // by this rank alone (only it got that record), before anything is sized from it. In the
  // one-round form every transfer is over; the window grows as on the other ranks first.
  for (int r = 0; r < W; ++r) {
    const int64_t bs = st.all_bs[size_t(r)], rows = st.all_rows[size_t(r)];
    std::string bad;
    if (bs < 0 || bs > INT32_MAX) bad = detail::cat("a batch of ", bs, " tokens");
    else if (rows < 0 || rows > bs) bad = detail::cat(rows, " gathered rows of a batch of ", bs);
    else if (st.recv_rows[size_t(r)] < 0 || st.recv_rows[size_t(r)] > bs) bad = detail::cat(st.recv_rows[size_t(r)], " rows of a batch of ", bs);
    else if (one_round && dec.extra[size_t(r)][2 + L] > 0 && (dec.extra[size_t(r)][1 + L] < 0 || dec.extra[size_t(r)][1 + L] > bs))
      bad = detail::cat(dec.extra[size_t(r)][1 + L], " window rows of a batch of ", bs);
    for (int64_t l = 0; l < L && bad.empty() && r != me; ++l)
      if (cnt[size_t(l * W + r)] < 0 || cnt[size_t(l * W + r)] > bs * K)
        bad = detail::cat(cnt[size_t(l * W + r)], " slots for local expert ", l, " from a batch of ", bs, " tokens of ", K);
    if (bad.empty()) continue;
    if (one_round) win.reserve(st.window_need);
    throw Error(kOp, "message", "counts within the sender's batch", detail::cat("rank ", r, " sent ", bad));
  }
  DispatchResult& res = PendingAccess::res(pd);
  res = DispatchResult();
  st.cnt = cnt;
  st.plan(cnt, res);

  // 4. Rows. One-round: already here, after each record. Split all_to_all: one row per (token,
  // remote destination rank), packed above; all_gather: every token with a sent slot once, packed
  // straight into its place in the gathered buffer (MPI_IN_PLACE).
  MPI_Datatype rt = comm.impl().row_type(int64_t(fmt.stride));
  if (one_round) {
    for (int r = 0; r < W; ++r) {
      if (r == me) continue;
      st.rcount[size_t(r)] = checked_int(st.recv_rows[size_t(r)], kOp, "receive rows");
      const int64_t where = dec.extra[size_t(r)][2 + L];  // r's window slot + 1, or 0: after the record
      if (where > 0) {  // all of r's tokens bound for this node: keep those with slots placed here
        st.pulled[size_t(r)] = 1;
        st.rcount[size_t(r)] = checked_int(dec.extra[size_t(r)][1 + L], kOp, "window rows");
      }
      const char* rows = payload_of(*st.ex, r, size_t(3 + L), where > 0 ? 0 : size_t(st.recv_rows[size_t(r)]) * fmt.stride, kOp,
                                    "the size its record announces");
      st.rows_from[size_t(r)] = where > 0 ? win.peer_own(r, SlotKind::dispatch, where - 1) : rows;
    }
  } else if (a2a) {
    int64_t ro = 0;
    for (int q = 0; q < W; ++q) {
      st.rdispl[size_t(q)] = checked_int(ro, kOp, "receive rows");
      st.rcount[size_t(q)] = checked_int(st.recv_rows[size_t(q)], kOp, "receive rows");
      ro += st.recv_rows[size_t(q)];
    }
    st.recvbuf = PooledBuffer(comm.impl().pool, size_t(ro) * fmt.stride);
    for (int q = 0; q < W; ++q) st.rows_from[size_t(q)] = st.recvbuf.data() + size_t(st.rdispl[size_t(q)]) * fmt.stride;
    MPI_Ialltoallv(st.sendbuf.data(), st.scount.data(), st.sdispl.data(), rt, st.recvbuf.data(), st.rcount.data(), st.rdispl.data(), rt,
                   comm.mpi(), &st.req);
  } else {
    int64_t ro = 0;
    for (int r = 0; r < W; ++r) {
      st.rdispl[size_t(r)] = checked_int(ro, kOp, "gathered rows");
      st.rcount[size_t(r)] = checked_int(st.all_rows[size_t(r)], kOp, "gathered rows");
      ro += st.all_rows[size_t(r)];
    }
    const int64_t G = int64_t(gathered.size());
    st.bytes_sent += G * int64_t(fmt.stride) * (W - 1);
    st.recvbuf = PooledBuffer(comm.impl().pool, size_t(ro) * fmt.stride);
    for (int r = 0; r < W; ++r) st.rows_from[size_t(r)] = st.recvbuf.data() + size_t(st.rdispl[size_t(r)]) * fmt.stride;
    char* own_rows = st.recvbuf.data() + size_t(st.rdispl[size_t(me)]) * fmt.stride;
    parallel_for(G, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) pack_row(own_rows + size_t(i) * fmt.stride, gathered[size_t(i)], -1);
    });
    // Non-blocking in both forms: wait() bounds it by the Comm's timeout (the blocking form waits at once).
    MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, st.recvbuf.data(), st.rcount.data(), st.rdispl.data(), rt, comm.mpi(), &st.req);
  }
  if (st.req != MPI_REQUEST_NULL) comm.impl().track(&st.req);
  st.place_local(res);  // while the transfer runs (split form)
  st.ids_view = TensorView();  // may point at this call's extended ids
  res.bytes_sent = st.bytes_sent;
  res.handle = sp;
  PendingAccess::done(pd) = false;
  scope.kernel(dispatcher_name(opt.dispatcher)).bytes(double(st.bytes_sent));
  if (scope.active()) scope.args(detail::cat("x[", BS, ",", H, "] ", dtype_name(x.dtype), " K=", K, " E=", st.E, " W=", W));
  return pd;
}

std::string DispatchState::check_received_rows() const {
  const Placement& P = comm->placement();
  const bool a2a = opt.dispatcher == Dispatcher::all_to_all;
  std::vector<int64_t> got(size_t(L * W), 0);
  for (int r = 0; r < W; ++r) {
    if (r == me) continue;
    for (int64_t i = 0; i < rcount[size_t(r)]; ++i) {
      char* row = const_cast<char*>(rows_from[size_t(r)]) + size_t(i) * fmt.stride;
      const int32_t tok = RowFormat::token(row);
      const int32_t* idr = RowFormat::ids(row);
      if (tok < 0 || tok >= all_bs[size_t(r)])
        return detail::cat("rank ", r, " row ", i, ": token ", tok, " of a batch of ", all_bs[size_t(r)]);
      for (int64_t k = 0; k < K; ++k) {
        const int32_t e = idr[k];
        if (e < 0) continue;
        if (e >= P.num_experts()) return detail::cat("rank ", r, " row ", i, ": expert ", e, " of ", P.num_experts());
        if ((!a2a || pulled[size_t(r)]) && P.destination(r, tok, e) != me) continue;
        const int l = P.local_index(me, e);
        if (l < 0) return detail::cat("rank ", r, " row ", i, ": expert ", e, ", which is not on rank ", me);
        ++got[size_t(l * W + r)];
      }
    }
    for (int64_t l = 0; l < L; ++l)
      if (got[size_t(l * W + r)] != cnt[size_t(l * W + r)])
        return detail::cat("rank ", r, ": ", got[size_t(l * W + r)], " slots for local expert ", l, ", its record says ",
                           cnt[size_t(l * W + r)]);
  }
  return {};
}

void DispatchState::finish_receive(DispatchResult& res) {
  const Placement& P = comm->placement();
  const bool a2a = opt.dispatcher == Dispatcher::all_to_all;
  const size_t out_row = expand_row_bytes(H, dtype, opt.quant_int8);
  struct Copy { int64_t dst; const char* row; int l; };
  std::vector<Copy> copies;
  // Every transfer is over: a malformed row is rejected after the clean-up the other ranks also do.
  const std::string bad = check_received_rows();
  for (int r = 0; r < W && bad.empty(); ++r) {
    if (r == me) continue;
    int64_t ret = 0;
    for (int64_t i = 0; i < rcount[size_t(r)]; ++i) {
      char* row = const_cast<char*>(rows_from[size_t(r)]) + size_t(i) * fmt.stride;
      const int32_t tok = RowFormat::token(row);
      const int32_t* idr = RowFormat::ids(row);
      bool any = false;
      for (int64_t k = 0; k < K; ++k) {  // the slots of this row that are ours
        const int32_t e = idr[k];
        if (e < 0 || ((!a2a || pulled[size_t(r)]) && P.destination(r, tok, e) != me)) continue;
        if (!any) {
          recv.push_back({int32_t(r), tok, a2a ? ret++ : -1});
          any = true;
        }
        const int l = P.local_index(me, e);
        const int64_t dst = block[size_t(l * W + r)] + fill[size_t(l * W + r)]++;
        ent_row.push_back(dst);
        ent_w.push_back(fmt.w(row)[k]);
        int32_t* as = res.assist_info_for_combine.ptr<int32_t>() + dst * 3;
        as[0] = r, as[1] = tok, as[2] = int32_t(k);
        copies.push_back({dst, row, l});
      }
      if (any) ent_begin.push_back(int64_t(ent_row.size()));
    }
  }
  char* ex_rows = static_cast<char*>(res.expand_x.view().data);
  const bool quant = opt.quant_int8, wire_int8 = quant && !opt.smooth_scales.defined();
  const bool stream = moe::impl::stream_output(size_t(A) * out_row);
  parallel_for(int64_t(copies.size()), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const Copy& c = copies[size_t(i)];
      char* dst = ex_rows + size_t(c.dst) * out_row;
      const char* src = fmt.payload(const_cast<char*>(c.row));
      if (quant && !wire_int8)  // smooth scales: quantise per (token, expert) here
        res.dynamic_scales.ptr<float>()[c.dst] = quantize_row_int8(src, dtype, H, reinterpret_cast<int8_t*>(dst), smooth_row(c.l));
      else moe::impl::copy_row(dst, src, out_row, stream);
      if (wire_int8) res.dynamic_scales.ptr<float>()[c.dst] = RowFormat::qscale(const_cast<char*>(c.row));
    }
    moe::impl::stream_fence();
  });
  // The received rows and the caller's inputs are no longer needed.
  NodeWindow& win = comm->impl().window;
  for (auto [r, g] : held) win.release_peer(r, SlotKind::dispatch, g);
  held.clear();
  win.reserve(window_need);  // every rank calls it with the same need (collective when it grows)
  ex.reset();
  msgbuf.reset();
  sendbuf.reset();
  recvbuf.reset();
  x_view = TensorView();
  ids_view = TensorView();
  opt.smooth_scales = TensorView();
  if (!bad.empty()) throw Error(kOp, "message", "rows as the sender's record announces them", bad);
  received = true;
}

}  // namespace ot::ep
