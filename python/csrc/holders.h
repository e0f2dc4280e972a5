// Objects that live across calls, exposed as TorchScript custom classes
// (torch.classes.ops_transformer.PackedWeight / MoeExperts): weights packed once, reused by every call.
#pragma once
#include <ATen/core/ivalue.h>

#include <string>

#include "ot/gemm.h"
#ifdef OT_HAVE_MOE
#include "ot/moe.h"
#endif
#ifdef OT_HAVE_MOE_BWD
#include "ot/moe_bwd.h"
#endif
#ifdef OT_HAVE_EP
#include <map>
#include <memory>

#include "ot/ep.h"
#endif

namespace ot::py {

// One matrix packed for the engine: "torch" = nn.Linear weight [N, K], "KN" = [K, N].
struct PackedWeightHolder : torch::CustomClassHolder {
  PackedWeightHolder(const at::Tensor& w, const std::string& layout);
  int64_t K() const { return b.K(); }
  int64_t N() const { return b.N(); }
  ot::gemm::PackedB b;
};

#ifdef OT_HAVE_MOE
// Prepacked experts (ot::moe::MoeExperts). layout "torch": gate/up [E, I, H], down [E, H, I]
// (stacked nn.Linear weights); "EHI": gate/up [E, H, I], down [E, I, H]. With up = None, gate is the
// fused [gate | up] (w13) tensor.
struct MoeExpertsHolder : torch::CustomClassHolder {
  // weights "float": packed in the tensors' dtype; "int8" / "int4": quantised (group_size, symmetric
  // as quantize_weights) into a QuantMoeExperts, which is immutable (set/remove_expert refuse it);
  // "w8a8": int8 codes with the activations quantised per token to int8 (ot/gemm_quant.h).
  MoeExpertsHolder(const at::Tensor& gate, const c10::optional<at::Tensor>& up, const at::Tensor& down, const std::string& layout,
                   const std::string& weights, int64_t group_size, bool symmetric);
  // Replace expert e (e < E) or append one (e == E); tensors without the leading E dim.
  void set_expert(int64_t e, const at::Tensor& gate, const c10::optional<at::Tensor>& up, const at::Tensor& down,
                  const std::string& layout);
  void remove_expert(int64_t e);
  int64_t num_experts() const { return quant ? quant->num_experts() : experts.num_experts(); }
  int64_t hidden() const { return quant ? quant->hidden() : experts.hidden(); }
  int64_t intermediate() const { return quant ? quant->intermediate() : experts.intermediate(); }
  int64_t packed_bytes() const;
  std::string weights() const;  // "float", "int8", "int4" or "w8a8"
  int64_t group_size() const { return quant ? quant->group_size() : 0; }
  ot::moe::MoeExperts experts;
  std::shared_ptr<ot::moe::QuantMoeExperts> quant;  // set: the quantised store (experts unused)
};
#endif

#ifdef OT_HAVE_MOE_BWD
// What moe_ffn_forward_train kept for moe_ffn_backward (torch.classes.ops_transformer.MoeFfnSaved),
// with the forward's options and the tensors they point into (kept alive here).
struct MoeFfnSavedHolder : torch::CustomClassHolder {
  ot::moe::MoeFfnSaved saved;
  ot::moe::MoeFfnOptions opt;
  at::Tensor bias, allowed, residual;
  int64_t rows() const { return saved.T; }
};
#endif

#ifdef OT_HAVE_EP
// An expert-parallel group (torch.classes.ops_transformer.EpComm): ot::ep::Comm over MPI_COMM_WORLD
// or a caller's communicator (an mpi4py handle), plus the dispatches awaiting their combine, found
// by their assist_info_for_combine tensor so combine keeps torch_npu's argument list.
struct EpCommHolder : torch::CustomClassHolder {
  // threads, node_window, shared_expert_rank_num (shared_expert_ranks): ot::ep::CommOptions.
  EpCommHolder(int64_t num_experts, int64_t comm_handle, int64_t threads, bool node_window, int64_t shared_expert_rank_num);
  int64_t ep_world_size() const { return comm->ep_world_size(); }
  int64_t node_size() const { return comm->node_size(); }
  int64_t threads_per_rank() const { return comm->threads_per_rank(); }
  bool node_window() const { return comm->node_window(); }
  int64_t ep_rank_id() const { return comm->ep_rank_id(); }
  int64_t num_local_experts() const { return comm->num_local_experts(); }
  std::vector<int64_t> local_experts() const { return comm->placement().local_experts(comm->ep_rank_id()); }
  // Contiguous shards plus extra copies of the hottest experts (ot::ep::Placement::rebalanced).
  void rebalance(const std::vector<int64_t>& load, int64_t extra_per_rank);
  // Ranks [0, S) hold the shared expert (local expert id num_experts), the routed experts are
  // contiguous over [S, W) (ot::ep::Placement::shared_ranks); 0: contiguous over all ranks.
  void set_shared_expert_ranks(int64_t shared_expert_rank_num);
  int64_t last_bytes_sent() const { return bytes_sent; }
  int64_t num_experts;  // routed experts
  std::unique_ptr<ot::ep::Comm> comm;
  struct Pending {
    ot::ep::DispatchResult result;
    at::Tensor x_active_mask;  // the dispatch's view points into it
    ot::ep::DispatchOptions opt;  // combine's attributes must be the dispatch's
  };
  std::map<const void*, Pending> pending;
  int64_t bytes_sent = 0;
};
#endif

}  // namespace ot::py
