// `ot bench ep` (run under mpirun): dispatch + combine time and bytes on the wire versus a baseline
// in the same run that sends one copy per (token, expert) with a blocking all-to-all and separate
// permutation passes (Megatron's alltoall dispatcher: permute, all-to-all, regroup; and back).
// Expert compute is the identity, so only communication and data movement are timed.
#include <malloc.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "bench_harness.h"
#include "ot/ep.h"
#include "ot/numeric.h"
#include "ot/parallel.h"

namespace ot::cli {
namespace bench_ep_local {

using namespace ot::ep;

struct Routing {
  Tensor x, ids, w;
};

Routing make_routing(int64_t BS, int64_t H, int64_t K, int64_t E, int rank) {
  Routing r{Tensor::empty(DType::bf16, {BS, H}), Tensor::empty(DType::i32, {BS, K}), Tensor::empty(DType::f32, {BS, K})};
  uint64_t s = 88172645463325252ull ^ uint64_t(rank + 1) * 0x9E3779B97F4A7C15ull;
  auto next = [&] { s ^= s << 13; s ^= s >> 7; s ^= s << 17; return s; };
  for (int64_t i = 0; i < BS * H; ++i) r.x.ptr<uint16_t>()[i] = f32_to_bf16(float(int64_t(next() % 2001) - 1000) / 1000.f);
  std::vector<int> pool(static_cast<size_t>(E));
  for (int64_t t = 0; t < BS; ++t) {
    std::iota(pool.begin(), pool.end(), 0);
    for (int64_t k = 0; k < K; ++k) {
      std::swap(pool[size_t(k)], pool[size_t(k) + next() % uint64_t(E - k)]);
      r.ids.ptr<int32_t>()[t * K + k] = pool[size_t(k)];
      r.w.ptr<float>()[t * K + k] = float(next() % 1000) / 1000.f;
    }
  }
  return r;
}

// The baseline: one row per (token, expert), blocking all-to-alls, permutations as separate passes.
struct Baseline {
  int W, me;
  int64_t BS, H, K, E, L;
  std::vector<int32_t> perm;                 // permuted position -> flat slot (t*K+k), sorted by expert
  std::vector<int64_t> pos_of;               // flat slot -> permuted position
  std::vector<int> scount, sdispl, rcount, rdispl;  // rows, per rank
  std::vector<int64_t> recv_counts;          // [W][L] rows from rank r for local expert l
  std::vector<uint16_t> sendbuf, recvbuf, expand, ybuf, back;
  int64_t bytes = 0;
  MPI_Datatype row;

  Baseline(MPI_Comm comm, const Routing& r, int64_t E_) : E(E_) {
    MPI_Comm_size(comm, &W);
    MPI_Comm_rank(comm, &me);
    BS = r.x.size(0), H = r.x.size(1), K = r.ids.size(1), L = E / W;
    MPI_Type_contiguous(int(H * 2), MPI_BYTE, &row);
    MPI_Type_commit(&row);
  }
  ~Baseline() { MPI_Type_free(&row); }

  void dispatch(MPI_Comm comm, const Routing& r) {
    // 1. Permute (stable sort of slots by expert, i.e. by destination rank, then expert).
    const int32_t* ids = r.ids.ptr<int32_t>();
    std::vector<int64_t> cnt(size_t(E), 0);
    for (int64_t j = 0; j < BS * K; ++j) ++cnt[size_t(ids[j])];
    std::vector<int64_t> off(size_t(E) + 1, 0);
    for (int64_t e = 0; e < E; ++e) off[size_t(e) + 1] = off[size_t(e)] + cnt[size_t(e)];
    perm.resize(size_t(BS * K));
    pos_of.resize(size_t(BS * K));
    std::vector<int64_t> fill(off.begin(), off.end() - 1);
    for (int64_t j = 0; j < BS * K; ++j) {
      int64_t p = fill[size_t(ids[j])]++;
      perm[size_t(p)] = int32_t(j);
      pos_of[size_t(j)] = p;
    }
    sendbuf.resize(size_t(BS * K * H));
    const uint16_t* x = r.x.ptr<uint16_t>();
    parallel_for(BS * K, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) std::memcpy(&sendbuf[size_t(p * H)], x + (perm[size_t(p)] / K) * H, size_t(H) * 2);
    });
    // 2. Counts per (destination, local expert), then the blocking all-to-all of the rows.
    recv_counts.assign(size_t(W * L), 0);
    MPI_Alltoall(cnt.data(), int(L), MPI_INT64_T, recv_counts.data(), int(L), MPI_INT64_T, comm);
    scount.assign(size_t(W), 0), sdispl.assign(size_t(W), 0), rcount.assign(size_t(W), 0), rdispl.assign(size_t(W), 0);
    int64_t ro = 0;
    bytes = 0;
    for (int q = 0; q < W; ++q) {
      sdispl[size_t(q)] = int(off[size_t(q * L)]);
      scount[size_t(q)] = int(off[size_t((q + 1) * L)] - off[size_t(q * L)]);
      rdispl[size_t(q)] = int(ro);
      for (int64_t l = 0; l < L; ++l) ro += recv_counts[size_t(q * L + l)];
      rcount[size_t(q)] = int(ro - rdispl[size_t(q)]);
      if (q != me) bytes += int64_t(scount[size_t(q)]) * H * 2;
    }
    recvbuf.resize(size_t(ro * H));
    MPI_Alltoallv(sendbuf.data(), scount.data(), sdispl.data(), row, recvbuf.data(), rcount.data(), rdispl.data(), row, comm);
    // 3. Regroup [source rank][local expert] -> [local expert][source rank].
    expand.resize(size_t(ro * H));
    regroup(recvbuf.data(), expand.data(), true);
  }

  // Moves blocks between (r, l) order and (l, r) order.
  void regroup(const uint16_t* src, uint16_t* dst, bool to_expert_major) {
    std::vector<int64_t> rl(size_t(W * L) + 1, 0), lr(size_t(W * L) + 1, 0);
    for (int q = 0; q < W; ++q)
      for (int64_t l = 0; l < L; ++l) rl[size_t(q * L + l) + 1] = rl[size_t(q * L + l)] + recv_counts[size_t(q * L + l)];
    for (int64_t l = 0; l < L; ++l)
      for (int q = 0; q < W; ++q) lr[size_t(l * W + q) + 1] = lr[size_t(l * W + q)] + recv_counts[size_t(q * L + l)];
    parallel_for(W * L, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        int q = int(b / L);
        int64_t l = b % L, n = recv_counts[size_t(b)];
        int64_t a = rl[size_t(b)], e = lr[size_t(l * W + q)];
        if (to_expert_major) std::memcpy(dst + e * H, src + a * H, size_t(n * H) * 2);
        else std::memcpy(dst + a * H, src + e * H, size_t(n * H) * 2);
      }
    });
  }

  void combine(MPI_Comm comm, const Routing& r, const uint16_t* y, Tensor& out) {
    ybuf.resize(expand.size());
    regroup(y, ybuf.data(), false);
    back.resize(sendbuf.size());
    MPI_Alltoallv(ybuf.data(), rcount.data(), rdispl.data(), row, back.data(), scount.data(), sdispl.data(), row, comm);
    for (int q = 0; q < W; ++q)
      if (q != me) bytes += int64_t(rcount[size_t(q)]) * H * 2;
    // Unpermute with probabilities: out[t] = sum_k w * row(t, k).
    const float* w = r.w.ptr<float>();
    parallel_for(BS, [&](int64_t t0, int64_t t1) {
      std::vector<float> acc(static_cast<size_t>(H));
      for (int64_t t = t0; t < t1; ++t) {
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int64_t k = 0; k < K; ++k)  // the MoE layer's weighted row combine, in registers
          accumulate_f32(back.data() + pos_of[size_t(t * K + k)] * H, DType::bf16, w[t * K + k], acc.data(), H);
        convert_from_f32(acc.data(), out.ptr<uint16_t>() + t * H, DType::bf16, H);
      }
    });
  }
};

double max_over_ranks(double v) {
  double m = 0;
  MPI_Allreduce(&v, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return m;
}
int64_t sum_over_ranks(int64_t v) {
  int64_t s = 0;
  MPI_Allreduce(&v, &s, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  return s;
}
// Slowest rank's time of fn (after a barrier so all ranks start together).
double timed_ms(const std::function<void()>& fn) {
  MPI_Barrier(MPI_COMM_WORLD);
  auto t0 = std::chrono::steady_clock::now();
  fn();
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return max_over_ranks(ms);
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct EpArgs {
  bool quant = false, all_gather = false, per_slot = false, comm_quant = false, no_window = false;
};

int run_bench(const BenchOptions& opt, const EpArgs& a) {
  // Keep freed large blocks in the heap: the operators return fresh tensors each call, and on a VM
  // first-touch page faults of an unmapped 50 MB block cost more than the exchange itself. (A
  // serving process sets the same through MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_.)
  mallopt(M_MMAP_MAX, 0);  // (M_MMAP_THRESHOLD is capped at 32 MB; expand_x is larger)
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) MPI_Init(nullptr, nullptr);
  int W = 1, me = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  const int64_t H = 7168, K = 8, E = 64;
  int status = 0;
  if (E % W != 0) {
    if (me == 0) std::fprintf(stderr, "ot bench ep: 64 experts need a world size dividing 64 (got %d)\n", W);
    status = 2;
  }
  for (int64_t BS : {32, 128, 512}) {
    if (status) break;
    std::string name = "ep-h7168-k8-e64-bs" + std::to_string(BS);
    if (!opt.selected(name)) continue;
    Routing r = make_routing(BS, H, K, E, me);
    // Threads: --threads when given, else the Comm shares the node's cores among its ranks (4 ranks
    // on 2 cores: 1 each); the baseline below runs with the same setting.
    CommOptions co;
    co.threads = opt.threads > 0 ? opt.threads : -1;
    co.node_window = !a.no_window;
    Comm comm(MPI_COMM_WORLD, E, co);
    DispatchOptions o;
    o.moe_expert_num = E;
    o.quant_int8 = a.quant;
    o.dispatcher = a.all_gather ? Dispatcher::all_gather : Dispatcher::all_to_all;
    o.dedup_combine = !a.per_slot;
    o.comm_quant_mode = a.comm_quant ? 2 : 0;
    Baseline base(MPI_COMM_WORLD, r, E);
    Tensor base_out = Tensor::empty(DType::bf16, {BS, H}), out;
    int64_t bytes = 0;
    DispatchResult d;
    Tensor y;
    auto dispatch = [&] {
      d = DispatchResult();  // a serving loop drops the previous step's tensors first: reuse, no new pages
      y = Tensor();
      d = moe_distribute_dispatch(comm, r.x, r.ids, r.w, o);
    };
    // Identity experts (untimed): the expert output is the received row, dequantised when int8.
    auto experts = [&] {
      y = d.expand_x;
      if (!a.quant) return;
      y = Tensor::empty(DType::bf16, {d.expand_x.size(0), H});
      for (int64_t i = 0; i < y.size(0); ++i) {
        const int8_t* q = reinterpret_cast<const int8_t*>(d.expand_x.ptr<uint8_t>() + i * H);
        float s = d.dynamic_scales.ptr<float>()[i];
        for (int64_t h = 0; h < H; ++h) y.ptr<uint16_t>()[i * H + h] = f32_to_bf16(float(q[h]) * s);
      }
    };
    auto combine = [&] {
      out = Tensor();
      PendingCombine pc = moe_distribute_combine_start(comm, y, d);
      out = pc.wait();
      bytes = d.bytes_sent + pc.bytes_sent();
    };
    // Dispatch + combine back to back on each rank (as the baseline's pair is timed), the slowest
    // rank's sum; only the identity experts' int8 dequantisation (--quant) in between is not timed.
    auto fast = [&] {
      using clk = std::chrono::steady_clock;
      MPI_Barrier(MPI_COMM_WORLD);
      auto t0 = clk::now();
      dispatch();
      auto t1 = clk::now();
      experts();
      auto t2 = clk::now();
      combine();
      auto t3 = clk::now();
      return max_over_ranks(std::chrono::duration<double, std::milli>((t1 - t0) + (t3 - t2)).count());
    };
    auto ref = [&] {
      base.dispatch(MPI_COMM_WORLD, r);
      base.combine(MPI_COMM_WORLD, r, base.expand.data(), base_out);
    };
    int reps = opt.repeats > 0 ? opt.repeats : (BS >= 512 ? 5 : 11);
    fast();
    ref();
    std::vector<double> tf, tr;
    for (int i = 0; i < reps; ++i) {
      tf.push_back(fast());
      if (!opt.no_ref) tr.push_back(timed_ms(ref));
    }
    // Same answer as the baseline (both are bf16 sums of the same rows; int8 adds its own error).
    double err = 0, scale = 1e-30;
    for (int64_t i = 0; i < BS * H; ++i) {
      err = std::max(err, double(std::fabs(bf16_to_f32(out.ptr<uint16_t>()[i]) - bf16_to_f32(base_out.ptr<uint16_t>()[i]))));
      scale = std::max(scale, double(std::fabs(bf16_to_f32(base_out.ptr<uint16_t>()[i]))));
    }
    double rel = max_over_ranks(err / scale);
    // Dedup bound: payload of one row per (token, distinct remote destination rank), both ways.
    int64_t bound_rows = 0;
    for (int64_t t = 0; t < BS; ++t) {
      std::vector<int> dests;
      for (int64_t k = 0; k < K; ++k) {
        int q = comm.placement().destination(me, t, r.ids.ptr<int32_t>()[t * K + k]);
        if (q != me && std::find(dests.begin(), dests.end(), q) == dests.end()) dests.push_back(q);
      }
      bound_rows += int64_t(dests.size());
    }
    int64_t all_bytes = sum_over_ranks(bytes), all_base = sum_over_ranks(base.bytes);
    int64_t bound = sum_over_ranks(bound_rows) * H * 2 * 2;
    if (me == 0) {
      BenchResult res;
      res.name = name;
      res.shape = "x[" + std::to_string(BS) + ",7168] W" + std::to_string(W);
      res.dtype = a.quant || a.comm_quant ? "bf16+i8" : "bf16";
      res.threads = ot::num_threads();
      res.ms = median(tf);
      res.ref_ms = median(tr);
      res.gbps = res.ms > 0 ? double(all_bytes) / res.ms / 1e6 : 0;
      res.kernel = std::string(dispatcher_name(o.dispatcher)) + (o.dedup_combine ? "+dedup" : "+per_slot") + (a.no_window ? "" : "+window");
      res.extra["bytes_sent"] = all_bytes;
      res.extra["baseline_bytes_sent"] = all_base;
      res.extra["baseline_ms"] = res.ref_ms;
      res.extra["dedup_bound_bytes"] = bound;
      res.extra["ranks"] = W;
      res.extra["max_rel_diff_vs_baseline"] = rel;
      report(opt, res);
      if (!opt.json)
        std::printf("  bytes_sent %.2f MB (rows, row headers and per-peer records; dedup bound %.2f MB payload), baseline %.2f MB; "
                    "time %.1f%% of baseline; %d threads/rank, %d ranks on this node; max rel diff %.2e\n",
                    double(all_bytes) / 1e6, double(bound) / 1e6, double(all_base) / 1e6, res.ref_ms > 0 ? 100 * res.ms / res.ref_ms : 0.0,
                    ot::num_threads(), comm.node_size(), rel);
    }
  }
  MPI_Finalize();
  return status;
}

RegisterBench reg_ep("ep", "Expert-parallel dispatch + combine under mpirun (bytes sent, time vs a per-(token,expert) baseline)",
                     [](Options& sub, const BenchOptions& common) {
                       auto args = std::make_shared<EpArgs>();
                       sub.flag("--quant", args->quant, "Dynamic int8 dispatch (per-row scale)");
                       sub.flag("--all-gather", args->all_gather, "All-gather dispatcher instead of all-to-all");
                       sub.flag("--per-slot", args->per_slot, "Combine sends one row per (token, expert) back");
                       sub.flag("--comm-quant", args->comm_quant, "Combine rows as int8 with a per-row scale (comm_quant_mode 2)");
                       sub.flag("--no-window", args->no_window, "MPI messages only between the ranks of a node (no shared-memory window)");
                       return [&common, args] { return run_bench(common, *args); };
                     });

}  // namespace bench_ep_local
}  // namespace ot::cli
