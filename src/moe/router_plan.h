// What the three routers share: one validated description of a routing call (RouterSpec) that the
// fast path and the reference both execute, so validation lives in exactly one place.
#pragma once
#include <vector>

#include "ot/moe/router.h"

namespace ot::moe::impl {

enum class Select { softmax_topk, topk_softmax, gating };

struct RouterSpec {
  Select select = Select::softmax_topk;
  int64_t R = 0, E = 0, k = 0;
  bool sigmoid = false;            // gating norm_type 1
  std::vector<float> bias;         // [E] or empty
  int64_t groups = 1, k_group = 1;
  int group_mode = 0;
  float scale = 1.f, eps = 1e-20f;
  const uint8_t* finished = nullptr;  // [R]
  const uint8_t* allowed = nullptr;   // [R, E]
  bool row_idx = false, scores = false;
  Tensor hold_x, hold_fin, hold_allowed;  // contiguous copies of strided inputs
  TensorView x;                        // contiguous [R, E]
};

RouterSpec plan_softmax(const char* op, const TensorView& x, int64_t k, const TensorView& finished, const TensorView& allowed);
RouterSpec plan_gating(const TensorView& x, const GatingTopKOptions& opt);
// Allocates the outputs of a planned call ([.., k] for y / ids / row_idx, [.., E] for scores).
GatingResult alloc_outputs(const RouterSpec& s, const TensorView& x);
// Fills the k-major row_idx (v1).
void fill_row_idx(const RouterSpec& s, GatingResult& r);

// Executors: fast (parallel, fp32) and reference (plain, fp64).
void route_fast(const RouterSpec& s, GatingResult& r);
void route_ref(const RouterSpec& s, GatingResult& r);

}  // namespace ot::moe::impl
