// moe_distribute_combine: expert outputs travel back to their source ranks and are summed per
// token with the routing scales. Three wire forms (see DispatchOptions::dedup_combine):
//   dedup (default): the expert rank reduces a token's local slots, one row per (token, rank) back;
//   per-slot: one row per (token, expert) back, summed in k order at the source;
//   all_gather: partial sums for every token of every rank, reduce-scattered (Megatron).
// The message sizes are known from the dispatch, so the all_to_all forms are ONE round: each message
// is [record (validation outcome)][rows], and every rank decides from the records it received.
#include <algorithm>

#include "ot/numeric.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "src/core/elem_at.h"
#include "src/ep/internal.h"

namespace ot::ep {

namespace {
constexpr const char* kOp = "moe_distribute_combine";
enum Code { kOk, kHandle, kY, kYDtype, kShared, kMisDtype, kExperts, kOriX, kConst };
const std::vector<FaultText> kTable = {
    {"", ""},
    {"dispatched", "the result of a finished dispatch on this Comm"},
    {"expert_out", "a 2-D [A, H] view with contiguous rows (A, H of the dispatch)"},
    {"expert_out", "bf16, fp16 or fp32"},
    {"shared_expert_x", "undefined or a float [BS, H] view with contiguous rows"},
    {"expert_out", "the same dtype on every rank"},
    {"experts", "the local expert computation to succeed on every rank (it threw on that rank)"},
    {"ori_x", "a float [BS, H] view with contiguous rows (copy or const experts are in use)"},
    {"const_expert_alpha_1/const_expert_alpha_2/const_expert_v", "fp32 [const_expert_num] alphas and a float [const_expert_num, H] v"},
};

bool float_rows(const TensorView& v, int64_t rows, int64_t cols) {
  return v.defined() && v.ndim == 2 && v.size(0) == rows && v.size(1) == cols && is_float(v.dtype) && v.last_dim_contiguous();
}
bool f32_vector(const TensorView& v, int64_t n) { return v.defined() && v.ndim == 1 && v.size(0) == n && v.dtype == DType::f32 && v.stride(0) == 1; }

Fault validate(const Comm& comm, const TensorView& y, const DispatchState* dp, const CombineInputs& in, bool experts_failed) {
  if (experts_failed) return {kExperts, 1};
  if (!dp || dp->comm != &comm || !dp->received) return {kHandle, 0};
  if (y.ndim != 2 || y.size(0) != dp->A || y.size(1) != dp->H || !y.last_dim_contiguous()) return {kY, y.ndim == 2 ? y.size(0) : y.ndim};
  if (!is_float(y.dtype)) return {kYDtype, int64_t(y.dtype)};
  if (in.shared_expert_x.defined() && !float_rows(in.shared_expert_x, dp->BS, dp->H))
    return {kShared, in.shared_expert_x.ndim == 2 ? in.shared_expert_x.size(0) : in.shared_expert_x.ndim};
  const DispatchOptions& o = dp->opt;
  if (o.copy_expert_num + o.const_expert_num > 0 && !float_rows(in.ori_x, dp->BS, dp->H))
    return {kOriX, in.ori_x.ndim == 2 ? in.ori_x.size(0) : in.ori_x.ndim};
  const int64_t Q = o.const_expert_num;
  if (Q > 0 && (!f32_vector(in.const_expert_alpha_1, Q) || !f32_vector(in.const_expert_alpha_2, Q) || !float_rows(in.const_expert_v, Q, dp->H)))
    return {kConst, Q};
  return {};
}
}  // namespace

struct PendingCombine::State {
  Comm* comm = nullptr;
  std::shared_ptr<DispatchState> d;
  TensorView y;
  CombineInputs in;
  Tensor out;
  enum class Form { dedup, per_slot, all_gather } form = Form::dedup;
  size_t row_bytes = 0;
  bool quant = false;  // comm_quant_mode 2: rows are [fp32 scale, 12 pad bytes, H int8]
  Fault fault;
  int64_t dtype_code = 0;
  PeerExchange ex;     // records (+ rows in the all_to_all forms)
  PooledBuffer msgbuf, sendbuf, recvbuf;
  std::vector<int> rcount, rdispl;
  std::vector<const char*> rows_from;
  MPI_Request req = MPI_REQUEST_NULL;  // all_gather's reduce-scatter
  bool done = true;
  // Node-window slots: the rows from q are in window where[q] - 1 (0: after q's record); held are
  // freed once summed (or when the state dies: a call that threw).
  std::vector<int64_t> where;
  std::vector<std::pair<int, int64_t>> held;
  ~State() {
    for (auto [r, g] : held) comm->impl().window.release(r, SlotKind::combine, g);
  }
  void decide_or_throw();
  void finish();
};

PendingCombine::PendingCombine(PendingCombine&& o) noexcept : st_(std::move(o.st_)), bytes_sent_(o.bytes_sent_) {}
PendingCombine& PendingCombine::operator=(PendingCombine&& o) noexcept {
  if (this != &o) {
    if (st_ && !st_->done) {
      try { wait(); } catch (...) {}
    }
    st_ = std::move(o.st_);
    bytes_sent_ = o.bytes_sent_;
  }
  return *this;
}
PendingCombine::~PendingCombine() {
  if (st_ && !st_->done) {
    try { wait(); } catch (...) {}
  }
}

bool PendingCombine::test() {
  if (!st_ || st_->done) return true;
  if (st_->form == State::Form::all_gather) {
    int flag = 0;
    MPI_Test(&st_->req, &flag, MPI_STATUS_IGNORE);
    return flag != 0;
  }
  return st_->ex.test();
}

// Every rank's record (this rank's own from its local check): all proceed or all throw alike.
void PendingCombine::State::decide_or_throw() {
  Meta meta;
  meta.f[0] = dtype_code;
  agree(kOp, ex, comm->ep_rank_id(), own_record(fault, meta), 1, held, kTable, {{0, kMisDtype}});
  where.assign(size_t(comm->ep_world_size()), 0);
  for (auto [r, g] : held) where[size_t(r)] = g + 1;
}

Tensor PendingCombine::wait() {
  if (!st_) return Tensor();
  if (!st_->done) {
    trace::OpScope scope("moe_distribute_combine_wait", "comm");
    State& st = *st_;
    st.done = true;
    if (st.form == State::Form::all_gather) {
      wait_row_collective(*st.comm, &st.req, st_, kOp);
    } else {
      st.ex.wait();
      st.decide_or_throw();
    }
    st.finish();
  }
  return st_->out;
}

// Weighted sum of a received token's local slots (entries [b, e)) into acc (fp32), converted in
// registers (ot::accumulate_f32, the MoE layer's combine step).
static void add_entries(const DispatchState& d, const TensorView& y, int64_t b, int64_t e, float* acc) {
  const size_t yes = dtype_size(y.dtype);
  for (int64_t i = b; i < e; ++i)
    accumulate_f32(static_cast<const char*>(y.data) + d.ent_row[size_t(i)] * y.stride(0) * int64_t(yes), y.dtype, d.ent_w[size_t(i)], acc, d.H);
}

PendingCombine moe_distribute_combine_start(Comm& comm, const TensorView& y, const DispatchResult& dr, const TensorView& shared) {
  CombineInputs in;
  in.shared_expert_x = shared;
  return combine_start_impl(comm, y, dr, in, false);
}
PendingCombine moe_distribute_combine_start(Comm& comm, const TensorView& y, const DispatchResult& dr, const CombineInputs& in) {
  return combine_start_impl(comm, y, dr, in, false);
}

PendingCombine combine_start_impl(Comm& comm, const TensorView& y, const DispatchResult& dr, const CombineInputs& in, bool experts_failed) {
  trace::OpScope scope(kOp, "comm");
  check_not_broken(comm, kOp);
  const DispatchState* dp = dr.handle.get();
  const int W = comm.ep_world_size(), me = comm.ep_rank_id();
  PendingCombine pc;
  auto sp = std::make_shared<PendingCombine::State>();
  PendingAccess::state(pc) = sp;
  PendingCombine::State& st = *sp;
  st.comm = &comm;
  st.fault = validate(comm, y, dp, in, experts_failed);
  st.dtype_code = int64_t(y.dtype);
  st.done = false;
  const bool ok = st.fault.code == 0;
  const size_t rec = record_bytes(0);
  MessageLayout msg(W);
  using Form = PendingCombine::State::Form;
  // A rank that cannot read its handle does not know the form: it sends its record alone and throws
  // with every rank once the records are in.
  const bool known = dp && dp->comm == &comm && dp->received;
  st.form = !known ? Form::per_slot : dp->opt.dispatcher == Dispatcher::all_gather ? Form::all_gather
                                    : dp->opt.dedup_combine                       ? Form::dedup
                                                                                  : Form::per_slot;
  auto records_only = [&] {
    for (int q = 0; q < W; ++q)
      if (q != me) msg.add(q, rec);
    st.msgbuf = PooledBuffer(comm.impl().pool, msg.buffer_bytes());
  };
  std::vector<int64_t> slot_gen(static_cast<size_t>(W), 0);  // meta field 1: node-window slot + 1 of the rows to q
  auto write_records = [&] {
    Meta meta;
    meta.f[0] = st.dtype_code;
    for (int q = 0; q < W; ++q) {
      meta.f[1] = slot_gen[size_t(q)];
      if (q != me) write_record(st.msgbuf.data() + msg.off[size_t(q)], st.fault, meta);
    }
  };
  if (!ok || !known) {
    records_only();
    write_records();
    st.ex.start(comm, kTagCombine, st.msgbuf.data(), msg.off, msg.len);
    if (!known || st.form == Form::all_gather) {  // peers decide at once too (all_gather) or cannot be told apart
      st.done = true;
      st.ex.wait();
      st.decide_or_throw();  // throws: this rank's record has the fault
    }
    return pc;  // all_to_all forms: every rank throws at wait()
  }

  const DispatchState& d = *dp;
  st.d = dr.handle;
  st.y = y;
  st.in = in;
  const int64_t H = d.H;
  st.out = comm.impl().tensors.get(y.dtype, {d.BS, H});
  st.rcount.assign(size_t(W), 0);
  st.rdispl.assign(size_t(W), 0);
  const size_t yes = dtype_size(y.dtype);
  int64_t bytes = 0;
  const int64_t J = int64_t(d.recv.size());

  if (st.form == Form::all_gather) {
    // The records first (the reduce-scatter cannot carry them), while this rank computes partial
    // sums for every gathered token; then a reduce-scatter hands each rank its tokens.
    records_only();
    write_records();
    st.ex.start(comm, kTagCombine, st.msgbuf.data(), msg.off, msg.len);
    int64_t total = 0;
    for (int r = 0; r < W; ++r) {
      st.rdispl[size_t(r)] = checked_int(total * H, kOp, "reduce-scatter count");
      st.rcount[size_t(r)] = checked_int(d.all_bs[size_t(r)] * H, kOp, "reduce-scatter count");
      total += d.all_bs[size_t(r)];
    }
    st.sendbuf = PooledBuffer(comm.impl().pool, size_t(total * H) * 4);
    st.recvbuf = PooledBuffer(comm.impl().pool, size_t(d.BS * H) * 4);
    float* part = reinterpret_cast<float*>(st.sendbuf.data());
    std::fill(part, part + total * H, 0.f);
    parallel_for(J, [&](int64_t j0, int64_t j1) {
      for (int64_t j = j0; j < j1; ++j) {
        const auto& rv = d.recv[size_t(j)];
        add_entries(d, y, d.ent_begin[size_t(j)], d.ent_begin[size_t(j) + 1], part + (st.rdispl[size_t(rv.src)] / H + rv.tok) * H);
      }
    });
    bytes = (total - d.BS) * H * 4 + int64_t(rec) * (W - 1);
    st.ex.wait();
    st.done = true;  // (nothing to finish if the records say stop)
    st.decide_or_throw();
    st.done = false;
    MPI_Ireduce_scatter(part, st.recvbuf.data(), st.rcount.data(), MPI_FLOAT, MPI_SUM, comm.mpi(), &st.req);
    comm.impl().track(&st.req);
  } else {
    const bool dedup = st.form == Form::dedup;
    st.quant = d.opt.comm_quant_mode == 2;
    st.row_bytes = st.quant ? 16 + size_t(H) : size_t(H) * yes;
    // Message to source r: [record][its deduplicated rows (dedup) or its slots (per-slot), in
    // receive order], packed in place; or the record alone, the rows written straight into r's
    // node-window slot.
    NodeWindow& win = comm.impl().window;
    std::vector<char*> slot(static_cast<size_t>(W), nullptr);
    for (int r = 0; r < W; ++r) {
      if (r == me) continue;
      const int64_t n_send = dedup ? d.recv_rows[size_t(r)] : d.recv_slots[size_t(r)];
      st.rcount[size_t(r)] = checked_int(dedup ? d.send_rows[size_t(r)] : d.slots_to[size_t(r)], kOp, "receive rows");
      int64_t gen = 0;
      if (n_send > 0 && (slot[size_t(r)] = win.claim(r, SlotKind::combine, size_t(n_send) * st.row_bytes, &gen))) slot_gen[size_t(r)] = gen + 1;
      msg.add(r, rec + (slot[size_t(r)] ? 0 : size_t(n_send) * st.row_bytes));
      bytes += n_send * int64_t(st.row_bytes) + int64_t(rec);  // rows and the record
    }
    st.msgbuf = PooledBuffer(comm.impl().pool, msg.buffer_bytes());
    write_records();
    std::vector<char*> base(static_cast<size_t>(W), nullptr);
    for (int r = 0; r < W; ++r) base[size_t(r)] = slot[size_t(r)] ? slot[size_t(r)] : st.msgbuf.data() + msg.off[size_t(r)] + rec;
    if (dedup) {
      parallel_for(J, [&](int64_t j0, int64_t j1) {
        std::vector<float> acc(static_cast<size_t>(H));
        for (int64_t j = j0; j < j1; ++j) {
          const auto& rv = d.recv[size_t(j)];
          if (rv.src == me) continue;
          std::fill(acc.begin(), acc.end(), 0.f);
          add_entries(d, y, d.ent_begin[size_t(j)], d.ent_begin[size_t(j) + 1], acc.data());
          char* dst = base[size_t(rv.src)] + size_t(rv.ret) * st.row_bytes;
          if (st.quant) *reinterpret_cast<float*>(dst) = quantize_row_int8(acc.data(), DType::f32, H, reinterpret_cast<int8_t*>(dst + 16));
          else if (y.dtype == DType::f32) std::memcpy(dst, acc.data(), st.row_bytes);
          else convert_from_f32(acc.data(), dst, y.dtype, H);
        }
      });
    } else {
      // Entries of the tokens from r are consecutive in d.recv; their slot rows go out in that order.
      std::vector<int64_t> first(size_t(J), 0), run(size_t(W), 0);
      for (int64_t j = 0; j < J; ++j) {
        const auto& rv = d.recv[size_t(j)];
        first[size_t(j)] = run[size_t(rv.src)];
        run[size_t(rv.src)] += d.ent_begin[size_t(j) + 1] - d.ent_begin[size_t(j)];
      }
      parallel_for(J, [&](int64_t j0, int64_t j1) {
        for (int64_t j = j0; j < j1; ++j) {
          const int src_rank = d.recv[size_t(j)].src;
          if (src_rank == me) continue;
          for (int64_t i = d.ent_begin[size_t(j)]; i < d.ent_begin[size_t(j) + 1]; ++i) {
            char* dst = base[size_t(src_rank)] + size_t(first[size_t(j)] + i - d.ent_begin[size_t(j)]) * st.row_bytes;
            const char* src = static_cast<const char*>(y.data) + d.ent_row[size_t(i)] * y.stride(0) * int64_t(yes);
            if (st.quant) *reinterpret_cast<float*>(dst) = quantize_row_int8(src, y.dtype, H, reinterpret_cast<int8_t*>(dst + 16));
            else std::memcpy(dst, src, st.row_bytes);
          }
        }
      });
    }
    win.publish();
    st.ex.start(comm, kTagCombine, st.msgbuf.data(), msg.off, msg.len);
  }
  PendingAccess::bytes(pc) = bytes;
  scope.kernel(st.form == Form::all_gather ? "reduce_scatter" : st.form == Form::dedup ? "dedup" : "per_slot").bytes(double(bytes));
  return pc;
}

void PendingCombine::State::finish() {
  const DispatchState& dd = *d;
  const int64_t H = dd.H, K = dd.K;
  const int W = dd.W, me = dd.me;
  const size_t yes = dtype_size(y.dtype);
  if (form != Form::all_gather) {
    rows_from.assign(size_t(W), nullptr);
    for (int q = 0; q < W; ++q) {
      if (q == me) continue;
      const int64_t g = where[size_t(q)];
      const char* rows = payload_of(ex, q, 0, g > 0 ? 0 : size_t(rcount[size_t(q)]) * row_bytes, kOp, "the size the dispatch implies");
      rows_from[size_t(q)] = g > 0 ? comm->impl().window.slot(q, SlotKind::combine, g - 1) : rows;
    }
  }
  const char* ybase = static_cast<const char*>(y.data);
  auto add_wire_row = [&](const char* row, float w, float* acc) {  // acc += w * a received row
    if (!quant) return accumulate_f32(row, y.dtype, w, acc, H);
    const float sc = *reinterpret_cast<const float*>(row);
    const int8_t* q = reinterpret_cast<const int8_t*>(row + 16);
    for (int64_t h = 0; h < H; ++h) acc[h] += w * (float(q[h]) * sc);
  };
  // Zero / copy / const experts of slot (t, k) (spec 9.3), computed here on the token's own rank.
  const DispatchOptions& o = dd.opt;
  // xt: ori_x[t] in fp32, converted at the token's first copy/const slot only (have_x).
  auto add_special = [&](int64_t t, int64_t k, float* acc, float* xt, bool& have_x, float* tmp2) {
    const int32_t s = dd.special[size_t(t * K + k)];
    if (s < o.zero_expert_num) return;  // the zero expert outputs 0
    const float w = dd.scales[size_t(t * K + k)];
    if (!have_x) load_row_f32(row_at(in.ori_x, t), in.ori_x.dtype, H, xt), have_x = true;
    if (s < o.zero_expert_num + o.copy_expert_num) {
      for (int64_t h = 0; h < H; ++h) acc[h] += w * xt[h];
      return;
    }
    const int64_t c = s - o.zero_expert_num - o.copy_expert_num;
    const float a1 = in.const_expert_alpha_1.ptr<float>()[c], a2 = in.const_expert_alpha_2.ptr<float>()[c];
    load_row_f32(row_at(in.const_expert_v, c), in.const_expert_v.dtype, H, tmp2);
    for (int64_t h = 0; h < H; ++h) acc[h] += w * (a1 * xt[h] + a2 * tmp2[h]);
  };
  const bool any_special = !dd.special.empty();
  const TensorView& shared = in.shared_expert_x;
  parallel_for(dd.BS, [&](int64_t t0, int64_t t1) {
    std::vector<float> acc(static_cast<size_t>(H)), tmp(static_cast<size_t>(H)), tmp2(any_special ? size_t(H) : 0);
    for (int64_t t = t0; t < t1; ++t) {
      std::fill(acc.begin(), acc.end(), 0.f);
      bool have_x = false;
      if (form == Form::all_gather) {
        const float* p = reinterpret_cast<const float*>(recvbuf.data()) + t * H;
        for (int64_t h = 0; h < H; ++h) acc[size_t(h)] = p[h];
      } else if (form == Form::dedup) {
        for (int q = 0; q < W; ++q) {  // ranks in ascending order, this rank's own slots in its place
          if (q == me) {
            int64_t j = dd.self_j[size_t(t)];
            if (j >= 0) add_entries(dd, y, dd.ent_begin[size_t(j)], dd.ent_begin[size_t(j) + 1], acc.data());
            continue;
          }
          int32_t pos = dd.token_pos[size_t(t * W + q)];
          if (pos >= 0) add_wire_row(rows_from[size_t(q)] + size_t(pos) * row_bytes, 1.f, acc.data());
        }
      }
      if (form == Form::per_slot) {
        for (int64_t k = 0; k < K; ++k) {  // k order: the spec's sum
          int q = dd.slot_dest[size_t(t * K + k)];
          if (q < 0) {  // inactive, or a zero/copy/const expert
            if (any_special && dd.special[size_t(t * K + k)] >= 0) add_special(t, k, acc.data(), tmp.data(), have_x, tmp2.data());
            continue;
          }
          int64_t r = dd.slot_ret[size_t(t * K + k)];
          const float w = dd.scales[size_t(t * K + k)];
          if (q == me) accumulate_f32(ybase + r * y.stride(0) * int64_t(yes), y.dtype, w, acc.data(), H);
          else add_wire_row(rows_from[size_t(q)] + size_t(r) * row_bytes, w, acc.data());
        }
      } else if (any_special) {  // after the routed experts' partial sums, in k order
        for (int64_t k = 0; k < K; ++k)
          if (dd.special[size_t(t * K + k)] >= 0) add_special(t, k, acc.data(), tmp.data(), have_x, tmp2.data());
      }
      const bool active = dd.token_active.empty() || dd.token_active[size_t(t)];
      if (shared.defined() && active) {  // shared experts are added unweighted; inactive tokens stay zero
        accumulate_f32(row_at(shared, t), shared.dtype, 1.f, acc.data(), H);
      }
      char* dst = static_cast<char*>(out.view().data) + t * H * int64_t(yes);
      if (y.dtype == DType::f32) std::memcpy(dst, acc.data(), size_t(H) * 4);
      else convert_from_f32(acc.data(), dst, y.dtype, H);
    }
  });
  for (auto [r, g] : held) comm->impl().window.release(r, SlotKind::combine, g);
  held.clear();
  ex.release();
  msgbuf.reset();
  sendbuf.reset();
  recvbuf.reset();
}

Tensor moe_distribute_combine(Comm& comm, const TensorView& y, const DispatchResult& d, const TensorView& shared) {
  PendingCombine pc = moe_distribute_combine_start(comm, y, d, shared);
  return pc.wait();
}
Tensor moe_distribute_combine(Comm& comm, const TensorView& y, const DispatchResult& d, const CombineInputs& in) {
  PendingCombine pc = moe_distribute_combine_start(comm, y, d, in);
  return pc.wait();
}

}  // namespace ot::ep
