// moe_distribute_combine: expert outputs travel back to their source ranks and are summed per
// token with the routing scales. Three wire forms (see DispatchOptions::dedup_combine):
//   dedup (default): the expert rank reduces a token's local slots, one row per (token, rank) back;
//   per-slot: one row per (token, expert) back, summed in k order at the source;
//   all_gather: partial sums for every token of every rank, reduce-scattered (Megatron).
#include <algorithm>

#include "ot/numeric.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "src/ep/internal.h"

namespace ot::ep {

namespace {
constexpr const char* kOp = "moe_distribute_combine";
enum Code { kOk, kHandle, kY, kYDtype, kShared, kMisDtype, kExperts };
const std::vector<FaultText> kTable = {
    {"", ""},
    {"dispatched", "the result of a finished dispatch on this Comm"},
    {"expert_out", "a 2-D [A, H] view with contiguous rows (A, H of the dispatch)"},
    {"expert_out", "bf16, fp16 or fp32"},
    {"shared_expert_x", "undefined or a float [BS, H] view with contiguous rows"},
    {"expert_out", "the same dtype on every rank"},
    {"experts", "the local expert computation to succeed on every rank (it threw on that rank)"},
};
}  // namespace

struct PendingCombine::State {
  std::shared_ptr<DispatchState> d;
  TensorView y, shared;
  Tensor out;
  enum class Form { dedup, per_slot, all_gather } form = Form::dedup;
  size_t row_bytes = 0;
  bool quant = false;  // comm_quant_mode 2: rows are [fp32 scale, 12 pad bytes, H int8]
  PooledBuffer sendbuf, recvbuf;
  std::vector<int> scount, sdispl, rcount, rdispl;
  MPI_Request req = MPI_REQUEST_NULL;
  bool done = true;
  void finish();
};

PendingCombine::PendingCombine(PendingCombine&& o) noexcept : st_(std::move(o.st_)), bytes_sent_(o.bytes_sent_) {}
PendingCombine& PendingCombine::operator=(PendingCombine&& o) noexcept {
  if (this != &o) {
    if (st_ && !st_->done) wait();
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
  int flag = 0;
  MPI_Test(&st_->req, &flag, MPI_STATUS_IGNORE);
  return flag != 0;
}

Tensor PendingCombine::wait() {
  if (!st_) return Tensor();
  if (!st_->done) {
    trace::OpScope scope("moe_distribute_combine_wait", "comm");
    MPI_Wait(&st_->req, MPI_STATUS_IGNORE);
    st_->d->comm->impl().untrack(&st_->req);
    st_->done = true;
    st_->finish();
  }
  return st_->out;
}

// Weighted sum of a received token's local slots (entries [b, e)) into acc (fp32).
static void add_entries(const DispatchState& d, const TensorView& y, int64_t b, int64_t e, float* acc, float* tmp) {
  const size_t yes = dtype_size(y.dtype);
  for (int64_t i = b; i < e; ++i) {
    load_row_f32(static_cast<const char*>(y.data) + d.ent_row[size_t(i)] * y.stride(0) * int64_t(yes), y.dtype, d.H, tmp);
    const float w = d.ent_w[size_t(i)];
    for (int64_t h = 0; h < d.H; ++h) acc[h] += w * tmp[h];
  }
}

PendingCombine moe_distribute_combine_start(Comm& comm, const TensorView& y, const DispatchResult& dr, const TensorView& shared) {
  return combine_start_impl(comm, y, dr, shared, false);
}

PendingCombine combine_start_impl(Comm& comm, const TensorView& y, const DispatchResult& dr, const TensorView& shared, bool experts_failed) {
  trace::OpScope scope(kOp, "comm");
  Fault fault;
  const DispatchState* dp = dr.handle.get();
  if (experts_failed) fault = {kExperts, 1};
  else if (!dp || dp->comm != &comm || !dp->received) fault = {kHandle, 0};
  else if (y.ndim != 2 || y.size(0) != dp->A || y.size(1) != dp->H || !y.last_dim_contiguous()) fault = {kY, y.ndim == 2 ? y.size(0) : y.ndim};
  else if (!is_float(y.dtype)) fault = {kYDtype, int64_t(y.dtype)};
  else if (shared.defined() && (shared.ndim != 2 || shared.size(0) != dp->BS || shared.size(1) != dp->H || !is_float(shared.dtype) ||
                                !shared.last_dim_contiguous()))
    fault = {kShared, shared.ndim == 2 ? shared.size(0) : shared.ndim};
  Meta meta;
  meta.f[0] = int64_t(y.dtype);
  // The agreement travels while this rank reduces and packs its rows (when its own arguments are
  // fine); the exchange is posted only once every rank is known to be fine.
  Agreement ag;
  agree_start(comm.mpi(), fault, meta, {}, ag);
  auto agreed = [&] { agree_finish(comm.mpi(), kOp, ag, kTable, {{0, kMisDtype}}); };
  if (fault.code != 0) agreed();  // throws on every rank

  PendingCombine pc;
  auto sp = std::make_shared<PendingCombine::State>();
  PendingAccess::state(pc) = sp;
  PendingCombine::State& st = *sp;
  st.d = dr.handle;
  st.y = y;
  st.shared = shared;
  const DispatchState& d = *dp;
  const int W = d.W, me = d.me;
  const int64_t H = d.H;
  st.out = comm.impl().tensors.get(y.dtype, {d.BS, H});
  using Form = PendingCombine::State::Form;
  st.form = d.opt.dispatcher == Dispatcher::all_gather ? Form::all_gather : d.opt.dedup_combine ? Form::dedup : Form::per_slot;
  st.scount.assign(size_t(W), 0);
  st.sdispl.assign(size_t(W), 0);
  st.rcount.assign(size_t(W), 0);
  st.rdispl.assign(size_t(W), 0);
  const size_t yes = dtype_size(y.dtype);
  int64_t bytes = 0;
  const int64_t J = int64_t(d.recv.size());

  if (st.form == Form::all_gather) {
    // Partial sums for every gathered token, then a reduce-scatter hands each rank its tokens.
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
      std::vector<float> tmp(static_cast<size_t>(H));
      for (int64_t j = j0; j < j1; ++j) {
        const auto& rv = d.recv[size_t(j)];
        add_entries(d, y, d.ent_begin[size_t(j)], d.ent_begin[size_t(j) + 1], part + (st.rdispl[size_t(rv.src)] / H + rv.tok) * H, tmp.data());
      }
    });
    bytes = (total - d.BS) * H * 4;
    agreed();
    MPI_Ireduce_scatter(part, st.recvbuf.data(), st.rcount.data(), MPI_FLOAT, MPI_SUM, comm.mpi(), &st.req);
  } else {
    const bool dedup = st.form == Form::dedup;
    st.quant = d.opt.comm_quant_mode == 2;
    st.row_bytes = st.quant ? 16 + size_t(H) : size_t(H) * yes;
    // Send block of source r: its deduplicated rows (dedup) or its slots (per-slot), in receive order.
    int64_t so = 0, ro = 0;
    for (int r = 0; r < W; ++r) {
      int64_t n_send = r == me ? 0 : dedup ? d.recv_rows[size_t(r)] : d.recv_slots[size_t(r)];
      int64_t n_recv = r == me ? 0 : dedup ? d.send_rows[size_t(r)] : d.slots_to[size_t(r)];
      st.sdispl[size_t(r)] = checked_int(so, kOp, "send rows");
      st.scount[size_t(r)] = checked_int(n_send, kOp, "send rows");
      st.rdispl[size_t(r)] = checked_int(ro, kOp, "receive rows");
      st.rcount[size_t(r)] = checked_int(n_recv, kOp, "receive rows");
      so += n_send;
      ro += n_recv;
      bytes += n_send * int64_t(st.row_bytes);
    }
    st.sendbuf = PooledBuffer(comm.impl().pool, size_t(so) * st.row_bytes);
    st.recvbuf = PooledBuffer(comm.impl().pool, size_t(ro) * st.row_bytes);
    char* sb = st.sendbuf.data();
    if (dedup) {
      parallel_for(J, [&](int64_t j0, int64_t j1) {
        std::vector<float> acc(static_cast<size_t>(H)), tmp(static_cast<size_t>(H));
        for (int64_t j = j0; j < j1; ++j) {
          const auto& rv = d.recv[size_t(j)];
          if (rv.src == me) continue;
          std::fill(acc.begin(), acc.end(), 0.f);
          add_entries(d, y, d.ent_begin[size_t(j)], d.ent_begin[size_t(j) + 1], acc.data(), tmp.data());
          char* dst = sb + size_t(st.sdispl[size_t(rv.src)] + rv.ret) * st.row_bytes;
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
        first[size_t(j)] = st.sdispl[size_t(rv.src)] + run[size_t(rv.src)];
        run[size_t(rv.src)] += d.ent_begin[size_t(j) + 1] - d.ent_begin[size_t(j)];
      }
      parallel_for(J, [&](int64_t j0, int64_t j1) {
        for (int64_t j = j0; j < j1; ++j) {
          if (d.recv[size_t(j)].src == me) continue;
          for (int64_t i = d.ent_begin[size_t(j)]; i < d.ent_begin[size_t(j) + 1]; ++i) {
            char* dst = sb + size_t(first[size_t(j)] + i - d.ent_begin[size_t(j)]) * st.row_bytes;
            const char* src = static_cast<const char*>(y.data) + d.ent_row[size_t(i)] * y.stride(0) * int64_t(yes);
            if (st.quant) *reinterpret_cast<float*>(dst) = quantize_row_int8(src, y.dtype, H, reinterpret_cast<int8_t*>(dst + 16));
            else std::memcpy(dst, src, st.row_bytes);
          }
        }
      });
    }
    MPI_Datatype rt = comm.impl().row_type(int64_t(st.row_bytes));
    agreed();
    MPI_Ialltoallv(sb, st.scount.data(), st.sdispl.data(), rt, st.recvbuf.data(), st.rcount.data(), st.rdispl.data(), rt, comm.mpi(),
                   &st.req);
  }
  st.done = false;
  comm.impl().track(&st.req);
  PendingAccess::bytes(pc) = bytes;
  scope.kernel(st.form == Form::all_gather ? "reduce_scatter" : st.form == Form::dedup ? "dedup" : "per_slot").bytes(double(bytes));
  return pc;
}

void PendingCombine::State::finish() {
  const DispatchState& dd = *d;
  const int64_t H = dd.H, K = dd.K;
  const int W = dd.W, me = dd.me;
  const size_t yes = dtype_size(y.dtype);
  const char* rb = recvbuf.data();
  const char* ybase = static_cast<const char*>(y.data);
  auto load_wire_row = [&](const char* row, float* dst) {  // a received row as fp32
    if (!quant) return load_row_f32(row, y.dtype, H, dst);
    const float sc = *reinterpret_cast<const float*>(row);
    const int8_t* q = reinterpret_cast<const int8_t*>(row + 16);
    for (int64_t h = 0; h < H; ++h) dst[h] = float(q[h]) * sc;
  };
  parallel_for(dd.BS, [&](int64_t t0, int64_t t1) {
    std::vector<float> acc(static_cast<size_t>(H)), tmp(static_cast<size_t>(H));
    for (int64_t t = t0; t < t1; ++t) {
      std::fill(acc.begin(), acc.end(), 0.f);
      if (form == Form::all_gather) {
        const float* p = reinterpret_cast<const float*>(rb) + t * H;
        for (int64_t h = 0; h < H; ++h) acc[size_t(h)] = p[h];
      } else if (form == Form::dedup) {
        for (int q = 0; q < W; ++q) {  // ranks in ascending order, this rank's own slots in its place
          if (q == me) {
            int64_t j = dd.self_j[size_t(t)];
            if (j >= 0) add_entries(dd, y, dd.ent_begin[size_t(j)], dd.ent_begin[size_t(j) + 1], acc.data(), tmp.data());
            continue;
          }
          int32_t pos = dd.token_pos[size_t(t * W + q)];
          if (pos < 0) continue;
          load_wire_row(rb + size_t(rdispl[size_t(q)] + pos) * row_bytes, tmp.data());
          for (int64_t h = 0; h < H; ++h) acc[size_t(h)] += tmp[size_t(h)];
        }
      } else {
        for (int64_t k = 0; k < K; ++k) {  // k order: the spec's sum
          int q = dd.slot_dest[size_t(t * K + k)];
          if (q < 0) continue;  // inactive slot
          int64_t r = dd.slot_ret[size_t(t * K + k)];
          if (q == me) load_row_f32(ybase + r * y.stride(0) * int64_t(yes), y.dtype, H, tmp.data());
          else load_wire_row(rb + size_t(rdispl[size_t(q)] + r) * row_bytes, tmp.data());
          const float w = dd.scales[size_t(t * K + k)];
          for (int64_t h = 0; h < H; ++h) acc[size_t(h)] += w * tmp[size_t(h)];
        }
      }
      const bool active = dd.token_active.empty() || dd.token_active[size_t(t)];
      if (shared.defined() && active) {  // shared experts are added unweighted; inactive tokens stay zero
        load_row_f32(static_cast<const char*>(shared.data) + t * shared.stride(0) * int64_t(dtype_size(shared.dtype)), shared.dtype, H,
                     tmp.data());
        for (int64_t h = 0; h < H; ++h) acc[size_t(h)] += tmp[size_t(h)];
      }
      char* dst = static_cast<char*>(out.view().data) + t * H * int64_t(yes);
      if (y.dtype == DType::f32) std::memcpy(dst, acc.data(), size_t(H) * 4);
      else convert_from_f32(acc.data(), dst, y.dtype, H);
    }
  });
  sendbuf.reset();
  recvbuf.reset();
}

Tensor moe_distribute_combine(Comm& comm, const TensorView& y, const DispatchResult& d, const TensorView& shared) {
  PendingCombine pc = moe_distribute_combine_start(comm, y, d, shared);
  return pc.wait();
}

}  // namespace ot::ep
