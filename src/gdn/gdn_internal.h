// Internal helpers of the GDN family: every token tensor, whatever its layout or rank, is read
// through one strided (b, t, h, d) accessor, so the stages never copy a layout.
#pragma once
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "ot/error.h"
#include "ot/gdn.h"
#include "ot/gemm.h"
#include "ot/output_pool.h"
#include "ot/parallel.h"
#include "ot/tensor.h"
#include "ot/workspace.h"

namespace ot::gdn::detail {

// Element (b, t, h, d) of a token tensor at p + b*sb + t*st + h*sh + d*sd (elements).
struct Tok {
  char* p = nullptr;
  DType dt = DType::f32;
  int64_t B = 0, T = 0, H = 0, D = 1;
  int64_t sb = 0, st = 0, sh = 0, sd = 0;
  bool packed = false;  // given as a 3-D (or 2-D for scalars) varlen view without the B dim
  bool defined() const { return p != nullptr; }
  int64_t off(int64_t b, int64_t t, int64_t h) const { return b * sb + t * st + h * sh; }
  void* at(int64_t b, int64_t t, int64_t h) const { return p + off(b, t, h) * int64_t(dtype_size(dt)); }
  // The [L, D] matrix of head h, tokens t0.. of row b.
  gemm::MatView mat(int64_t b, int64_t t0, int64_t L, int64_t h) const { return {at(b, t0, h), dt, L, D, st, sd}; }
  float scalar(int64_t b, int64_t t, int64_t h) const;  // D == 1 tensors (g, beta)
  double get(int64_t b, int64_t t, int64_t h, int64_t d) const;   // element access (references)
  void set(int64_t b, int64_t t, int64_t h, int64_t d, double x) const;
};

// A [N, HV, DK, DV] state tensor (rows of DV contiguous); element (n, h, k, v).
struct StateRef {
  char* p = nullptr;
  DType dt = DType::f32;
  int64_t sn = 0, sh = 0, DK = 0, DV = 0;
  bool defined() const { return p != nullptr; }
  void* at(int64_t n, int64_t h) const { return p + (n * sn + h * sh) * int64_t(dtype_size(dt)); }
  float* f32(int64_t n, int64_t h) const { return static_cast<float*>(at(n, h)); }
};
StateRef state_ref(const TensorView& s);

// Canonical views. `vec`: [B,T,H,D] / [B,H,T,D] (4-D) or [T,H,D] / [H,T,D] (3-D, packed).
// `scal`: [B,T,H] / [B,H,T] or [T,H] / [H,T].
Tok tok_vec(const TensorView& x, Layout l, const char* op, const char* arg);
Tok tok_scal(const TensorView& x, Layout l, const char* op, const char* arg);
// A contiguous output shaped like a token tensor in layout l.
Tensor new_vec(Layout l, bool packed, DType dt, int64_t B, int64_t T, int64_t H, int64_t D, bool zero = false);
Tensor new_scal(Layout l, bool packed, DType dt, int64_t B, int64_t T, int64_t H);
// A per-chunk state tensor (the forward's h, the backward's dh): 5-D [B', NT', HV, DK, DV] fp32,
// contiguous, with B' * NT' == the number of chunks. Returns its data.
float* chunk_states(const TensorView& x, const SeqInfo& s, int64_t HV, int64_t DK, int64_t DV, const char* op, const char* arg);
// A new one shaped like the forward's h.
Tensor new_chunk_states(const SeqInfo& s, int64_t HV, int64_t DK, int64_t DV);
using ::ot::pooled_empty;  // ot/output_pool.h

// Shape checks naming the argument.
void expect_bt(const Tok& x, int64_t B, int64_t T, const char* op, const char* arg);
void expect_heads(const Tok& x, int64_t H, const char* op, const char* arg);
void expect_dim(const Tok& x, int64_t D, const char* op, const char* arg);
void expect_float(DType t, const char* op, const char* arg);
// HV % HK == 0 and both > 0.
void expect_groups(int64_t HV, int64_t HK, const char* op);
// HV a multiple of HK, then every listed tensor with batch B, T tokens and HV heads.
using NamedTok = std::pair<const Tok*, const char*>;
void expect_value_heads(std::initializer_list<NamedTok> ts, int64_t B, int64_t T, int64_t HV, int64_t HK, const char* op);
// k shaped exactly like q.
void expect_like_q(const TensorView& k, const TensorView& q, const char* op);
// The checks every composed operator makes of q, k, v (views qt of q, vt of v): k like q, v of
// q's rank, batch and tokens, HV a multiple of HK, head dims in [1, 256].
void expect_qkv(const TensorView& q, const TensorView& k, const TensorView& v, const Tok& qt, const Tok& vt, const char* op);
// q, k, v as tokens in layout l, checked together (expect_qkv), with the sizes every composed
// operator takes from them.
struct Qkv {
  Tok q, k, v;
  int64_t B = 0, T = 0, HK = 0, HV = 0, DK = 0, DV = 0;
};
Qkv read_qkv(const TensorView& q, const TensorView& k, const TensorView& v, Layout l, const char* op);
// The attention scale: the caller's, else 1 / sqrt(DK) (fla's default).
inline float scale_or_default(const std::optional<float>& scale, int64_t DK) { return scale ? *scale : 1.f / std::sqrt(float(DK)); }
// An optional scalar-per-token tensor (g, beta): undefined stays undefined, else checked to have
// batch B, T tokens and H heads.
Tok opt_scal(const TensorView& x, Layout l, int64_t B, int64_t T, int64_t H, const char* op, const char* arg);
// Reports NaN/Inf anywhere in the tensor.
void expect_finite(const Tok& x, const char* op, const char* arg);
void expect_finite(const TensorView& x, const char* op, const char* arg);
// [N,HV,DK,DV] state (any float dtype listed in `allowed_bf16`).
void expect_state(const TensorView& s, int64_t N, int64_t HV, int64_t DK, int64_t DV, bool allow_bf16, const char* op, const char* arg);

// An initial state [N,HV,DK,DV] in fp32, bf16 or fp16 (fla passes it in the input dtype).
void expect_state_input(const TensorView& s, int64_t N, int64_t HV, int64_t DK, int64_t DV, const char* op, const char* arg);
// s as fp32 for the kernels: s itself when fp32 (or undefined), else its exact widening kept in
// `storage` (the recurrences run in fp32 whatever the state's storage type).
TensorView state_f32(const TensorView& s, Tensor& storage);
// A final state computed in fp32, returned as dt (fp32, bf16 or fp16; arg names the option).
Tensor state_as(Tensor fp32_state, DType dt, const char* op, const char* arg);

// The sequence metadata of a call: c.seq when given (checked against B, T), else derived.
const SeqInfo& resolve_seq(const Common& c, int64_t B, int64_t T, SeqInfo& storage, const char* op);

// Row transfers between a token tensor and fp32 scratch [L][ld].
void load_rows(const Tok& x, int64_t b, int64_t t0, int64_t L, int64_t h, float* dst, int64_t ld);
void store_rows(const float* src, int64_t ld, const Tok& x, int64_t b, int64_t t0, int64_t L, int64_t h);
void load_scal(const Tok& x, int64_t b, int64_t t0, int64_t L, int64_t h, float* dst);

// A chunk of a sequence: batch row, first token and length.
struct ChunkSpan { int64_t n, b, t0, L; };
inline ChunkSpan chunk_span(const SeqInfo& s, int64_t n, int64_t c) {
  int64_t t0 = s.bos[size_t(n)] + c * kChunk;
  int64_t L = s.len[size_t(n)] - c * kChunk;
  return {n, s.row[size_t(n)], t0, L < kChunk ? L : kChunk};
}
inline ChunkSpan chunk_span_global(const SeqInfo& s, int64_t id) {
  return chunk_span(s, s.chunk_seq[size_t(id)], s.chunk_pos[size_t(id)]);
}
// Row transfers of one chunk span.
inline void load_rows(const Tok& x, const ChunkSpan& sp, int64_t h, float* dst, int64_t ld) { load_rows(x, sp.b, sp.t0, sp.L, h, dst, ld); }
inline void store_rows(const float* src, int64_t ld, const Tok& x, const ChunkSpan& sp, int64_t h) { store_rows(src, ld, x, sp.b, sp.t0, sp.L, h); }
inline void load_scal(const Tok& x, const ChunkSpan& sp, int64_t h, float* dst) { load_scal(x, sp.b, sp.t0, sp.L, h, dst); }
// f(thread id, span, chunk id, head) for every (chunk, head) pair, dynamically scheduled.
template <class F> void for_chunk_heads(const SeqInfo& s, int64_t H, F&& f) {
  parallel_for_dynamic(s.num_chunks() * H, 0, [&](int64_t i0, int64_t i1) {
    const int tid = thread_id();
    for (int64_t i = i0; i < i1; ++i) f(tid, chunk_span_global(s, i / H), i / H, i % H);
  });
}
// Per-chunk state h: index [B, NT, HV, DK, DV] of the chunk (row b, chunk c of the row's sequence).
int64_t h_index(const SeqInfo& s, int64_t n, int64_t c);

void store_scal(const float* src, const Tok& x, int64_t b, int64_t t0, int64_t L, int64_t h);
inline void store_scal(const float* src, const Tok& x, const ChunkSpan& sp, int64_t h) { store_scal(src, x, sp.b, sp.t0, sp.L, h); }

// Per-thread fp32 scratch for one chunk of one value head (about 350 KiB at DK = DV = 128: stays
// in L2 for the whole chunk).
struct ChunkBufs {
  float *q, *k, *v, *w, *u, *o, *t;  // kChunk x D rows (D = max(DK, DV))
  float *g, *G, *beta, *rq, *rk;     // kChunk
  float *E, *M, *A;                  // kChunk x kChunk
  float* S;                          // DK x DV state
};
class ChunkScratch {
 public:
  ChunkScratch(int64_t DK, int64_t DV);
  ChunkBufs get(int tid) const;

 private:
  WorkspacePlan plan_;
  Slot<float> rows_, vecs_, mats_, state_;
  int64_t D_ = 0;
  std::unique_ptr<Workspace> ws_;
};

std::string shape_args(const TensorView& q, const TensorView& v, Layout l);

}  // namespace ot::gdn::detail
