// Gated DeltaNet (gated delta rule) forward operators: the chunked prefill stages, their
// composition, and the recurrent (decode / speculative) form. Mathematics and names follow
// /work/shared/specs/gdn_ops.md (sections 3-5); the backward builds on these stages.
//
// Shapes (D = DK for q/k/w, DV for v/u/v_new/o; T is T_total in varlen mode, where B must be 1):
//   Layout::BTHD (fla default): q,k [B,T,HK,D], v [B,T,HV,D], g,beta [B,T,HV];
//                               3-D views [T,H,D] / [T,H] are the packed varlen "TND" form.
//   Layout::BHTD (BNSD, head-major): q,k [B,HK,T,D], v [B,HV,T,D], g,beta [B,HV,T];
//                               3-D views [H,T,D] / [H,T] are the packed varlen "NTD" form.
// Any strides are accepted (no copies); outputs are contiguous in the same layout as the input
// they mirror. Value head h reads key head h / (HV/HK). q,k,v: bf16, fp16 or fp32; g, beta: fp32
// (bf16/fp16 accepted); states and all intermediates (G, M, A, w, u, v_new, h) fp32.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "ot/tensor.h"

namespace ot::gdn {

inline constexpr int64_t kChunk = 64;  // BT
enum class Layout : uint8_t { BTHD, BHTD };
inline constexpr Layout BNSD = Layout::BHTD;
const char* layout_name(Layout l);

// Sequences of a batch and their chunks, derived once from cu_seqlens (or the fixed-length batch)
// and reusable by every stage, every layer of a step, and the backward.
struct SeqInfo {
  int64_t batch = 0;    // B (1 in varlen mode)
  int64_t tokens = 0;   // T per batch row (T_total in varlen mode)
  bool varlen = false;
  std::vector<int64_t> row, bos, len;          // per sequence n: batch row, first token, length
  std::vector<int64_t> chunk_offsets;          // [N+1] first global chunk of each sequence
  std::vector<int32_t> chunk_seq, chunk_pos;   // per global chunk: its sequence n and index c
  int64_t num_seqs() const { return int64_t(len.size()); }
  int64_t num_chunks() const { return int64_t(chunk_seq.size()); }
  int64_t max_chunks_per_row() const;          // NT of the [B, NT, ...] state layout
  // Global chunk id of chunk c of sequence n, and its first token and length.
  int64_t chunk_id(int64_t n, int64_t c) const { return chunk_offsets[size_t(n)] + c; }
};
// cu_seqlens: host int64 or int32 [N+1], 0 first, non-decreasing, last == T (requires B == 1).
// Undefined: B sequences of T tokens. `op` names the operator in errors.
SeqInfo make_seq_info(int64_t B, int64_t T, const TensorView& cu_seqlens = {}, const char* op = "gdn");

// Arguments shared by every operator.
struct Common {
  Layout layout = Layout::BTHD;
  TensorView cu_seqlens;          // host [N+1], int64 or int32 (validated)
  const SeqInfo* seq = nullptr;   // precomputed metadata (must match the tensors); wins over cu_seqlens
};

// ---- stages (spec section 5) --------------------------------------------------------------

// Chunk-local prefix sum (forward) or suffix sum (reverse), times `scale`, in fp32. g: [B,T,H]
// (BTHD) or [B,H,T] (BHTD); out fp32, same shape. Chunks restart at every sequence start.
Tensor chunk_local_cumsum(const TensorView& g, bool reverse = false, float scale = 1.f, const Common& c = {});

// Row-wise L2 normalisation over the last dim: y = x / sqrt(sum x^2 + eps) (y in x's dtype,
// rstd fp32 over the leading dims) and its backward dx = rstd * (dy - (dy . y) y).
struct L2Norm { Tensor y, rstd; };
L2Norm l2norm_fwd(const TensorView& x, float eps = 1e-6f);
Tensor l2norm_bwd(const TensorView& y, const TensorView& rstd, const TensorView& dy);

// M[i,j] = beta_i (k_i . k_j) exp(G_i - G_j) for j < i inside a chunk, else 0.
// k [.., HK, DK], g_cumsum/beta [.., HV]; out fp32 [B,T,HV,BT] (BTHD) / [B,HV,T,BT] (BHTD).
Tensor chunk_scaled_dot_kkt_fwd(const TensorView& k, const TensorView& g_cumsum, const TensorView& beta, const Common& c = {});

// A = (I + M)^-1 per chunk (unit lower triangular; only the strictly lower part of M is read).
// Same shape as M, fp32. Rows past a sequence's last chunk end are zero.
Tensor solve_tril(const TensorView& M, const Common& c = {});

// w = A diag(beta e^G) K, u = A diag(beta) V per chunk; fp32, w [..,HV,DK], u [..,HV,DV].
struct WU { Tensor w, u; };
WU recompute_w_u_fwd(const TensorView& k, const TensorView& v, const TensorView& beta, const TensorView& A,
                     const TensorView& g_cumsum, const Common& c = {});

// Sequential state scan. h: state at the start of every chunk, fp32 [B,NT,HV,DK,DV] (varlen:
// [1,NT_total,HV,DK,DV], chunk id = SeqInfo::chunk_id); v_new = u - w S (undecayed), fp32 like u;
// final_state fp32 [N,HV,DK,DV] when requested. initial_state: [N,HV,DK,DV] fp32 (or undefined).
struct FwdH { Tensor h, v_new, final_state; };
FwdH chunk_gated_delta_rule_fwd_h(const TensorView& k, const TensorView& w, const TensorView& u, const TensorView& g_cumsum,
                                  const TensorView& initial_state, bool output_final_state, const Common& c = {});

// o = s diag(e^G) Q h + s (causal(E) o Q K^T) v_new per chunk; o in q's dtype, shaped like v_new.
Tensor chunk_fwd_o(const TensorView& q, const TensorView& k, const TensorView& v_new, const TensorView& h,
                   const TensorView& g_cumsum, std::optional<float> scale = std::nullopt, const Common& c = {});

// ---- composition (spec section 5.8) -------------------------------------------------------

struct ChunkOptions : Common {
  std::optional<float> scale;          // default 1/sqrt(DK)
  TensorView initial_state;            // [N,HV,DK,DV] fp32, bf16 or fp16 (read as fp32)
  bool output_final_state = false;
  DType final_state_dtype = DType::f32;  // fp32 (fla's convention), bf16 or fp16; computed in fp32
  bool use_qk_l2norm_in_kernel = false;
  bool save_for_backward = true;       // return g_cumsum and A (and the rstd of q, k with l2norm)
  // Also return h (the state before every chunk, fp32 like chunk_gated_delta_rule_fwd_h's h) and
  // v_new (fp32, like v): given to the backward they replace its forward recompute (W, U, v_new and
  // the state scan). Memory: 4 DK DV / 64 + 4 DV bytes a token and value head (1.5 KiB at 128 / 128,
  // 3x the bf16 q, k, v of a Qwen3.5 layer).
  bool save_states = false;
  // bf16 q, k, v on AVX512-BF16: every chunk product takes bf16 operands with fp32 accumulation
  // (fla's precision: A, W, S, v_new and the score matrix rounded to bf16 as matmul operands;
  // the state, G, A, the l2norm factors and all accumulators stay fp32). false: fp32 products
  // ("reference mode", final state ~1e-5 from the fp64 recurrence instead of ~1e-3).
  bool bf16_compute = true;
};
struct ChunkFwd {
  Tensor o;             // like v's layout, q's dtype
  Tensor final_state;   // [N,HV,DK,DV] in final_state_dtype (fp32 by default), when output_final_state
  Tensor g_cumsum;      // like g, fp32 (save_for_backward)
  Tensor A;             // like chunk_scaled_dot_kkt_fwd's output, fp32 (save_for_backward)
  Tensor q_rstd, k_rstd;  // [..] fp32 over q's/k's leading dims (with l2norm and save_for_backward)
  Tensor h, v_new;        // with save_states: [B,NT,HV,DK,DV] (varlen [1,NT_total,..]) and like v, fp32
};
ChunkFwd chunk_gated_delta_rule_fwd(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
                                    const TensorView& beta, const ChunkOptions& opt = {});

// ---- recurrent form (spec section 3.1): decode and speculative verification -----------------

struct RecurrentOptions : Common {
  std::optional<float> scale;          // default 1/sqrt(DK)
  bool use_qk_l2norm_in_kernel = false;
  // State in/out mode: initial_state [N,HV,DK,DV] fp32, bf16 or fp16 (undefined: zeros); final_state
  // returned when output_final_state, in final_state_dtype (fp32 by default). The state is fp32 in
  // between whatever the two dtypes.
  TensorView initial_state;
  bool output_final_state = false;
  DType final_state_dtype = DType::f32;
  // State-cache mode (when state_cache is defined): [num_slots,HV,DK,DV] fp32 or bf16 (bf16 halves
  // the traffic at ~3 significant digits of state), updated in place. state_indices int32:
  //   [N]       sequence n reads and writes slot state_indices[n]; with num_accepted_tokens only
  //             the first a_n tokens' updates are committed (outputs are produced for all tokens).
  //   [T_total] snapshot per token (Ascend/vLLM MTP): the state after token t is written to slot
  //             state_indices[t]; the initial state is read from state_indices[bos + a_n - 1]
  //             (a_n = num_accepted_tokens[n], default 1). A slot < 0 is not written.
  TensorView state_cache, state_indices, num_accepted_tokens;  // num_accepted_tokens int32 [N]
  // Fused gates: when A_log and dt_bias ([HV] fp32) are given, g holds the raw `a` and the gate is
  // -exp(A_log) softplus(a + dt_bias); when beta_sigmoid, beta holds the raw `b`: beta = sigmoid(b).
  TensorView A_log, dt_bias;
  bool beta_sigmoid = false;
};
struct RecurrentOut { Tensor o, final_state; };
// g undefined: no decay; beta undefined: beta = 1.
RecurrentOut recurrent_gated_delta_rule(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
                                        const TensorView& beta, const RecurrentOptions& opt = {});

// fla's name for the same operator.
inline RecurrentOut fused_recurrent_gated_delta_rule(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
                                                     const TensorView& beta, const RecurrentOptions& opt = {}) {
  return recurrent_gated_delta_rule(q, k, v, g, beta, opt);
}

// ---- references (fp64; used by the OT_FORCE_REF path, tests and `ot bench`) ---------------
namespace ref {
// The token-by-token recurrence of spec section 3 in fp64 for every (sequence, value head), with
// the same options as the chunked forward; o is fp32 (unrounded), final_state fp32.
ChunkFwd recurrence(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
                    const TensorView& beta, const ChunkOptions& opt = {});
}  // namespace ref

}  // namespace ot::gdn
