// Validation and planning shared by the MoE backward entry points and their references.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "ot/error.h"
#include "ot/moe_bwd.h"
#include "ot/parallel.h"
#include "ot/tensor.h"

namespace ot::moe::bwd {

// One contiguous row block: rows [offset, offset + count) use weight `group`.
struct Span { int64_t group, offset, count; };

// group_list (int32/int64) of type 0 cumsum, 1 count, 2 key-value [G', 2] -> spans (empty skipped).
// Checks: monotone cumsum, non-negative counts, group ids in [0, G), total == rows.
std::vector<Span> parse_group_list(const char* op, const TensorView& group_list, int type, int64_t groups, int64_t rows);

struct GmmBwdPlan {
  int64_t M = 0, K = 0, N = 0, n_out = 0, G = 0;
  std::vector<Span> spans;
};
GmmBwdPlan plan_grouped_matmul_backward(const char* op, const TensorView& dy, const TensorView& x, const TensorView& weight,
                                        const TensorView& group_list, const GroupedMatmulBackwardOptions& opt);
void check_act_backward(const char* op, gemm::Act act, const TensorView& z, const TensorView& dy, const TensorView& dz);

inline void check_float(const char* op, const char* arg, const TensorView& v) {
  OT_CHECK(is_float(v.dtype), op, arg, "bf16, fp16 or fp32", dtype_name(v.dtype));
}
inline void check_shape(const char* op, const char* arg, const TensorView& v, const std::vector<int64_t>& want) {
  OT_CHECK(v.shape() == want, op, arg, TensorView(nullptr, v.dtype, want).shape_str(), v.shape_str());
}
inline void check_row_major(const char* op, const char* arg, const TensorView& v) {
  OT_CHECK(v.last_dim_contiguous(), op, arg, "unit stride in the last dim", v.shape_str());
}
// Float arguments, row-major unless marked otherwise (every dtype is checked before any stride).
struct FloatArg {
  const char* name;
  const TensorView& v;
  bool row_major = true;
};
inline void check_float_args(const char* op, std::initializer_list<FloatArg> args) {
  for (const FloatArg& a : args) check_float(op, a.name, a.v);
  for (const FloatArg& a : args)
    if (a.row_major) check_row_major(op, a.name, a.v);
}

}  // namespace ot::moe::bwd

namespace ot::moe::bwd {
// Rows [m0, m1) of dz = act'(z) * dy (row strides in elements), fp32 math, any float dtypes.
void act_backward_rows(gemm::Act act, int64_t m0, int64_t m1, int64_t N, const void* z, DType zt, int64_t ldz, const void* dy,
                       DType dyt, int64_t lddy, void* dz, DType dzt, int64_t lddz);

// SwiGLU forward rows: z = [g | u] (width 2N, row stride ldz); zo (optional) = z rounded to zot
// (the stored pre-activation); a = silu(g) u from z as stored, in a's dtype.
struct SwigluFwd {
  int64_t N = 0;
  const void* z = nullptr; DType zt = DType::f32; int64_t ldz = 0;
  void* zo = nullptr; DType zot = DType::f32; int64_t ldzo = 0;
  void* a = nullptr; DType at = DType::f32; int64_t lda = 0;
};
// SwiGLU backward rows in one pass, with the routed weight s = scale[m] (1 without scale):
//   a = silu(g) u rounded to z's dtype (as the forward stored it)
//   dot[m] = dy . a (optional: the routed weight's gradient), aw = s a in z's dtype (optional:
//   the down projection's input), dz = [s dy u silu'(g) | s dy silu(g)] in dz's dtype.
struct SwigluBwd {
  int64_t N = 0;
  const void* z = nullptr; DType zt = DType::f32; int64_t ldz = 0;
  const void* dy = nullptr; DType dyt = DType::f32; int64_t lddy = 0;
  const float* scale = nullptr;
  void* dz = nullptr; DType dzt = DType::f32; int64_t lddz = 0;
  float* dot = nullptr;
  void* aw = nullptr; int64_t ldaw = 0;
};
// Over all rows [0, M) in parallel; AVX-512, else AVX2, when every dtype is f32 or bf16, else scalar.
void swiglu_forward(const SwigluFwd& p, int64_t M);
void swiglu_backward(const SwigluBwd& p, int64_t M);
void swiglu_forward_rows_avx512(const SwigluFwd& p, int64_t m0, int64_t m1);
void swiglu_backward_rows_avx512(const SwigluBwd& p, int64_t m0, int64_t m1);
void swiglu_forward_rows_avx2(const SwigluFwd& p, int64_t m0, int64_t m1);  // act_backward__avx2.cpp
void swiglu_backward_rows_avx2(const SwigluBwd& p, int64_t m0, int64_t m1);
}  // namespace ot::moe::bwd

namespace ot::moe::bwd {
// Runs fn over the spans: in parallel (one single-threaded matmul per span) when there are many
// spans with distinct groups, else one after another (each matmul then uses every thread).
void for_each_span(const std::vector<Span>& spans, bool distinct_groups, FnRef<void(const Span&)> fn);
bool groups_distinct(const std::vector<Span>& spans, int64_t groups);
}  // namespace ot::moe::bwd

namespace ot::moe::bwd {
// Validated shapes of the routing backwards (shared by the fast paths and the references).
struct RoutingBwdPlan {
  int64_t T = 0, K = 1, H = 0, P = 0;  // tokens, top-k, hidden, rows of the permuted/expanded side
  int64_t E = 0;                       // finalize: experts of the bias
  int mode = 0;                        // finalize drop_pad_mode / init routing row_idx_type
};
RoutingBwdPlan plan_permute_backward(const char* op, const TensorView& d_permuted, const TensorView& sorted_indices, int64_t topk);
RoutingBwdPlan plan_unpermute_backward(const char* op, const TensorView& d_out, const TensorView& permuted, const TensorView& sorted_indices,
                                       const TensorView& probs);
RoutingBwdPlan plan_init_routing_backward(const char* op, const TensorView& d_expanded_x, const TensorView& expanded_row_idx,
                                          int64_t num_tokens, int64_t topk, int row_idx_type);
RoutingBwdPlan plan_finalize_backward(const char* op, const TensorView& d_out, const TensorView& expanded_x, const TensorView& expanded_row_idx,
                                      const TensorView& scales, const TensorView& bias, const TensorView& expert_idx, int drop_pad_mode);
// Valid destinations (0 <= d < limit) must be distinct, so scattering by them never races.
void check_distinct(const char* op, const char* arg, const int32_t* idx, int64_t n, int64_t limit);

struct RouterBwdPlan { int64_t T = 0, E = 0, K = 0; };
RouterBwdPlan plan_router_backward(const char* op, const TensorView& dy, const TensorView& x, const char* x_name, const TensorView& expert_idx,
                                   const TensorView& allowed);
}  // namespace ot::moe::bwd

namespace ot::moe::bwd {
std::vector<double> read_counts(const char* op, const TensorView& tokens_per_expert, int64_t E);
void check_loss_input(const char* op, const char* arg, const TensorView& v);
void check_mask(const char* op, const TensorView& mask, int64_t T);
}  // namespace ot::moe::bwd

namespace ot::moe::bwd {
// parallel_for that stays on the calling thread when the work (rows x cost per row, in elements)
// is too small to pay for waking the other threads.
inline void parallel_rows(int64_t n, int64_t cost_per_row, FnRef<void(int64_t, int64_t)> fn) {
  if (n <= 0) return;
  if (n * cost_per_row < (int64_t(1) << 15)) { fn(0, n); return; }
  parallel_for(n, fn);
}
}  // namespace ot::moe::bwd
