// Pieces shared by moe_ffn_forward_train and moe_ffn_backward.
#pragma once
#include <vector>

#include "ot/moe.h"
#include "ot/moe_bwd.h"
#include "src/moe/bwd_common.h"

namespace ot::moe::impl {
void* scratch(int slot, size_t bytes);  // src/moe/common.h (that header clashes with ot::moe::detail here)
}

namespace ot::moe::bwd {

struct FfnDims { int64_t T = 0, H = 0, E = 0, K = 0, I = 0, Is = 0; };
void check_ffn(const char* op, const TensorView& x, const MoeFfnWeights& w, const MoeFfnOptions& o, FfnDims& d);
// One span per expert with kept rows (rows [offset, offset + count) of the sorted order).
std::vector<Span> expert_spans(const RoutingPlan& p);
// out[i] = the row rows[i] of src (rows of row_bytes, contiguous at out).
void gather_rows(const void* src, size_t row_bytes, const int32_t* rows, int64_t n, void* out);
// The training paths' slots 0..7 of the shared per-thread scratch (impl::scratch 4..11): the
// backward's row buffers are tens of MB, and fresh ones cost page faults on every call.
inline void* scratch(int slot, size_t bytes) { return impl::scratch(4 + slot, bytes); }

// Weight W_g of a stack ([G, R, C] row-major rows, or one [R, C] matrix for G = 1).
inline const char* weight_of(const TensorView& w, int64_t g) {
  return static_cast<const char*>(w.data) + (w.ndim == 3 ? g * w.strides[0] * int64_t(dtype_size(w.dtype)) : 0);
}
inline int64_t weight_ld(const TensorView& w) { return w.strides[w.ndim - 2]; }

// v itself when its last dim is contiguous (rows addressable by one stride), else a contiguous
// copy held in `hold` (2-D or 3-D weight views).
TensorView row_major(const TensorView& v, Tensor& hold);

// The gate, up and down weights of one FFN call, each row-major: [G, H, I], [G, H, I], [G, I, H]
// (or 2-D); a strided view is replaced by a contiguous copy that this object keeps alive.
struct FfnWeights {
  FfnWeights() = default;
  FfnWeights(const TensorView& gate, const TensorView& up, const TensorView& down)
      : g(row_major(gate, hold_[0])), u(row_major(up, hold_[1])), d(row_major(down, hold_[2])) {}

 private:
  Tensor hold_[3];  // declared first: initialised before the views that may point into it

 public:
  TensorView g, u, d;
};

// SwiGLU FFNs over row spans (rows of span i use weights `group`), forward and backward, on one
// of two schedules (FfnSchedule below). Routed experts: gathered rows and the routed
// weights as scale; the shared expert: one span of all tokens. FfnRows: what both directions read.
struct FfnRows {
  int64_t H = 0, I = 0, G = 1;
  DType dt = DType::f32;
  const void* xs = nullptr;          // [A, H] rows (dt), or with gather the [T, H] source rows
  const int32_t* gather = nullptr;   // [A] source row of each row of xs (and dys), or none (rows given)
  std::vector<Span> spans;
  FfnWeights w;
};
// The routed experts of a layer: x's rows gathered in p's order, one span per expert with rows.
void set_routed_rows(FfnRows& r, const TensorView& x, const MoeFfnWeights& w, const RoutingPlan& p, int64_t I);
// The shared expert of a layer: all of x's rows in one span (none when x has no rows).
void set_shared_rows(FfnRows& r, const TensorView& x, const MoeFfnWeights& w, int64_t Is);

struct FfnRowsForward : FfnRows {
  void* z = nullptr;                 // out: [A, 2I] pre-activation (dt)
  float* out = nullptr;              // out: [A, H] fp32 down projection (added to with out_acc)
  bool out_acc = false;
};
void ffn_rows_forward(const FfnRowsForward& f);

struct FfnRowsBackward : FfnRows {
  const void* dys = nullptr;         // [A, H] gradient of the FFN output rows (dt), or as xs
  const void* z = nullptr;           // [A, 2I] stored pre-activation (dt)
  const float* scale = nullptr;      // [A] routed weights (output = scale * FFN), or none
  void *dg = nullptr, *du = nullptr, *dd = nullptr;  // weight gradients, contiguous, in gdt
  DType gdt = DType::f32;
  bool acc = false;                  // add to the weight gradients (groups without rows untouched)
  float* dx = nullptr;               // [A, H] fp32 (added to with dx_acc)
  bool dx_acc = false;
  float* dot = nullptr;              // [A] d scale (dy . FFN(x) per row), or none
};
void ffn_rows_backward(const FfnRowsBackward& f);

// How ffn_rows_forward / ffn_rows_backward run their spans.
//   per_call: each projection is one grouped engine call over all spans (every thread on every
//     stage, a join between stages).
//   expert_major: one parallel_for_dynamic over the spans, each thread running one span's whole
//     chain (backward: g, SwiGLU pass, the three weight gradients, dx; forward: gate/up, SwiGLU,
//     down) with its intermediates in L2.
//   automatic: picked by shape (ffn_schedule_for). The other two are forced, for tests and
//     benchmarks (expert_major needs distinct groups, else per_call runs).
enum class FfnSchedule { automatic, per_call, expert_major };
void set_ffn_schedule(FfnSchedule s);
// Per-span row buffers (x, dy, dz, g rows) up to this size keep an expert's chain in L2.
inline constexpr int64_t kExpertChainL2 = 2 << 20;
FfnSchedule ffn_schedule_for(const std::vector<Span>& spans, int64_t H, int64_t I, int64_t G);
// Sorted row of each flat (t, k) slot, -1 when the pair was dropped.
std::vector<int32_t> row_of_slot(const RoutingPlan& p, int64_t TK);
// The router stage of moe_ffn through the public routers (gating_top_k with its scores).
GatingResult route(const TensorView& logits, const MoeFfnOptions& o);

}  // namespace ot::moe::bwd
