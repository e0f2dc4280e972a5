// The demo's model: embedding -> `layers` decoder blocks -> final RMSNorm -> LM head, each block
//   x += out_proj(gated_rms_norm(GDN(in_proj(rms_norm(x))), z))      Gated DeltaNet mixer
//   x  = moe_ffn(rms_norm(x), residual = x)                          MoE FFN (+ shared expert)
// with random, well-scaled weights (fixed seed). Prefill runs a packed varlen batch (cu_seqlens) with
// chunk_gated_delta_rule_fwd and stores each sequence's final state in a per-layer state cache;
// decode runs one token per sequence with recurrent_gated_delta_rule on that cache.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "demo_config.h"
#include "demo_ops.h"
#include "ot/tensor.h"

namespace ot::moe {
class MoeExperts;
}
namespace ot::gdn {
struct SeqInfo;
}

namespace ot::demo {

struct Layer;  // weights of one block (demo_model.cpp)

// Per-operator verification results: each checked call runs the fast path and the reference on
// identical inputs; the fast output is what the model continues with.
struct Verifier {
  struct Entry { int64_t calls = 0; double max_err = 0; };
  std::map<std::string, Entry> ops;
  void add(const std::string& op, double err);
};

// Sequences in flight and their GDN state-cache slots.
struct Batch {
  std::vector<int64_t> lengths;  // tokens per sequence this step (prefill: prompt; decode: 1)
  std::vector<int32_t> slots;    // state-cache slot of each sequence
  int64_t tokens() const;
};

// Work of a library operator call computed from its shapes, for calls whose trace event carries no
// FLOP or byte count (matched to events by name, in call order).
struct Work { std::string op; double flops = 0, bytes = 0; };

// Expert-parallel MoE layers (`ot demo --ep`, set up by demo_ep.cpp; MPI stays there). This rank
// packs only experts [expert_begin, expert_end) of every layer; the model routes its own tokens and
// runs the shared expert locally, and `routed` runs the routed experts collectively over the ranks
// (dispatch -> local grouped FFN -> combine). Every rank must make the same calls in the same order.
struct ExpertParallel {
  int rank = 0, world = 1;
  int64_t expert_begin = 0, expert_end = 0;
  // Returns y [T, H] (xn's dtype) = base + sum_k w[t, k] * expert_{ids[t, k]}(xn[t]) over every
  // rank's experts; local holds this rank's experts (local expert l = expert expert_begin + l).
  std::function<Tensor(const moe::MoeExperts& local, const TensorView& xn, const TensorView& ids, const TensorView& w,
                       const TensorView& base)>
      routed;
  // Every rank's rows concatenated in rank order; *first: where this rank's rows start (verification).
  std::function<Tensor(const TensorView& rows, int64_t* first)> gather;
};

// `ot demo --compare-isolated`: while set on a model, every operator call of a step is followed by
// `repeats` more calls of the same operator on the same inputs, back to back (outputs that the step
// keeps are not written again: accumulations and the state cache go to copies); per operator name,
// the calls and the sum over calls of the median of those repeats.
struct Isolation {
  int repeats = 5;
  struct Entry { int64_t calls = 0; double ms = 0; };
  std::map<std::string, Entry> ops;
  void time(const char* name, const std::function<void()>& fn);
};

class Model {
 public:
  // Builds all weights from cfg.run.seed. keep_ref_layers: layers whose unpacked weights are kept
  // for the reference path. ep: expert-parallel MoE layers (null: one process holds every expert).
  Model(const DemoConfig& cfg, int64_t keep_ref_layers, const ExpertParallel* ep = nullptr);
  ~Model();
  const DemoConfig& config() const { return cfg_; }
  int64_t num_layers() const { return int64_t(layers_.size()); }

  // Zeroed GDN state caches with `slots` slots for every layer.
  void reset_cache(int64_t slots);
  // Runs tokens through the first `layers` blocks (all when < 0) and the head; returns the next
  // token of every sequence (greedy). prefill: tokens holds the prompts back to back.
  std::vector<int32_t> step(const std::vector<int32_t>& tokens, const Batch& batch, bool prefill, Verifier* verify = nullptr,
                            int64_t layers = -1);
  // Isolated re-timing of every operator call (null: off); see Isolation.
  void set_isolation(Isolation* iso) { iso_ = iso; }
  // Work records of the library calls since the last take (see Work).
  std::vector<Work> take_work();

 private:
  void mixer(Layer& L, int64_t l, Tensor& x, const Batch& batch, bool prefill, Verifier* v);
  void ffn(Layer& L, Tensor& x, Verifier* v);
  void ffn_ep(Layer& L, Tensor& x, const Tensor& xn, Verifier* v);
  Work gdn_prefill_work(const Batch& batch) const;
  DemoConfig cfg_;
  Tensor embed_, final_norm_;
  Linear lm_head_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<Tensor> cache_;  // per layer [slots, HV, DK, DV] fp32
  // A prefill step's sequence boundaries (cu_seqlens and its chunks), derived once per step and
  // shared by every GDN layer of it.
  Tensor cu_seqlens_;
  std::unique_ptr<gdn::SeqInfo> seq_;
  std::vector<Work> work_;
  ExpertParallel ep_;
  bool use_ep_ = false;
  Isolation* iso_ = nullptr;
};

}  // namespace ot::demo
