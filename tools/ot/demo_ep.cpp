// `ot demo --ep` (built only with MPI): the demo's model on every rank, each rank prefilling and
// decoding its own sequences (the GDN mixers are data parallel), with the MoE layers expert
// parallel: every rank packs its shard of each layer's experts and ep_moe_ffn dispatches the routed
// rows to the ranks holding their experts and combines the outputs back. Verification compares each
// MoE layer against one process's moe_ffn on every rank's tokens; the tables are rank 0's; --trace
// writes one file with a process per rank, communication (dispatch, combine, waits) included.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "demo.h"
#include "demo_stats.h"
#include "ot/ep.h"
#include "ot/error.h"
#include "ot/moe.h"
#include "ot/parallel.h"

namespace ot::demo {

namespace demo_ep_local {

// Rows of every rank concatenated in rank order (counts may differ between ranks).
Tensor allgather_rows(MPI_Comm comm, const TensorView& rows, int64_t* first) {
  int W = 1, me = 0;
  MPI_Comm_size(comm, &W);
  MPI_Comm_rank(comm, &me);
  const int64_t row_bytes = rows.size(1) * int64_t(dtype_size(rows.dtype));
  int64_t mine = rows.size(0);
  std::vector<int64_t> n(size_t(W), 0);
  MPI_Allgather(&mine, 1, MPI_INT64_T, n.data(), 1, MPI_INT64_T, comm);
  std::vector<int> cnt(static_cast<size_t>(W)), displ(static_cast<size_t>(W));
  int64_t total = 0;
  for (int r = 0; r < W; ++r) {
    if (r == me) *first = total;
    cnt[size_t(r)] = int(n[size_t(r)] * row_bytes);
    displ[size_t(r)] = int(total * row_bytes);
    total += n[size_t(r)];
  }
  Tensor all = Tensor::empty(rows.dtype, {total, rows.size(1)});
  Tensor own = Tensor::copy_of(rows);  // contiguous
  MPI_Allgatherv(own.view().data, cnt[size_t(me)], MPI_BYTE, all.view().data, cnt.data(), displ.data(), MPI_BYTE, comm);
  return all;
}

// The verification table of all ranks: max error and total calls per operator, printed by rank 0;
// every rank returns the same outcome.
bool agreed_verification(MPI_Comm comm, const Verifier& v, double tol) {
  int me = 0;
  MPI_Comm_rank(comm, &me);
  std::vector<double> err;
  std::vector<int64_t> calls;
  for (const auto& [name, e] : v.ops) err.push_back(e.max_err), calls.push_back(e.calls);
  // Every rank verified the same operators (same config), so the maps line up.
  MPI_Allreduce(MPI_IN_PLACE, err.data(), int(err.size()), MPI_DOUBLE, MPI_MAX, comm);
  MPI_Allreduce(MPI_IN_PLACE, calls.data(), int(calls.size()), MPI_INT64_T, MPI_SUM, comm);
  Verifier all = v;
  size_t i = 0;
  for (auto& [name, e] : all.ops) e.max_err = err[i], e.calls = calls[i], ++i;
  bool ok = true;
  for (const auto& [name, e] : all.ops) ok &= e.max_err <= tol;
  if (me == 0) print_verification(all, tol);
  return ok;
}

// One Chrome trace for all ranks, written by rank 0: process (pid) = rank, named "rank r".
// Timestamps are relative to a barrier every rank passed (t0), so the lanes line up across machines.
void write_trace(MPI_Comm comm, const std::string& path, const std::vector<trace::Event>& events, int64_t t0) {
  int W = 1, me = 0;
  MPI_Comm_size(comm, &W);
  MPI_Comm_rank(comm, &me);
  nlohmann::json list = nlohmann::json::array();
  list.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", me}, {"tid", 0}, {"args", {{"name", "rank " + std::to_string(me)}}}});
  list.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", me}, {"tid", 0}, {"args", {{"sort_index", me}}}});
  for (const auto& e : events)
    list.push_back({{"name", e.name},
                    {"cat", e.category},
                    {"ph", "X"},
                    {"ts", double(e.start_ns - t0) / 1e3},
                    {"dur", double(e.dur_ns) / 1e3},
                    {"pid", me},
                    {"tid", e.tid},
                    {"args", {{"kernel", e.kernel}, {"shapes", e.args}, {"flops", e.flops}, {"bytes", e.bytes}}}});
  std::string mine = list.dump();
  mine = mine.substr(1, mine.size() - 2);  // the elements, without the brackets
  int len = int(mine.size());
  std::vector<int> lens(static_cast<size_t>(W)), displ(static_cast<size_t>(W));
  MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, comm);
  std::string all;
  if (me == 0) {
    int64_t total = 0;
    for (int r = 0; r < W; ++r) displ[size_t(r)] = int(total), total += lens[size_t(r)];
    all.resize(size_t(total));
  }
  MPI_Gatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displ.data(), MPI_CHAR, 0, comm);
  if (me != 0) return;
  std::ofstream f(path);
  f << "{\"traceEvents\":[\n";
  bool first = true;
  for (int r = 0; r < W; ++r) {
    if (lens[size_t(r)] == 0) continue;
    f << (first ? "" : ",\n") << std::string_view(all).substr(size_t(displ[size_t(r)]), size_t(lens[size_t(r)]));
    first = false;
  }
  f << "\n],\"displayTimeUnit\":\"ms\"}\n";
  OT_CHECK(f.good(), "ot demo", "--trace", "a writable file", path);
}

}  // namespace demo_ep_local

int run_demo_ep(const DemoConfig& cfg, const std::string& trace_file) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) MPI_Init(nullptr, nullptr);
  const MPI_Comm world = MPI_COMM_WORLD;
  int W = 1, me = 0;
  MPI_Comm_size(world, &W);
  MPI_Comm_rank(world, &me);
  const int64_t E = cfg.model.moe.experts;
  if (E % W != 0) {
    MPI_Finalize();
    throw Error("ot demo --ep", "model.moe.experts", detail::cat("a multiple of the number of ranks (", W, ")"), detail::cat(E));
  }
  int rc = 1;
  {
    // Threads: run.threads / --threads when given, else the Comm shares this node's cores among
    // the ranks on it (see docs/ep.md).
    ep::CommOptions co;
    co.threads = cfg.run.threads > 0 ? cfg.run.threads : -1;
    ep::Comm comm(world, E, co);
    const std::vector<int64_t>& local = comm.placement().local_experts(me);
    ExpertParallel ep;
    ep.rank = me;
    ep.world = W;
    ep.expert_begin = local.front();
    ep.expert_end = local.back() + 1;
    ep.routed = [&comm, E](const moe::MoeExperts& experts, const TensorView& xn, const TensorView& ids, const TensorView& w,
                           const TensorView& base) {
      ep::FfnOptions o;
      o.dispatch.moe_expert_num = E;
      // Two chunks (one exchanging while the other computes) once a chunk is worth it; every rank
      // runs the same batch shapes, so every rank picks the same count.
      o.chunks = xn.size(0) >= 64 ? 2 : 1;
      return ep::ep_moe_ffn(comm, xn, ids, w, ep::moe_experts(experts), o, base);
    };
    ep.gather = [world](const TensorView& rows, int64_t* first) { return demo_ep_local::allgather_rows(world, rows, first); };

    RunContext ctx;
    ctx.rank = me;
    ctx.world = W;
    ctx.ep = &ep;
    ctx.verify_ok = [world](const Verifier& v, double tol) { return demo_ep_local::agreed_verification(world, v, tol); };
    MPI_Barrier(world);
    const int64_t t0 = trace::now_ns();
    ctx.write_trace = [world, t0](const std::string& path, const std::vector<trace::Event>& ev) { demo_ep_local::write_trace(world, path, ev, t0); };
    if (me == 0)
      std::printf("ot demo --ep: %d ranks, %lld experts per rank; tables show rank 0's calls, tokens/s counts every rank's tokens\n", W,
                  (long long)(E / W));
    rc = run_demo(cfg, trace_file, ctx);
  }
  MPI_Finalize();
  return rc;
}

}  // namespace ot::demo
