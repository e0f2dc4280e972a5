// What the three routers share: one validated description of a routing call (RouterSpec) that the
// fast path executes (the reference, src/ref/moe_router_ref.h, takes the caller's arguments).
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
  // Contiguous [R, E]. Each row must be finite and allow >= k experts: before the reference the
  // entry point runs check_rows; the fast executor checks each row as it loads it (no second pass over x and the mask)
  // and, when one fails, the entry point runs check_rows, which throws naming the row or index
  // (only the call's own fresh outputs were written by then).
  TensorView x;
};

RouterSpec plan_softmax(const char* op, const TensorView& x, int64_t k, const TensorView& finished, const TensorView& allowed);
RouterSpec plan_gating(const TensorView& x, const GatingTopKOptions& opt);
// Throws on the first row of x that is not finite or allows fewer than k experts.
void check_rows(const char* op, const RouterSpec& s);
// Allocates the outputs of a planned call ([.., k] for y / ids / row_idx, [.., E] for scores).
GatingResult alloc_outputs(const RouterSpec& s, const TensorView& x);

// The fast executor (parallel, fp32; false when some row fails check_rows).
bool route_fast(const RouterSpec& s, GatingResult& r);

// ---- what the fast executors share.
// Group-limited selection is on (some groups are masked out).
inline bool limits_groups(const RouterSpec& s) { return s.select == Select::gating && s.groups > 1 && s.k_group < s.groups; }
// Selection may run on the raw logits: softmax and sigmoid are strictly increasing, so without a bias
// and without the top-2-sum group score the order of x is the order of the scores (and exactly the
// fp64 reference's order, with no fp32 rounding of exp in between).
inline bool select_on_logits(const RouterSpec& s) {
  return s.select == Select::topk_softmax || (s.bias.empty() && !(limits_groups(s) && s.group_mode == 1));
}
constexpr int kRouterBlock = 8;  // rows of the AVX2 8-tokens-in-lanes kernels' block
constexpr int kT16Rows = 16;     // rows of route_rows_t16's block (lanes = tokens)
// Per-thread row buffers of the fast executors (rows padded to a multiple of 16 floats, `stride`
// apart: sc and key hold kRouterBlock rows, xr max(kRouterBlock, kT16Rows); the scalar row uses
// the first).
struct RouterScratch {
  explicit RouterScratch(const RouterSpec& s);
  // This thread's buffers for s (kept between calls: no allocation per task).
  static RouterScratch& for_thread(const RouterSpec& s);
  ~RouterScratch();
  RouterScratch(const RouterScratch&) = delete;
  RouterScratch& operator=(const RouterScratch&) = delete;
  float *xr, *sc, *key, *gs, *kv, *vals;
  float* key16;  // [kT16Rows, stride]: the selection keys (or exps) of route_rows_t16's block
  int64_t stride;
  int32_t* ki;
  float* cand;       // [E + 80]: candidates of the AVX2 row top-k (8-lane stores run past)
  int32_t* cand_id;  // [E + 80]: their expert ids, likewise
  void* mem;
  int64_t key_E, key_k, key_groups;  // the shape these buffers were made for
};
// One row, scalar: the fallback of the vector kernels and the path of machines without AVX2.
// False (nothing written) when the row fails check_rows.
bool route_row_scalar(const RouterSpec& s, GatingResult& r, int64_t row, RouterScratch& b);
// Masks (-inf) every expert of key[0, E) outside the k_group best groups (group score: max, or sum
// of the top 2; ties to the lower group); gscore: [groups] scratch. The scalar row's, also the AVX2 kernel's.
void limit_groups(const RouterSpec& s, float* key, float* gscore);
// Its second half, given the group scores gscore[groups] (overwritten): -inf outside the k_group best.
void keep_groups(const RouterSpec& s, float* key, float* gscore);
// Writes ids (E for finished rows), y (cast to x's dtype) and the v1 row_idx of one row.
void write_row(const RouterSpec& s, GatingResult& r, int64_t row, const int32_t* ids, const float* vals);
// The vector kernels, listed in kRouterKernels (router.cpp). Each routes rows [r0, r1) (k <= 16) and
// sends rows it cannot decide exactly to route_row_scalar; false when some row fails check_rows.
// AVX2 rows (router__avx2.cpp): any call.
bool route_rows_avx2(const RouterSpec& s, GatingResult& r, int64_t r0, int64_t r1, RouterScratch& b);
// The calls route_rows_t8 (router_t8__avx2.cpp: 8 tokens in lanes, AVX2) handles: softmax routers
// selecting on the logits (no bias, no group limit, no scores output) and gating_top_k with sigmoid
// scores (any bias, groups of whole vectors, at most 16, the scores output); no mask, E one of
// router_lane_counts.h, k <= 8, T >= 4. Rows it does not decide go to route_rows_avx2.
bool t8_applies(const RouterSpec& s);
bool route_rows_t8(const RouterSpec& s, GatingResult& r, int64_t r0, int64_t r1, RouterScratch& b);
// The calls route_rows_t16 (router_t16__avx512.cpp: 16 tokens in lanes) handles: every router with
// E a multiple of 16 up to 256, k <= 16, no mask, groups of whole vectors (at most 16), on cores
// with AVX512_VBMI / VBMI2.
bool t16_applies(const RouterSpec& s);
bool route_rows_t16(const RouterSpec& s, GatingResult& r, int64_t r0, int64_t r1, RouterScratch& b);

}  // namespace ot::moe::impl
