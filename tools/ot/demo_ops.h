// The demo's own glue between the library's operators: embedding, RMSNorm (plain and the GDN
// output's gated form), the GDN gates for prefill, linear projections on the matrix engine, greedy
// sampling. Each opens an ot::trace::OpScope (with its FLOPs and bytes) so it shows in the tables
// and the timeline like the library's operators. Rows are [T, width] views whose last dim is
// contiguous; float data in bf16/fp16/fp32.
#pragma once
#include <cstdint>
#include <vector>

#include "ot/gemm.h"
#include "ot/tensor.h"

namespace ot::demo {

// A projection y = x W^T with W stored as torch's nn.Linear weight [out, in]. The unpacked weight
// is kept only where the verification needs the reference GEMM.
struct Linear {
  int64_t in = 0, out = 0;
  gemm::PackedB packed;
  Tensor weight;  // [out, in] or undefined
};
Linear make_linear(const Tensor& weight, bool keep_unpacked);

// out [T, out] (+)= x [T, in] W^T. name: the event name ("in_proj", "lm_head", ...).
void linear(const char* name, const TensorView& x, const Linear& w, const TensorView& out, bool accumulate = false);
// The same through the reference GEMM (needs the unpacked weight).
void linear_ref(const TensorView& x, const Linear& w, const TensorView& out, bool accumulate = false);

// The plain forms of the two norms (double sums, one thread; w [DV] for the gated one), for the
// verification and `ot bench demo_norms`.
void rms_norm_ref(const TensorView& x, const float* w, double eps, const TensorView& out);
void gated_rms_norm_ref(const TensorView& o, const TensorView& z, const float* w, double eps, const TensorView& out);
// out[t] = table[ids[t]].
void embedding(const TensorView& table, const std::vector<int32_t>& ids, const TensorView& out);
// x / sqrt(mean(x^2) + eps) * w in x's dtype (w [H] fp32). Runs ot::rms_norm.
Tensor rms_norm(const TensorView& x, const float* w, double eps);
// Per value head: w * rmsnorm(o) * silu(z) -> [T, HV*DV] in o's dtype; o [T, HV, DV], z [T, HV*DV],
// w fp32 [HV*DV] (the head's [DV] weight repeated per head). Runs gdn::rms_norm_gated.
Tensor gated_rms_norm(const TensorView& o, const TensorView& z, const TensorView& w, double eps);
// g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b); a, b [T, HV]; g, beta fp32 [T, HV].
void gdn_gates(const TensorView& a, const TensorView& b, const float* A_log, const float* dt_bias, const TensorView& g,
               const TensorView& beta);
// Rows `rows` of x into out (the last token of every sequence before the LM head).
void gather_rows(const TensorView& x, const std::vector<int64_t>& rows, const TensorView& out);
// Greedy sampling: argmax of each row of logits [N, V].
std::vector<int32_t> argmax_rows(const TensorView& logits);
// Writes state [N, HV, DK, DV] fp32 into cache [slots, HV, DK, DV] at slots[n].
void store_states(const TensorView& state, const std::vector<int32_t>& slots, const TensorView& cache);

// Normalised error of a fast output against the reference: max |f - r| / max |r|.
double normalised_error(const TensorView& fast, const TensorView& ref);

}  // namespace ot::demo
