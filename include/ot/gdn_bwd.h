// Gated DeltaNet backward (spec section 6): the chunked backward stages and their composition.
// Same layouts, varlen metadata (Common), dtypes and head grouping as the forward (ot/gdn.h).
//
// Gradients returned by the composition (loss L; o and the final state are the forward's outputs):
//   dq, dk  like q, k (q's / k's dtype), w.r.t. the raw q, k: through the l2norm when it is on, and
//           summed over the HV/HK value heads that share a key head;
//   dv      like v (v's dtype);  dbeta like beta (beta's dtype);
//   dg      like g, fp32, w.r.t. the raw per-token log gate g (not its cumsum);
//   dh0     [N,HV,DK,DV] fp32 when an initial state was given.
#pragma once
#include <optional>

#include "ot/gdn.h"

namespace ot::gdn {

struct ChunkBwdOptions : Common {
  std::optional<float> scale;      // default 1/sqrt(DK)
  TensorView initial_state;        // [N,HV,DK,DV] fp32, bf16 or fp16, as given to the forward (dh0 returned when defined)
  TensorView dht;                  // gradient of the final state, [N,HV,DK,DV] fp32 (undefined: zero)
  bool use_qk_l2norm_in_kernel = false;
  TensorView A;                    // the forward's saved (I + M)^-1 (fp32, like its output); undefined: recomputed
  // The forward's h and v_new (ChunkOptions::save_states), both or neither: the backward then
  // skips its forward recompute of the states (it still forms W = A diag(beta e^G) K per chunk).
  TensorView h, v_new;
  // Opt-in, for bf16 q, k, v: the reverse scan's products take bf16-rounded operands with fp32
  // accumulation (vdpbf16ps where the GEMM uses it; fla's precision); the elementwise steps and the
  // sums stay fp32. ~1.35x faster at Qwen3.5 shapes on Zen 5, at ~6e-3 relative RMS from the fp64
  // gradients instead of ~4e-4 (a bf16 operand rounding is ~1e-3 relative on every product, and the
  // chain has twenty). false (default): fp32 products.
  bool bf16_compute = false;
};
struct ChunkBwd { Tensor dq, dk, dv, dg, dbeta, dh0; };

// The composition (spec 6, "Order"): recomputes w, u and the chunk states h from the inputs, the
// saved g_cumsum (chunk-local cumulative gate, fp32) and A (or takes h and v_new saved by the
// forward), then runs the reverse chunk scan.
// q, k, v: the forward's inputs (raw, before the in-kernel l2norm); dO like the forward's o.
ChunkBwd chunk_gated_delta_rule_bwd(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g_cumsum,
                                    const TensorView& beta, const TensorView& dO, const ChunkBwdOptions& opt = {});

// ---- stages (spec 6.1-6.4). Token tensors in layout c.layout; per-value-head outputs fp32. -------

// dv_local = s (causal(E) o Q K^T)^T dO per chunk; fp32, shaped like dO.
Tensor chunk_bwd_dv_local(const TensorView& q, const TensorView& k, const TensorView& g_cumsum, const TensorView& dO,
                          std::optional<float> scale = std::nullopt, const Common& c = {});

// Reverse state scan. dh: gradient of the state after every chunk, fp32 like the forward's h
// ([B,NT,HV,DK,DV], varlen [1,NT_total,HV,DK,DV]); dh0 [N,HV,DK,DV] fp32 when want_dh0; dv2 = the
// full gradient of v_new, fp32 like dv_local. dht: [N,HV,DK,DV] fp32 or undefined (zero).
struct BwdDhu { Tensor dh, dh0, dv2; };
BwdDhu chunk_gated_delta_rule_bwd_dhu(const TensorView& q, const TensorView& k, const TensorView& w, const TensorView& g_cumsum,
                                      const TensorView& dht, const TensorView& dO, const TensorView& dv_local, bool want_dh0,
                                      std::optional<float> scale = std::nullopt, const Common& c = {});

// dq, dk (output and state paths), dw per VALUE head [.., HV, DK] fp32 (the caller sums groups), and
// dg: the gradient w.r.t. the cumulative gate (fp32 like g_cumsum).
struct BwdDqkwg { Tensor dq, dk, dw, dg; };
BwdDqkwg chunk_bwd_dqkwg(const TensorView& q, const TensorView& k, const TensorView& v_new, const TensorView& h, const TensorView& g_cumsum,
                         const TensorView& dv2, const TensorView& dO, const TensorView& dh, std::optional<float> scale = std::nullopt,
                         const Common& c = {});

// Through W = A diag(beta e^G) K, U = A diag(beta) V and A = (I + M)^-1.
// _da: dP = (dL/dM) o E per chunk, fp32 [.., HV, BT] like A, row = token i, column j < i (fla-npu
// stores the transpose; ours keeps A's orientation).
Tensor prepare_wy_repr_bwd_da(const TensorView& k, const TensorView& v, const TensorView& beta, const TensorView& A, const TensorView& dw,
                              const TensorView& du, const TensorView& g_cumsum, const Common& c = {});
// dk per VALUE head [.., HV, DK], dv, dbeta, dg (w.r.t. the cumulative gate), all fp32.
struct WyBwd { Tensor dk, dv, dbeta, dg; };
WyBwd prepare_wy_repr_bwd_full(const TensorView& k, const TensorView& v, const TensorView& beta, const TensorView& A, const TensorView& dP,
                               const TensorView& dw, const TensorView& du, const TensorView& g_cumsum, const Common& c = {});
// Fused _da + _full.
WyBwd prepare_wy_repr_bwd(const TensorView& k, const TensorView& v, const TensorView& beta, const TensorView& A, const TensorView& dw,
                          const TensorView& du, const TensorView& g_cumsum, const Common& c = {});

// The reverse chunk-local cumsum that turns dL/dG into dL/dg is chunk_local_cumsum(x, true) (ot/gdn.h);
// the l2norm backward is l2norm_bwd (ot/gdn.h).

namespace ref {
// fp64 ground truth: the token recurrence differentiated exactly (backpropagation through the
// tokens), from the RAW gate g (undefined: 0) and beta (undefined: 1). opt.A is ignored.
ChunkBwd recurrence_bwd(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g, const TensorView& beta,
                        const TensorView& dO, const ChunkBwdOptions& opt = {});
}  // namespace ref

}  // namespace ot::gdn
