// The fused MoE layer forward (moe_ffn) on a prepacked expert store, and its separately callable
// stages so expert parallelism can run  routing -> local grouped FFN -> combine  itself:
//   logits = x @ router^T                      (gemm on a PackedB of the [E, H] router weight)
//   gating = moe_gating_top_k_softmax[_v2] / moe_gating_top_k (router.h)
//   plan   = moe_routing_plan(ids, weights)    (stable sort by expert, capacity, local range)
//   moe_expert_ffn(x, experts, plan.rows(), y) (gate/up GEMM gathering x rows, SwiGLU fused, down
//                                               GEMM whose epilogue scales by the routing weight
//                                               and scatter-adds into token rows)
// Expert FFN: y = (silu(x @ Wg) * (x @ Wu)) @ Wd, Wg/Wu [H, I], Wd [I, H] in EHI layout.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "ot/gemm.h"
#include "ot/moe/router.h"
#include "ot/tensor.h"

namespace ot::moe {

class QuantMoeExperts;

// EHI: per expert x @ W (gate/up [H, I], down [I, H]; stacked [E, H, I] and [E, I, H]).
// torch: nn.Linear weights (gate/up [I, H], down [H, I]; stacked [E, I, H] and [E, H, I]).
enum class WeightLayout { EHI, torch };

// Prepacked experts. Each expert is packed on its own (gate and up fused into one [gate | up]
// PackedB so the SwiGLU runs in the GEMM epilogue), so experts can be replaced, added or removed
// between calls without repacking the others. Copies share the packed weights.
class MoeExperts {
 public:
  MoeExperts() = default;
  // H and I fixed up front (every expert is checked against them); a default store takes H, I and
  // the dtype from its first expert, and again from the next one whenever it is empty (E = 0).
  // Throws ot::Error naming hidden / intermediate unless both are >= 1.
  MoeExperts(int64_t hidden, int64_t intermediate);
  // gate/up [E, H, I] + down [E, I, H] (EHI) or gate/up [E, I, H] + down [E, H, I] (torch).
  static MoeExperts from_stacked(const TensorView& gate, const TensorView& up, const TensorView& down, WeightLayout layout);
  // Fused gate_up [E, H, 2I] (EHI) or [E, 2I, H] (torch / vLLM w13): first half gate, second up.
  static MoeExperts from_fused(const TensorView& gate_up, const TensorView& down, WeightLayout layout);
  // Replace expert e (e < E) or append one (e == E). Per-expert tensors drop the leading E dim.
  // A failing set / set_fused / remove throws ot::Error and leaves the store as it was.
  void set(int64_t e, const TensorView& gate, const TensorView& up, const TensorView& down, WeightLayout layout);
  void set_fused(int64_t e, const TensorView& gate_up, const TensorView& down, WeightLayout layout);
  void remove(int64_t e);  // experts after e move down by one id

  int64_t num_experts() const { return int64_t(experts_.size()); }
  int64_t hidden() const { return hidden_; }
  int64_t intermediate() const { return inter_; }
  DType dtype() const { return dtype_; }
  const gemm::PackedB& gate_up(int64_t e) const { return *experts_[size_t(e)].gate_up; }  // K = H, N = 2I
  const gemm::PackedB& down(int64_t e) const { return *experts_[size_t(e)].down; }        // K = I, N = H
  size_t expert_bytes(int64_t e) const;  // packed bytes of one expert (decode bandwidth accounting)

 private:
  struct Expert { std::shared_ptr<const gemm::PackedB> gate_up, down; };
  struct Shape { int64_t h, i; DType dt; };
  Shape shape_for(int64_t e, int64_t h, int64_t i, DType dt) const;
  void put(int64_t e, Expert ex, const Shape& s);
  int64_t hidden_ = 0, inter_ = 0;
  bool fixed_shape_ = false;
  DType dtype_ = DType::bf16;
  std::vector<Expert> experts_;
};

// Rows of one grouped FFN call, already in expert order: sorted rows [offsets[e], offsets[e+1])
// go to expert first_expert + e. Sorted row i reads x row gather[i], its down output is multiplied
// by scale[i] and added to out row scatter[i] (null pointers: identity / 1 / identity).
struct ExpertRows {
  std::vector<int64_t> offsets;  // [E_local + 1], offsets[0] = 0
  int64_t first_expert = 0;
  const int32_t* gather = nullptr;
  const float* scale = nullptr;
  const int32_t* scatter = nullptr;
  int64_t rows() const { return offsets.empty() ? 0 : offsets.back(); }
};
// out [*, H] (f32/bf16/f16): with accumulate, out[scatter[i]] += scale[i] * ffn(x[gather[i]]) for all
// i; without, out[scatter[i]] = ... (rows must then be distinct). x [*, H] in the experts' dtype, or
// int8 with x_scale [x rows] fp32 (the dispatch's dynamic quantisation: row r of x is
// x[r, :] * x_scale[r]); the int8 rows go into the GEMM as they are (exact i8 -> bf16 in the A pack,
// the scale applied to the gate and up accumulators before the SwiGLU), never dequantised in memory.
void moe_expert_ffn(const TensorView& x, const MoeExperts& experts, const ExpertRows& rows, const TensorView& out, bool accumulate,
                    const TensorView& x_scale = {});

// The plan of a routed batch: (token, k) pairs sorted stably by expert, restricted to experts in
// [expert_begin, expert_end) (EP: this rank's experts), at most expert_capacity per expert (later
// tokens dropped, counted). Owns the arrays an ExpertRows points to.
struct RoutingPlan {
  int64_t first_expert = 0;
  std::vector<int64_t> offsets;   // [E_local + 1]
  std::vector<int32_t> token;     // [A] source token of each sorted row
  std::vector<int32_t> slot;      // [A] flat index t*K+k
  std::vector<float> weight;      // [A] routing weight
  std::vector<int64_t> counts;    // [E_local] pairs per expert before capacity
  int64_t dropped = 0;
  ExpertRows rows() const;        // gather = scatter = token, scale = weight
};
// topk_ids [T, K] int32 in [0, E] (E = finished, skipped); topk_weights [T, K] float.
RoutingPlan moe_routing_plan(const TensorView& topk_ids, const TensorView& topk_weights, int64_t num_experts,
                             int64_t expert_capacity = -1, int64_t expert_begin = 0, int64_t expert_end = -1);

enum class RouterKind { softmax_topk /* v1 */, softmax_topk_v2, gating_top_k };
struct MoeFfnOptions {
  int64_t k = 2;
  RouterKind router = RouterKind::softmax_topk;
  int renorm = 0;                // softmax_topk_v2 only
  bool norm_topk_prob = false;   // divide the k weights by their sum (Qwen3 norm_topk_prob)
  GatingTopKOptions gating;      // gating_top_k only (its k is replaced by k above)
  TensorView allowed;            // [T, E] u8 per-token allowed experts
  int64_t expert_capacity = -1;  // tokens per expert, -1 dropless
  double capacity_factor = 0;    // > 0: expert_capacity = moe_capacity(T, k, E, factor)
  const MoeExperts* shared = nullptr;  // shared expert (its expert 0), weight 1
  // The quantised moe_ffn only (ot/moe/quant_experts.h), instead of shared: a quantised shared
  // expert (its expert 0), weight 1, run like the routed store (weight-only or W8A8).
  const QuantMoeExperts* shared_quant = nullptr;
  TensorView residual;           // [T, H], added to the output
};
struct MoeFfnResult {
  Tensor y;              // [T, H] x's dtype
  Tensor router_logits;  // [T, E] fp32 (for z-loss and backward)
  Tensor topk_ids;       // [T, K] int32
  Tensor topk_weights;   // [T, K] fp32 (after renorm / scaling: what the combine used)
  Tensor expert_counts;  // [E] int64 pairs routed to each expert (before capacity): watch load here
  int64_t dropped = 0;   // pairs dropped by capacity
};
// x [T, H] bf16/fp16/fp32; router: prepack(router_weight [E, H], BLayout::NK).
MoeFfnResult moe_ffn(const TensorView& x, const gemm::PackedB& router, const MoeExperts& experts, const MoeFfnOptions& opt = {});

namespace ref {
// Plain loops over tokens and their experts on the unpacked weights (EHI, stacked [E, H, I] etc).
MoeFfnResult moe_ffn(const TensorView& x, const TensorView& router_weight /* [E, H] */, const TensorView& gate,
                     const TensorView& up, const TensorView& down, const MoeFfnOptions& opt = {},
                     const TensorView& shared_gate = {}, const TensorView& shared_up = {}, const TensorView& shared_down = {});
}  // namespace ref

}  // namespace ot::moe
