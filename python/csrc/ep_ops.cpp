// Expert-parallel ops (include/ot/ep.h) with torch_npu's npu_moe_distribute_{dispatch,combine}_v2
// argument lists; group_ep is an EpComm object (torch_npu: an HCCL group name). MPI is initialised
// by ep_init (unless the caller, e.g. mpi4py, already did) and finalised by ep_finalize at exit.
#include <utility>

#include "bridge.h"
#include "holders.h"
#include "ops.h"

namespace ot::py {
namespace {

bool g_we_initialised = false;

// Binding-level checks, decided like the library's own (ot/ep.h): every rank records its first
// failing check, one allreduce finds the lowest rank with one, and every rank throws that rank's
// error (naming the same argument), so a bad argument on one rank never leaves its peers inside a
// collective. One MPI_Allreduce per call when all is well.
class AgreedChecks {
 public:
  explicit AgreedChecks(const char* op) : op_(op) {}
  template <class... G> void operator()(bool ok, const char* arg, const std::string& expected, const G&... got) {
    if (!ok && arg_.empty()) arg_ = arg, expected_ = expected, got_ = detail::cat(got...);
  }
  // The bridge's view, its error recorded instead of thrown.
  TensorView view(const OptTensor& t, const char* arg) {
    try {
      return py::view(t, op_, arg);
    } catch (const ot::Error& e) {
      (*this)(false, arg, e.expected(), e.got());
      return {};
    }
  }
  bool ok() const { return arg_.empty(); }
  void agree(const ep::Comm& comm) {
    const int world = comm.ep_world_size();
    int mine = ok() ? world : comm.ep_rank_id(), first = world;
    MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm.mpi());
    if (first == world) return;
    for (std::string* s : {&arg_, &expected_, &got_}) {  // the failing rank's error, on every rank
      int n = int(s->size());
      MPI_Bcast(&n, 1, MPI_INT, first, comm.mpi());
      s->resize(size_t(n));
      MPI_Bcast(s->data(), n, MPI_CHAR, first, comm.mpi());
    }
    throw ot::Error(op_, arg_, expected_, detail::cat(got_, got_.empty() ? "" : " ", "(on rank ", first, ")"));
  }

 private:
  const char* op_;
  std::string arg_, expected_, got_;
};

// Runs a library call; errors about a library name whose Python argument is named otherwise (the
// torch_npu names) are re-raised under the Python name.
template <class F> auto torch_names(F&& f) -> decltype(f()) {
  static const std::pair<const char*, const char*> renamed[] = {{"smooth_scales", "scales"}, {"expert_out", "expand_x"}};
  try {
    return f();
  } catch (const ot::Error& e) {
    for (auto [lib, torch] : renamed)
      if (e.arg() == lib) throw ot::Error(e.op(), torch, e.expected(), e.got());
    throw;
  }
}

bool dispatcher_of(c10::string_view comm_alg, ep::Dispatcher& d) {
  if (comm_alg.empty() || comm_alg == "all_to_all" || comm_alg == "alltoall") return d = ep::Dispatcher::all_to_all, true;
  if (comm_alg == "all_gather" || comm_alg == "allgather") return d = ep::Dispatcher::all_gather, true;
  return false;
}

void check_group(AgreedChecks& check, const EpCommHolder& g, int64_t world, int64_t rank) {
  check(world == g.ep_world_size(), "ep_world_size", detail::cat("the communicator's size ", g.ep_world_size()), world);
  check(rank == g.ep_rank_id(), "ep_rank_id", detail::cat("the communicator's rank ", g.ep_rank_id()), rank);
}

// The group itself cannot be agreed on (it holds the communicator): checked on each rank.
EpCommHolder& group_of(const char* op, const c10::intrusive_ptr<EpCommHolder>& g) {
  OT_CHECK(g.defined(), op, "group_ep", "an EpComm", "None");
  return *g;
}

// The attributes dispatch and ep_moe_ffn share (schema arguments of the same names).
struct EpAttrs {
  const OptTensor& scales;
  int64_t shared_expert_num, shared_expert_rank_num, quant_mode, expert_token_nums_type;
  c10::string_view comm_alg;
  int64_t zero_expert_num, copy_expert_num, const_expert_num;
  bool dedup_combine;
  int64_t comm_quant_mode;
};

// torch_npu's dispatch attributes (spec 9.1) and the library's own: dedup_combine, and
// comm_quant_mode (torch_npu gives it to combine only; here dispatch fixes the wire format of the
// combine, so combine checks its value against the dispatch's).
ep::DispatchOptions dispatch_options(AgreedChecks& check, int64_t moe_expert_num, const EpAttrs& a) {
  ep::DispatchOptions o;
  check(a.quant_mode == 0 || a.quant_mode == 2, "quant_mode", "0 (none) or 2 (dynamic per-row int8)", a.quant_mode);
  check(dispatcher_of(a.comm_alg, o.dispatcher), "comm_alg", "\"\" or \"all_to_all\" (MPI_Alltoallv), or \"all_gather\"",
        std::string(a.comm_alg));
  check(a.shared_expert_num >= 0, "shared_expert_num", ">= 0 (rows of scales before the routed experts')", a.shared_expert_num);
  o.moe_expert_num = moe_expert_num;
  o.quant_int8 = a.quant_mode == 2;
  o.expert_token_nums_type = int(a.expert_token_nums_type);
  o.shared_expert_num = int(a.shared_expert_num);
  o.shared_expert_rank_num = int(a.shared_expert_rank_num);
  o.zero_expert_num = a.zero_expert_num, o.copy_expert_num = a.copy_expert_num, o.const_expert_num = a.const_expert_num;
  o.dedup_combine = a.dedup_combine;
  o.comm_quant_mode = int(a.comm_quant_mode);
  o.smooth_scales = check.view(a.scales, "scales");
  return o;
}

// torch bool masks are read as the library's u8 (same bytes, no copy).
Tensor mask_u8(const OptTensor& m) {
  if (!m || !m->defined()) return Tensor();
  return m->scalar_type() == c10::ScalarType::Bool ? m->view(c10::ScalarType::Byte) : *m;
}

}  // namespace

EpCommHolder::EpCommHolder(int64_t num_experts, int64_t comm_handle, int64_t threads, bool node_window, int64_t shared_expert_rank_num)
    : num_experts(num_experts) {
  guard([&] {
    MPI_Comm c = comm_handle ? reinterpret_cast<MPI_Comm>(static_cast<intptr_t>(comm_handle)) : MPI_COMM_WORLD;
    ep::CommOptions o;
    o.threads = int(threads);
    o.node_window = node_window;
    o.shared_expert_ranks = int(shared_expert_rank_num);
    comm = std::make_unique<ep::Comm>(c, num_experts, o);
    return 0;
  });
}

void EpCommHolder::rebalance(const std::vector<int64_t>& load, int64_t extra_per_rank) {
  guard([&] {
    comm->set_placement(ep::Placement::rebalanced(num_experts, comm->ep_world_size(), load, int(extra_per_rank)));
    return 0;
  });
}

void EpCommHolder::set_shared_expert_ranks(int64_t shared_expert_rank_num) {
  guard([&] {
    const int W = comm->ep_world_size(), S = int(shared_expert_rank_num);
    comm->set_placement(S == 0 ? ep::Placement::contiguous(num_experts, W) : ep::Placement::shared_ranks(num_experts, W, S));
    return 0;
  });
}

std::tuple<int64_t, int64_t> ep_init() {
  int init = 0;
  MPI_Initialized(&init);
  if (!init) {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    g_we_initialised = true;
  }
  int w = 1, r = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &w);
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return {w, r};
}

void ep_finalize() {
  int fin = 0;
  MPI_Finalized(&fin);
  if (g_we_initialised && !fin) MPI_Finalize();
}

EpDispatchOut moe_distribute_dispatch(const Tensor& x, const Tensor& expert_ids, const c10::intrusive_ptr<EpCommHolder>& group_ep,
                                      int64_t ep_world_size, int64_t ep_rank_id, int64_t moe_expert_num, const OptTensor& scales,
                                      const OptTensor& x_active_mask, const OptTensor& expert_scales, int64_t shared_expert_num,
                                      int64_t shared_expert_rank_num, int64_t quant_mode, int64_t expert_token_nums_type,
                                      c10::string_view comm_alg, int64_t zero_expert_num, int64_t copy_expert_num,
                                      int64_t const_expert_num, bool dedup_combine, int64_t comm_quant_mode) {
  const char* op = "moe_distribute_dispatch";
  EpCommHolder& g = group_of(op, group_ep);
  AgreedChecks check(op);
  const EpAttrs a{scales, shared_expert_num, shared_expert_rank_num, quant_mode, expert_token_nums_type, comm_alg,
                  zero_expert_num, copy_expert_num, const_expert_num, dedup_combine, comm_quant_mode};
  auto o = dispatch_options(check, moe_expert_num, a);
  o.ep_world_size = int(ep_world_size);  // checked by the library, on every rank alike
  o.ep_rank_id = int(ep_rank_id);
  Tensor mask = mask_u8(x_active_mask);
  o.x_active_mask = check.view(OptTensor(mask), "x_active_mask");
  const TensorView xv = check.view(x, "x"), idv = check.view(expert_ids, "expert_ids"), wv = check.view(expert_scales, "expert_scales");
  check.agree(*g.comm);
  auto r = torch_names([&] { return ep::moe_distribute_dispatch(*g.comm, xv, idv, wv, o); });
  g.bytes_sent = r.bytes_sent;
  Tensor ex = wrap(r.expand_x);
  if (o.quant_int8) ex = ex.view(c10::ScalarType::Char);
  Tensor assist = wrap(r.assist_info_for_combine);
  Tensor counts = wrap(r.expert_token_nums), recv = wrap(r.ep_recv_counts);
  OptTensor dyn = wrap_opt(r.dynamic_scales);
  if (g.pending.size() >= 64) g.pending.erase(g.pending.begin());  // abandoned dispatches
  g.pending[assist.data_ptr()] = {std::move(r), mask, o};
  return {ex, dyn, assist, counts, recv, empty({0}, c10::ScalarType::Int), c10::nullopt};
}

Tensor moe_distribute_combine(const Tensor& expand_x, const Tensor& expert_ids, const Tensor& assist_info_for_combine,
                              const Tensor& ep_send_counts, const Tensor& expert_scales,
                              const c10::intrusive_ptr<EpCommHolder>& group_ep, int64_t ep_world_size, int64_t ep_rank_id,
                              int64_t moe_expert_num, const OptTensor& shared_expert_x, const OptTensor& ori_x,
                              const OptTensor& const_expert_alpha_1, const OptTensor& const_expert_alpha_2,
                              const OptTensor& const_expert_v, int64_t shared_expert_num, int64_t shared_expert_rank_num,
                              int64_t comm_quant_mode, int64_t zero_expert_num, int64_t copy_expert_num, int64_t const_expert_num) {
  const char* op = "moe_distribute_combine";
  EpCommHolder& g = group_of(op, group_ep);
  AgreedChecks check(op);
  check_group(check, g, ep_world_size, ep_rank_id);
  auto it = g.pending.find(assist_info_for_combine.data_ptr());
  check(it != g.pending.end(), "assist_info_for_combine",
        "the assist_info_for_combine of a moe_distribute_dispatch on this group_ep not combined yet", "an unknown tensor");
  ep::CombineInputs in;
  if (it != g.pending.end()) {
    const auto& d = it->second.result;
    const auto& o = it->second.opt;
    check(moe_expert_num == o.moe_expert_num, "moe_expert_num", detail::cat("the dispatch's ", o.moe_expert_num), moe_expert_num);
    // Attributes torch_npu passes to both calls: they must be the dispatch's (spec 9.3).
    const std::pair<const char*, std::pair<int64_t, int64_t>> same[] = {
        {"shared_expert_rank_num", {shared_expert_rank_num, o.shared_expert_rank_num}},
        {"shared_expert_num", {shared_expert_num, o.shared_expert_num}},
        {"comm_quant_mode", {comm_quant_mode, o.comm_quant_mode}},
        {"zero_expert_num", {zero_expert_num, o.zero_expert_num}},
        {"copy_expert_num", {copy_expert_num, o.copy_expert_num}},
        {"const_expert_num", {const_expert_num, o.const_expert_num}}};
    for (const auto& [arg, v] : same) check(v.first == v.second, arg, detail::cat("the dispatch's ", v.second), v.first);
    // expert_ids and expert_scales are taken for torch_npu's argument list: the dispatch kept its own copies.
    check(expert_ids.dim() == 2 && expert_scales.dim() == 2, "expert_ids", "[BS, K] (and expert_scales [BS, K])", expert_ids.dim(),
          " dims");
    check(ep_send_counts.numel() == d.ep_recv_counts.view().numel(), "ep_send_counts", "the dispatch's ep_recv_counts",
          ep_send_counts.numel(), " values");
  }
  in.shared_expert_x = check.view(shared_expert_x, "shared_expert_x");
  in.ori_x = check.view(ori_x, "ori_x");
  in.const_expert_alpha_1 = check.view(const_expert_alpha_1, "const_expert_alpha_1");
  in.const_expert_alpha_2 = check.view(const_expert_alpha_2, "const_expert_alpha_2");
  in.const_expert_v = check.view(const_expert_v, "const_expert_v");
  const TensorView yv = check.view(expand_x, "expand_x");
  check.agree(*g.comm);
  Tensor out = wrap(torch_names([&] { return ep::moe_distribute_combine(*g.comm, yv, it->second.result, in); }));
  g.pending.erase(it);
  return out;
}

Tensor ep_moe_ffn(const Tensor& x, const Tensor& expert_ids, const OptTensor& expert_scales,
                  const c10::intrusive_ptr<EpCommHolder>& group_ep, const c10::intrusive_ptr<MoeExpertsHolder>& experts,
                  int64_t moe_expert_num, c10::string_view comm_alg, int64_t chunks, int64_t quant_mode,
                  const OptTensor& shared_expert_x, const OptTensor& x_active_mask, const OptTensor& scales,
                  int64_t shared_expert_num, int64_t shared_expert_rank_num, bool dedup_combine, int64_t comm_quant_mode,
                  int64_t zero_expert_num, int64_t copy_expert_num, int64_t const_expert_num, const OptTensor& const_expert_alpha_1,
                  const OptTensor& const_expert_alpha_2, const OptTensor& const_expert_v) {
  const char* op = "ep_moe_ffn";
  EpCommHolder& g = group_of(op, group_ep);
  AgreedChecks check(op);
  check(experts.defined(), "experts", "a MoeExperts holding this rank's local experts", "None");
  const bool quantised = experts.defined() && experts->quant;
  check(!quantised, "experts", "a float MoeExperts (ep_moe_ffn takes no quantised experts)", quantised ? experts->weights() : std::string("float"));
  if (experts.defined())
    check(experts->num_experts() == g.num_local_experts(), "experts", detail::cat("this rank's ", g.num_local_experts(), " local experts"),
          experts->num_experts());
  const EpAttrs a{scales, shared_expert_num, shared_expert_rank_num, quant_mode, 1, comm_alg,
                  zero_expert_num, copy_expert_num, const_expert_num, dedup_combine, comm_quant_mode};
  ep::FfnOptions o;
  o.dispatch = dispatch_options(check, moe_expert_num, a);
  o.chunks = int(chunks);
  Tensor mask = mask_u8(x_active_mask);
  o.dispatch.x_active_mask = check.view(OptTensor(mask), "x_active_mask");
  o.const_expert_alpha_1 = check.view(const_expert_alpha_1, "const_expert_alpha_1");
  o.const_expert_alpha_2 = check.view(const_expert_alpha_2, "const_expert_alpha_2");
  o.const_expert_v = check.view(const_expert_v, "const_expert_v");
  const TensorView xv = check.view(x, "x"), idv = check.view(expert_ids, "expert_ids"), wv = check.view(expert_scales, "expert_scales");
  const TensorView sv = check.view(shared_expert_x, "shared_expert_x");
  check.agree(*g.comm);
  return wrap(torch_names([&] { return ep::ep_moe_ffn(*g.comm, xv, idv, wv, ep::moe_experts(experts->experts), o, sv); }));
}

}  // namespace ot::py
