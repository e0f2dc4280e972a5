// Validation and planning shared by the MoE backward entry points and their references.
#pragma once
#include <cstdint>
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

}  // namespace ot::moe::bwd

namespace ot::moe::bwd {
// Rows [m0, m1) of dz = act'(z) * dy (row strides in elements), fp32 math, any float dtypes.
void act_backward_rows(gemm::Act act, int64_t m0, int64_t m1, int64_t N, const void* z, DType zt, int64_t ldz, const void* dy,
                       DType dyt, int64_t lddy, void* dz, DType dzt, int64_t lddz);
}  // namespace ot::moe::bwd

namespace ot::moe::bwd {
// Runs fn over the spans: in parallel (one single-threaded matmul per span) when there are many
// spans with distinct groups, else one after another (each matmul then uses every thread).
void for_each_span(const std::vector<Span>& spans, bool distinct_groups, FnRef<void(const Span&)> fn);
bool groups_distinct(const std::vector<Span>& spans, int64_t groups);
}  // namespace ot::moe::bwd
