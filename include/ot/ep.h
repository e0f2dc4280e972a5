// Expert parallelism over MPI: tokens travel to the ranks that hold their experts (dispatch) and the
// expert outputs travel back, weighted and summed per token (combine). Semantics follow the v2
// dispatch/combine pair (specs/moe_ops.md section 9.2/9.3); the wire format is our own (section 9
// says the intermediate tensors are opaque), with DeepEP's per-rank dedup: a token crosses the wire
// once per destination rank and is fanned out to its local experts there.
//
// Every call here is collective over the Comm: every rank calls it, in the same order. Arguments are
// validated locally before any communication; the outcome travels in a record at the head of every
// message and all ranks decide from the same records, so a bad argument on one rank makes every
// rank throw ot::Error (no rank is left waiting). MPI is only called from the calling thread, never
// from inside a kernel. The Comm duplicates the caller's communicator for its own messages.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ot/gemm.h"
#include "ot/tensor.h"

namespace ot::moe {
class MoeExperts;
class QuantMoeExperts;
}

namespace ot::ep {

// Which rank(s) hold each expert. Default: contiguous shards (expert e on rank e / (E/W)). A hot
// expert may have copies on several ranks; a token's slot then goes to one copy (its own rank when it
// holds one, otherwise copy (src_rank + token) mod n), so tokens are split between copies.
class Placement {
 public:
  Placement() = default;
  static Placement contiguous(int64_t num_experts, int world_size);
  // copies[e]: ranks holding expert e (non-empty, distinct, each in [0, W)).
  static Placement from_copies(int64_t num_experts, int world_size, std::vector<std::vector<int>> copies);
  // Contiguous shards plus extra copies of the hottest experts (by `load`, tokens per expert) on the
  // least loaded ranks, `extra_per_rank` more experts per rank; a simple greedy rebalancer.
  static Placement rebalanced(int64_t num_experts, int world_size, const std::vector<int64_t>& load, int extra_per_rank);
  // Shared-expert ranks (spec 9, shared_expert_rank_num = S): ranks [0, S) hold the shared expert,
  // placed as expert id num_experts (one past the routed ones), and the routed experts are
  // contiguous over ranks [S, W). Use with DispatchOptions::shared_expert_rank_num = S.
  static Placement shared_ranks(int64_t num_experts, int world_size, int shared_ranks);

  int64_t num_experts() const { return int64_t(copies_.size()); }
  int world_size() const { return world_; }
  const std::vector<int>& copies(int64_t e) const { return copies_[size_t(e)]; }
  // Global ids of the experts held by rank q, ascending: the local expert order of expand_x.
  const std::vector<int64_t>& local_experts(int q) const { return local_[size_t(q)]; }
  // Local index of expert e on rank q, or -1.
  int local_index(int q, int64_t e) const;
  // Rank that receives slot (token t of rank r, expert e).
  int destination(int src_rank, int64_t token, int64_t e) const;
  uint64_t hash() const;  // equal on every rank (checked at each dispatch)

 private:
  int world_ = 0;
  std::vector<std::vector<int>> copies_;
  std::vector<std::vector<int64_t>> local_;
  std::vector<std::vector<int>> local_index_;  // [q][e]
  void build_local();
};

struct CommOptions {
  // Threads of ot's parallel regions in this process. Ranks on one node share its cores, so by
  // default (-1) the Comm sets ot's count to the cores this process may run on divided by the
  // number of this communicator's ranks on the node whose cores overlap them (4 ranks on 2 cores:
  // 1 each; one rank per machine: all its cores), unless the count was chosen already:
  // OT_NUM_THREADS or OMP_NUM_THREADS set, or ot::set_num_threads called with another value.
  // 0: leave ot's count alone; > 0: set exactly that many. (A process-wide setting: ot has one pool.)
  int threads = -1;
  // Ranks on one node exchange rows through an MPI-3 shared-memory window (one copy per row; see
  // docs/ep.md); false, or OT_EP_NODE_WINDOW=0 in the environment: MPI messages only (the path
  // between machines). Every rank must pass the same value (the window is on only if all ask).
  bool node_window = true;
  // The Comm's first placement: S > 0 gives Placement::shared_ranks(E, W, S) (ranks [0, S) hold
  // the shared expert; E a multiple of W - S, spec 9.1, so E need not divide by W), 0 contiguous
  // shards (E a multiple of W). For DispatchOptions::shared_expert_rank_num = S.
  int shared_expert_ranks = 0;
  // Seconds a rank waits for its peers' messages in one exchange of a dispatch or combine (as
  // torch.distributed's default process-group timeout: 30 minutes). Past it the rank throws an
  // ot::Error naming argument "peer" and the ranks it still waited for, and the Comm is unusable
  // from then on (every later call throws, naming "comm"): drop it and end the job. <= 0: wait as
  // long as MPI does. OT_EP_TIMEOUT_S in the environment overrides. Covers every wait: the message
  // exchanges (records, the rows of the one-round form) and the row collectives of the split and
  // all_gather forms (a timed-out collective stays with MPI until the process ends: docs/robustness.md).
  double timeout_s = 1800;
};

// A communicator wrapper: the caller's MPI communicator (not owned; MPI_COMM_WORLD by default), the
// expert placement and reusable communication buffers.
class Comm {
 public:
  // Contiguous placement (or shared-expert ranks, CommOptions::shared_expert_ranks); collective
  // (duplicates comm, finds the ranks on this node).
  Comm(MPI_Comm comm, int64_t num_experts, const CommOptions& opt = {});
  explicit Comm(int64_t num_experts) : Comm(MPI_COMM_WORLD, num_experts) {}
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int ep_world_size() const { return world_; }
  int ep_rank_id() const { return rank_; }
  int node_size() const { return node_size_; }            // ranks of this communicator on this node
  int threads_per_rank() const { return node_threads_; }  // the node's cores shared out (CommOptions)
  bool node_window() const;       // rows between the ranks of this node go through shared memory
  int64_t window_sends() const;   // messages whose rows this rank wrote into a peer's window slot
  MPI_Comm mpi() const { return comm_; }
  const Placement& placement() const { return placement_; }
  // Takes effect at the next dispatch; every rank must set the same placement.
  void set_placement(Placement p);
  int64_t num_local_experts() const { return int64_t(placement_.local_experts(rank_).size()); }

  // Advances outstanding non-blocking transfers (called between compute steps while overlapping).
  void progress();

  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  MPI_Comm comm_;
  int world_ = 1, rank_ = 0, node_size_ = 1, node_threads_ = 1;
  Placement placement_;
  std::unique_ptr<Impl> impl_;
};

enum class Dispatcher { all_to_all, all_gather };
const char* dispatcher_name(Dispatcher d);

struct DispatchOptions {
  int64_t moe_expert_num = 0;        // E: must equal the Comm's placement and be divisible by W - shared_expert_rank_num
  int ep_world_size = 0;             // 0: the communicator's; otherwise must match it
  int ep_rank_id = -1;               // -1: the communicator's; otherwise must match it
  Dispatcher dispatcher = Dispatcher::all_to_all;
  bool quant_int8 = false;           // dynamic per-row int8 (expand_x int8 + dynamic_scales)
  int expert_token_nums_type = 1;    // 0 cumsum, 1 count (the grouped matmul's group_list_type)
  // Combine: true reduces each token's local expert outputs on the expert rank and sends one row
  // back per (token, rank) (DeepEP normal mode); false sends one row per (token, expert) and sums in
  // k order at the source (bit-identical to the single-process k-order sum). all_gather always
  // reduce-scatters partial sums (Megatron's allgather dispatcher).
  bool dedup_combine = true;
  int shared_expert_num = 0;         // shared experts computed on every rank from its own x (no traffic)
  // S > 0: every token is also sent once to one of the shared-expert ranks [0, S) (the Comm's
  // placement must be Placement::shared_ranks(E, W, S)); there it is a row of local expert 0 (the
  // shared expert), and combine adds its output unweighted. moe_expert_num must divide by W - S.
  int shared_expert_rank_num = 0;
  // Combine wire format (spec 9.3 comm_quant_mode): 0 = expert outputs in their dtype; 2 = each
  // returned row (dedup partial sum or per-slot output) as int8 with a per-row fp32 scale, dequantised
  // on arrival (lossy; about half the combine bytes for bf16). all_gather's reduce-scatter stays fp32.
  int comm_quant_mode = 0;
  // Smooth-quant scales for quant_int8 (spec 9.2 `scales`): fp32 [moe_expert_num + shared_expert_num, H],
  // shared experts' rows first, so routed expert e uses row e + shared_expert_num (the shared-rank
  // expert uses row 0 when shared_expert_num > 0, else none). Row (token t, expert e) of expand_x is
  // then int8(x[t] * scales[e]) with its own dynamic scale: quantised per (token, expert) on the
  // expert's rank, so the wire carries x's dtype (still once per token and rank), not int8.
  // Every rank passes the same tensor; it must stay valid until the dispatch completes.
  TensorView smooth_scales;
  // Special experts (spec 9.3), ids after the routed ones: [E, E + zero) output 0, then copy experts
  // output ori_x[t], then const experts c output alpha1[c] * ori_x[t] + alpha2[c] * const_v[c].
  // Never sent: combine adds w * output on the token's own rank (CombineInputs). Same on all ranks.
  int64_t zero_expert_num = 0, copy_expert_num = 0, const_expert_num = 0;
  // [BS] or [BS, K] u8 (bool), or undefined (all active). 1-D: a false token is not sent and its
  // x_out row is zero (shared_expert_x is not added); 2-D: a false (token, k) slot is not sent and
  // contributes nothing. Under all_gather, tokens without an active slot are not gathered.
  TensorView x_active_mask;
};

// Internal state shared by dispatch and the matching combine (opaque).
struct DispatchState;

struct DispatchResult {
  Tensor expand_x;                  // [A, H]: rows ordered (local expert, source rank, token); int8 if quant
  Tensor dynamic_scales;            // [A] fp32 when quant_int8 (row = q * scale), else undefined
  Tensor assist_info_for_combine;   // [A, 3] int32: (source rank, source token, k) of each row
  Tensor expert_token_nums;         // [L] int64: count or inclusive cumsum per local expert
  Tensor ep_recv_counts;            // [L * W] int32: inclusive running sum in (l, r) order
  int64_t bytes_sent = 0;           // bytes this rank put on the wire (payload + headers, no self)
  std::shared_ptr<DispatchState> handle;
};

// Split form: start validates, exchanges the records (outcome and counts), posts the non-blocking
// transfer and fills the rows that come from this rank (ready at once); wait() completes the rest.
class PendingDispatch {
 public:
  PendingDispatch() = default;
  PendingDispatch(PendingDispatch&&) noexcept;
  PendingDispatch& operator=(PendingDispatch&&) noexcept;
  ~PendingDispatch();
  // Outputs are allocated at start; expand_x rows of local_blocks() are valid before wait().
  DispatchResult& result() { return res_; }
  // For each local expert l: [begin, begin + count) rows of expand_x from this rank (ready now).
  struct Block { int64_t begin = 0, count = 0; };
  const std::vector<Block>& local_blocks() const;
  bool test();        // true when the transfer has finished (advances it)
  DispatchResult& wait();

 private:
  friend struct PendingAccess;
  DispatchResult res_;
  bool done_ = true;
};

// x [BS, H] (bf16/fp16/fp32), expert_ids [BS, K] int32 (distinct per row, in [0, E)),
// expert_scales [BS, K] fp32 (undefined: all 1).
DispatchResult moe_distribute_dispatch(Comm& comm, const TensorView& x, const TensorView& expert_ids,
                                       const TensorView& expert_scales, const DispatchOptions& opt);
PendingDispatch moe_distribute_dispatch_start(Comm& comm, const TensorView& x, const TensorView& expert_ids,
                                              const TensorView& expert_scales, const DispatchOptions& opt);

// Combine's optional inputs (spec 9.3).
struct CombineInputs {
  TensorView shared_expert_x;  // [BS, H] float, added unweighted
  TensorView ori_x;            // [BS, H] float: the copy / const experts' input (required when any are configured)
  TensorView const_expert_alpha_1, const_expert_alpha_2;  // [const_expert_num] fp32
  TensorView const_expert_v;                              // [const_expert_num, H] float
};

// expert_out [A, H] (float dtype): the expert output of each expand_x row. Returns x_out [BS, H] in
// expert_out's dtype: sum over k of scale * expert output (+ shared_expert_x [BS, H] unweighted).
Tensor moe_distribute_combine(Comm& comm, const TensorView& expert_out, const DispatchResult& dispatched,
                              const TensorView& shared_expert_x = {});
Tensor moe_distribute_combine(Comm& comm, const TensorView& expert_out, const DispatchResult& dispatched, const CombineInputs& in);

// Split form of combine: start sends, wait receives, decides (throws on every rank alike) and sums.
class PendingCombine {
 public:
  PendingCombine() = default;
  PendingCombine(PendingCombine&&) noexcept;
  PendingCombine& operator=(PendingCombine&&) noexcept;
  ~PendingCombine();
  bool test();
  Tensor wait();
  int64_t bytes_sent() const { return bytes_sent_; }
  struct State;

 private:
  friend struct PendingAccess;
  std::shared_ptr<State> st_;
  int64_t bytes_sent_ = 0;
};
PendingCombine moe_distribute_combine_start(Comm& comm, const TensorView& expert_out, const DispatchResult& dispatched,
                                            const TensorView& shared_expert_x = {});
PendingCombine moe_distribute_combine_start(Comm& comm, const TensorView& expert_out, const DispatchResult& dispatched,
                                            const CombineInputs& in);

// ---- Local expert compute (the seam to the MoE layer's grouped FFN) ----
// One batch of rows for the local experts: rows [row_begin[g], row_begin[g] + rows[g]) of x belong
// to local expert expert[g]. x is bf16/fp16/fp32, or int8 with per-row dynamic_scales.
struct ExpertBatch {
  TensorView x;                    // [A, H]
  TensorView dynamic_scales;       // [A] fp32 or undefined
  std::vector<int64_t> expert, row_begin, rows;
  TensorView y;                    // [A, H] output rows (same row positions)
  std::function<void()> progress;  // call between groups to advance communication
};
using ExpertFn = std::function<void(const ExpertBatch&)>;

// SwiGLU experts on prepacked weights: y = (silu(x Wg) * (x Wu)) Wd, gate_up[l] packed [H, 2I]
// ([gate | up] columns), down[l] packed [I, H], for local expert l. Runs on ot::gemm::grouped_gemm.
ExpertFn swiglu_experts(std::vector<const gemm::PackedB*> gate_up, std::vector<const gemm::PackedB*> down);

// The MoE layer's expert FFN (ot::moe::moe_expert_ffn) on a prepacked store holding this rank's
// local experts in placement order (store expert l = local expert l). The store must outlive the
// returned function. int8 rows go into the grouped GEMM as they are (its int8 A operand).
ExpertFn moe_experts(const moe::MoeExperts& local);
// Same on a quantised store (ot/moe/quant_experts.h). A W8A8 store takes the quant_int8 rows as its
// int8 activations, codes and scales as they arrived (no float round trip); the other stores take
// float rows (int8 rows are then an error naming x).
ExpertFn moe_experts(const moe::QuantMoeExperts& local);

// Groups of a DispatchResult as an ExpertBatch (all rows, one group per local expert).
ExpertBatch batch_of(const DispatchResult& d, const TensorView& y);

struct FfnOptions {
  DispatchOptions dispatch;
  int chunks = 2;  // token chunks; chunk i's communication overlaps chunk i-1's compute
  // Const experts' parameters (dispatch.const_expert_num > 0); x itself is the copy/const input.
  TensorView const_expert_alpha_1, const_expert_alpha_2, const_expert_v;
};

// Pipelined dispatch -> local experts -> combine. Returns [BS, H] in x's dtype (+ shared_expert_x).
Tensor ep_moe_ffn(Comm& comm, const TensorView& x, const TensorView& expert_ids, const TensorView& expert_scales,
                  const ExpertFn& experts, const FfnOptions& opt, const TensorView& shared_expert_x = {});

// ---- Plain single-process reference (tests): what rank q receives, given every rank's inputs ----
namespace ref {
struct RankInput { TensorView x, expert_ids, expert_scales; };
struct RankExpand {
  Tensor expand_x;                   // [A, H] same dtype as x (or int8 when quant)
  Tensor dynamic_scales;             // [A] when quant
  std::vector<int32_t> assist;       // 3 per row
  std::vector<int64_t> tokens_per_expert;  // [L] counts
};
// smooth_scales: as DispatchOptions::smooth_scales (routed expert e uses row e + shared_expert_num).
RankExpand dispatch(const std::vector<RankInput>& ranks, const Placement& p, int q, bool quant_int8,
                    const TensorView& smooth_scales = {}, int shared_expert_num = 0);
// Combine on rank r from the expert outputs of every rank (expand order as returned by dispatch):
// x_out[t] = sum over k (in k order) of scale * Y(t, k), in fp32, cast to `out`'s dtype.
void combine(const std::vector<RankInput>& ranks, const Placement& p, const std::vector<TensorView>& expert_out, int r,
             const TensorView& out);
}  // namespace ref

}  // namespace ot::ep
