// Argument checks and output allocation shared by the GDN backward composition and its reference.
#pragma once
#include "ot/gdn_bwd.h"
#include "src/gdn/gdn_internal.h"

namespace ot::gdn::detail {

struct BwdArgs : Qkv {
  Tok g, beta, dO, A;  // g: the cumulative gate (composition) or the raw gate (reference)
  float scale = 1.f;
  StateRef S0, dht;     // S0 always fp32 (a bf16 / fp16 initial state widened into s0_f32)
  const float* h = nullptr;  // the forward's saved chunk states (with v_new), or null
  Tok v_new;
  Tensor s0_f32;
  SeqInfo storage;
  const SeqInfo* seq = nullptr;
  int64_t group() const { return HV / HK; }
};

// Validates every argument (shapes, dtypes, heads, states, cu_seqlens, finite values) before
// anything is written. `gate_required`: g must be given (the composition needs g_cumsum).
void check_bwd(BwdArgs& a, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g, const TensorView& beta,
               const TensorView& dO, const ChunkBwdOptions& opt, bool gate_required, const char* op);

// Outputs in the documented dtypes and layouts (dq, dk like q; dv like v; dbeta like beta; dg fp32
// like g or like beta when g is absent; dh0 when an initial state is given).
ChunkBwd alloc_bwd(const BwdArgs& a, const TensorView& q, const TensorView& v, const TensorView& beta, const ChunkBwdOptions& opt);

// FLOPs of the backward by the spec's formula (section 11), over the actual chunk lengths.
double bwd_flops(const SeqInfo& s, int64_t HV, int64_t DK, int64_t DV);

}  // namespace ot::gdn::detail

namespace ot::gdn::detail {

// Per-thread fp32 scratch of the stage operators: `rows` buffers of kChunk x D, `mats` of
// kChunk x kChunk, `vecs` of kChunk, and one DK x DV state.
class StageScratch {
 public:
  StageScratch(int rows, int mats, int vecs, int64_t D, int64_t state);
  float* row(int tid, int i) const { return ws_->get(rows_, tid) + size_t(i) * size_t(kChunk * D_); }
  float* mat(int tid, int i) const { return ws_->get(mats_, tid) + size_t(i) * size_t(kChunk * kChunk); }
  float* vec(int tid, int i) const { return ws_->get(vecs_, tid) + size_t(i) * size_t(kChunk); }
  float* state(int tid) const { return ws_->get(state_, tid); }

 private:
  int64_t D_;
  WorkspacePlan plan_;
  Slot<float> rows_, mats_, vecs_, state_;
  std::unique_ptr<Workspace> ws_;
};


}  // namespace ot::gdn::detail
