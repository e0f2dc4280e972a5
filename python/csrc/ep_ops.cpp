// Expert-parallel ops (include/ot/ep.h) with torch_npu's npu_moe_distribute_{dispatch,combine}_v2
// argument lists; group_ep is an EpComm object (torch_npu: an HCCL group name). MPI is initialised
// by ep_init (unless the caller, e.g. mpi4py, already did) and finalised by ep_finalize at exit.
#include "bridge.h"
#include "holders.h"
#include "ops.h"

namespace ot::py {
namespace {

bool g_we_initialised = false;

ep::Dispatcher dispatcher_of(c10::string_view comm_alg, const char* op) {
  if (comm_alg.empty() || comm_alg == "all_to_all" || comm_alg == "alltoall") return ep::Dispatcher::all_to_all;
  if (comm_alg == "all_gather" || comm_alg == "allgather") return ep::Dispatcher::all_gather;
  throw ot::Error(op, "comm_alg", "\"\" or \"all_to_all\" (MPI_Alltoallv), or \"all_gather\"", std::string(comm_alg));
}

void check_group(const char* op, const c10::intrusive_ptr<EpCommHolder>& g, int64_t world, int64_t rank) {
  OT_CHECK(g.defined(), op, "group_ep", "an EpComm", "None");
  OT_CHECK(world == g->ep_world_size(), op, "ep_world_size", detail::cat("the communicator's size ", g->ep_world_size()), world);
  OT_CHECK(rank == g->ep_rank_id(), op, "ep_rank_id", detail::cat("the communicator's rank ", g->ep_rank_id()), rank);
}

ep::DispatchOptions dispatch_options(const char* op, int64_t moe_expert_num, int64_t world, int64_t rank, int64_t quant_mode,
                                     int64_t expert_token_nums_type, c10::string_view comm_alg) {
  OT_CHECK(quant_mode == 0 || quant_mode == 2, op, "quant_mode", "0 (none) or 2 (dynamic per-row int8)", quant_mode);
  ep::DispatchOptions o;
  o.moe_expert_num = moe_expert_num;
  o.ep_world_size = int(world);
  o.ep_rank_id = int(rank);
  o.dispatcher = dispatcher_of(comm_alg, op);
  o.quant_int8 = quant_mode == 2;
  o.expert_token_nums_type = int(expert_token_nums_type);
  return o;
}

// torch bool masks are read as the library's u8 (same bytes, no copy).
Tensor mask_u8(const OptTensor& m) {
  if (!m || !m->defined()) return Tensor();
  return m->scalar_type() == c10::ScalarType::Bool ? m->view(c10::ScalarType::Byte) : *m;
}

}  // namespace

EpCommHolder::EpCommHolder(int64_t num_experts, int64_t comm_handle) {
  guard([&] {
    MPI_Comm c = comm_handle ? reinterpret_cast<MPI_Comm>(static_cast<intptr_t>(comm_handle)) : MPI_COMM_WORLD;
    comm = std::make_unique<ep::Comm>(c, num_experts);
    return 0;
  });
}

void EpCommHolder::rebalance(const std::vector<int64_t>& load, int64_t extra_per_rank) {
  guard([&] {
    comm->set_placement(ep::Placement::rebalanced(comm->placement().num_experts(), comm->ep_world_size(), load, int(extra_per_rank)));
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
                                      const OptTensor& x_active_mask, const OptTensor& expert_scales, int64_t quant_mode,
                                      int64_t expert_token_nums_type, c10::string_view comm_alg) {
  const char* op = "moe_distribute_dispatch";
  check_group(op, group_ep, ep_world_size, ep_rank_id);
  OT_CHECK(!scales.has_value(), op, "scales", "None (smooth-quant scales are not supported)", "a tensor");
  auto o = dispatch_options(op, moe_expert_num, ep_world_size, ep_rank_id, quant_mode, expert_token_nums_type, comm_alg);
  Tensor mask = mask_u8(x_active_mask);
  o.x_active_mask = view(OptTensor(mask), op, "x_active_mask");
  auto r = ep::moe_distribute_dispatch(*group_ep->comm, view(x, op, "x"), view(expert_ids, op, "expert_ids"),
                                       view(expert_scales, op, "expert_scales"), o);
  group_ep->bytes_sent = r.bytes_sent;
  Tensor ex = wrap(r.expand_x);
  if (o.quant_int8) ex = ex.view(c10::ScalarType::Char);
  Tensor assist = wrap(r.assist_info_for_combine);
  Tensor counts = wrap(r.expert_token_nums), recv = wrap(r.ep_recv_counts);
  OptTensor dyn = wrap_opt(r.dynamic_scales);
  if (group_ep->pending.size() >= 64) group_ep->pending.erase(group_ep->pending.begin());  // abandoned dispatches
  group_ep->pending[assist.data_ptr()] = {std::move(r), mask};
  return {ex, dyn, assist, counts, recv, empty({0}, c10::ScalarType::Int), c10::nullopt};
}

Tensor moe_distribute_combine(const Tensor& expand_x, const Tensor& expert_ids, const Tensor& assist_info_for_combine,
                              const Tensor& ep_send_counts, const Tensor& expert_scales,
                              const c10::intrusive_ptr<EpCommHolder>& group_ep, int64_t ep_world_size, int64_t ep_rank_id,
                              int64_t moe_expert_num, const OptTensor& shared_expert_x) {
  const char* op = "moe_distribute_combine";
  check_group(op, group_ep, ep_world_size, ep_rank_id);
  auto it = group_ep->pending.find(assist_info_for_combine.data_ptr());
  OT_CHECK(it != group_ep->pending.end(), op, "assist_info_for_combine",
           "the assist_info_for_combine of a moe_distribute_dispatch on this group_ep not combined yet", "an unknown tensor");
  const auto& d = it->second.result;
  OT_CHECK(moe_expert_num == group_ep->comm->placement().num_experts(), op, "moe_expert_num",
           detail::cat("the dispatch's ", group_ep->comm->placement().num_experts()), moe_expert_num);
  // expert_ids and expert_scales are taken for torch_npu's argument list: the dispatch kept its own copies.
  OT_CHECK(expert_ids.dim() == 2 && expert_scales.dim() == 2, op, "expert_ids", "[BS, K] (and expert_scales [BS, K])",
           expert_ids.dim(), " dims");
  OT_CHECK(ep_send_counts.numel() == d.ep_recv_counts.view().numel(), op, "ep_send_counts", "the dispatch's ep_recv_counts",
           ep_send_counts.numel(), " values");
  Tensor out = wrap(ep::moe_distribute_combine(*group_ep->comm, view(expand_x, op, "expand_x"), d,
                                               view(shared_expert_x, op, "shared_expert_x")));
  group_ep->pending.erase(it);
  return out;
}

Tensor ep_moe_ffn(const Tensor& x, const Tensor& expert_ids, const OptTensor& expert_scales,
                  const c10::intrusive_ptr<EpCommHolder>& group_ep, const c10::intrusive_ptr<MoeExpertsHolder>& experts,
                  int64_t moe_expert_num, c10::string_view comm_alg, int64_t chunks, int64_t quant_mode,
                  const OptTensor& shared_expert_x, const OptTensor& x_active_mask) {
  const char* op = "ep_moe_ffn";
  OT_CHECK(group_ep.defined(), op, "group_ep", "an EpComm", "None");
  OT_CHECK(experts.defined(), op, "experts", "a MoeExperts holding this rank's local experts", "None");
  OT_CHECK(experts->num_experts() == group_ep->num_local_experts(), op, "experts",
           detail::cat("this rank's ", group_ep->num_local_experts(), " local experts"), experts->num_experts());
  ep::FfnOptions o;
  o.dispatch = dispatch_options(op, moe_expert_num, group_ep->ep_world_size(), group_ep->ep_rank_id(), quant_mode, 1, comm_alg);
  o.chunks = int(chunks);
  Tensor mask = mask_u8(x_active_mask);
  o.dispatch.x_active_mask = view(OptTensor(mask), op, "x_active_mask");
  return wrap(ep::ep_moe_ffn(*group_ep->comm, view(x, op, "x"), view(expert_ids, op, "expert_ids"),
                             view(expert_scales, op, "expert_scales"), ep::moe_experts(experts->experts), o,
                             view(shared_expert_x, op, "shared_expert_x")));
}

}  // namespace ot::py
