// Objects that live across calls, exposed as TorchScript custom classes
// (torch.classes.ops_transformer.PackedWeight / MoeExperts): weights packed once, reused by every call.
#pragma once
#include <ATen/core/ivalue.h>

#include <string>

#include "ot/gemm.h"
#ifdef OT_HAVE_MOE
#include "ot/moe.h"
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
  MoeExpertsHolder(const at::Tensor& gate, const c10::optional<at::Tensor>& up, const at::Tensor& down, const std::string& layout);
  // Replace expert e (e < E) or append one (e == E); tensors without the leading E dim.
  void set_expert(int64_t e, const at::Tensor& gate, const c10::optional<at::Tensor>& up, const at::Tensor& down,
                  const std::string& layout);
  void remove_expert(int64_t e);
  int64_t num_experts() const { return experts.num_experts(); }
  int64_t hidden() const { return experts.hidden(); }
  int64_t intermediate() const { return experts.intermediate(); }
  int64_t packed_bytes() const;
  ot::moe::MoeExperts experts;
};
#endif

}  // namespace ot::py
