// Internal pieces shared by the expert-parallel files: buffers, the node window, the peer exchange,
// the dispatch state that combine needs, and the wire format of a dispatched row (records and
// message layout: records.h).
#pragma once
#include <mpi.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ot/ep.h"
#include "ot/error.h"
#include "ot/workspace.h"
#include "src/ep/records.h"

namespace ot::ep {

// A reusable 64-byte-aligned byte buffer; pooled by the Comm so steady-state calls do not allocate.
struct Buffer {
  AlignedPtr<char> mem;
  size_t cap = 0;
  char* data() const { return mem.get(); }
};
class BufferPool {
 public:
  std::unique_ptr<Buffer> acquire(size_t bytes);
  void release(std::unique_ptr<Buffer> b);

 private:
  std::vector<std::unique_ptr<Buffer>> free_;
};
// A buffer borrowed from a pool and returned when it goes out of scope.
class PooledBuffer {
 public:
  PooledBuffer() = default;
  PooledBuffer(std::shared_ptr<BufferPool> pool, size_t bytes) : pool_(std::move(pool)), buf_(pool_->acquire(bytes)) {}
  PooledBuffer(PooledBuffer&&) noexcept = default;
  PooledBuffer& operator=(PooledBuffer&& o) noexcept {
    reset();
    pool_ = std::move(o.pool_);
    buf_ = std::move(o.buf_);
    return *this;
  }
  ~PooledBuffer() { reset(); }
  char* data() const { return buf_ ? buf_->data() : nullptr; }
  void reset() {
    if (pool_ && buf_) pool_->release(std::move(buf_));
    buf_.reset();
  }

 private:
  std::shared_ptr<BufferPool> pool_;
  std::unique_ptr<Buffer> buf_;
};

// Output tensors over reusable storage: a block is handed out again once every Tensor referring to
// it has been dropped (only the pool holds it), so steady-state calls allocate (and page-fault)
// nothing for expand_x, the expert outputs or x_out.
class TensorPool {
 public:
  Tensor get(DType t, const std::vector<int64_t>& shape);

 private:
  struct Block { std::shared_ptr<void> mem; size_t cap = 0; };
  std::vector<Block> blocks_;
};

class PeerExchange;

// ---- Node window: the ranks of a Comm that share a node exchange rows through an MPI-3
// shared-memory window (MPI_Win_allocate_shared, as DeepEP's intranode kernels use NVLink buffers).
// Dispatch: the sender writes each token once into its own slot and every on-node receiver reads
// the rows it needs in place (pull). Combine: the expert rank writes each partial row straight into
// the source rank's slot (push). Messages carry only the records, which say so; readers free the
// slots. One copy per row instead of pack + MPI transfer, and dispatch packs a token once, not once
// per destination rank. Each (receiver,
// source, kind) slot has one writer (the source) and one reader; a slot that is still busy (calls
// in flight) or too small makes that message carry its rows instead, so the window is an
// optimisation that never changes results. Ranks on other nodes always use messages.
enum class SlotKind { dispatch = 0, combine = 1 };
class NodeWindow {
 public:
  NodeWindow() = default;
  NodeWindow(const NodeWindow&) = delete;
  NodeWindow& operator=(const NodeWindow&) = delete;
  void init(MPI_Comm wire, MPI_Comm node, bool enabled);  // collective over wire
  void free();                                            // collective over the node
  bool enabled() const { return enabled_; }
  size_t capacity() const { return gens_.empty() ? 0 : gens_.back().cap; }
  void publish() const;  // after writing into claimed slots, before the records go out
  int64_t claims() const { return claims_; }
  // Sender: the slot (receiver q, this rank, kind) of the newest window when q is on this node,
  // free, and at least `bytes` large: marks it busy and returns it (gen: its window, for the
  // record); else null.
  char* claim(int q, SlotKind k, size_t bytes, int64_t* gen);
  // Receiver: the rows source r put in this rank's slot of window gen; release() frees the slot.
  const char* slot(int r, SlotKind k, int64_t gen) const;
  void release(int r, SlotKind k, int64_t gen);
  // Dispatch (pull): this rank's own slot of kind k, which several on-node readers (wire ranks)
  // read in place; free once every reader of its last rows has released it. Claiming marks it
  // unread by `readers`. Readers use peer_own / release_peer.
  char* claim_own(SlotKind k, size_t bytes, const std::vector<int>& readers, int64_t* gen);
  const char* peer_own(int r, SlotKind k, int64_t gen) const;
  void release_peer(int r, SlotKind k, int64_t gen);
  bool on_node(int q) const { return enabled_ && node_rank_[size_t(q)] >= 0; }
  // Collective over the wire communicator (every rank, same `need`): a window whose slots hold
  // `need` bytes when the newest is smaller. Older windows are freed once every slot is idle.
  void reserve(size_t need);

 private:
  struct Gen { MPI_Win win = MPI_WIN_NULL; std::vector<char*> seg; size_t cap = 0; };
  std::vector<Gen> gens_;
  std::vector<int> node_rank_;  // [W] node rank of each wire rank, -1 on other nodes
  MPI_Comm node_ = MPI_COMM_NULL;
  int n_ = 1, me_ = 0;
  bool enabled_ = false;
  int64_t claims_ = 0;
  size_t header() const;
  int* state(const Gen& g, int receiver, SlotKind k, int src) const;
  char* data(const Gen& g, int receiver, SlotKind k, int src) const;
};

struct Comm::Impl {
  MPI_Comm wire = MPI_COMM_NULL;  // a private duplicate of the caller's communicator (our tags only)
  MPI_Comm node = MPI_COMM_NULL;  // the ranks of `wire` on this node (MPI_COMM_TYPE_SHARED)
  NodeWindow window;
  std::shared_ptr<BufferPool> pool = std::make_shared<BufferPool>();
  TensorPool tensors;
  std::map<int64_t, MPI_Datatype> row_types;  // contiguous byte rows, by size
  std::vector<MPI_Request*> inflight;         // advanced by progress()
  std::vector<PeerExchange*> exchanges;       // likewise
  double timeout_s = 0;                       // CommOptions::timeout_s (<= 0: none)
  std::string broken;                         // set when an exchange timed out: what happened
  std::vector<PooledBuffer> abandoned;        // receive buffers of timed-out exchanges (MPI may still write)
  MPI_Datatype row_type(int64_t bytes);
  void track(MPI_Request* r) { inflight.push_back(r); }
  void untrack(MPI_Request* r);
};

// One message to and one from every other rank, of sizes the receiver need not know: each incoming
// message is matched by probing its source (exchanges in the order they started, so concurrent or
// back-to-back calls cannot cross), then received into a pooled buffer. One round: all sends are
// posted at once.
class PeerExchange {
 public:
  PeerExchange() = default;
  PeerExchange(const PeerExchange&) = delete;
  PeerExchange& operator=(const PeerExchange&) = delete;
  ~PeerExchange();  // never abandons a posted transfer
  // Message to rank q: len[q] bytes at sendbuf + off[q] (q != me; the buffer must outlive the wait).
  void start(Comm& comm, int tag, const char* sendbuf, const std::vector<size_t>& off, const std::vector<size_t>& len);
  bool test();  // posts the receives of messages that have arrived; true when all have completed
  // Waits for every message; past the Comm's timeout, abandons the exchange (the Comm becomes
  // broken) and throws an ot::Error of op naming "peer" and the ranks not heard from.
  void wait();
  int world() const { return W_; }
  const char* data(int r) const { return in_[size_t(r)].data(); }
  size_t size(int r) const { return in_size_[size_t(r)]; }
  void release();  // drops the received buffers

 private:
  Comm* comm_ = nullptr;
  int tag_ = 0, W_ = 1, me_ = 0;
  bool active_ = false;
  std::vector<MPI_Request> req_;  // [W] sends, then [W] receives
  std::vector<char> posted_;      // receive of rank r posted
  std::vector<PooledBuffer> in_;
  std::vector<size_t> in_size_;
  bool post_arrived(bool block);
  void probe(bool block, std::vector<char>& blocked);
  void finish();
  [[noreturn]] void abandon(double waited_s);
};
// The op an exchange on this tag belongs to (for its errors).
const char* tag_op(int tag);
// Throws (op, "comm") when an earlier exchange of comm timed out.
void check_not_broken(Comm& comm, const char* op);
// Waits for a row collective's request (MPI_Ialltoallv / Iallgatherv / Ireduce_scatter, tracked)
// within CommOptions::timeout_s, as PeerExchange::wait does for messages. A nonblocking
// collective's request can be neither freed nor cancelled, so past the bound (or at once on a Comm
// an earlier timeout broke) the transfer is left to MPI: `keep` (the state owning the request and
// its buffers) lives on for the rest of the process, the Comm becomes broken, and an ot::Error of
// op naming "peer" is thrown.
void wait_row_collective(Comm& comm, MPI_Request* req, std::shared_ptr<void> keep, const char* op);
constexpr int kTagDispatch = 0x5e01, kTagCombine = 0x5e02;

// ---- Wire format of one dispatched row: header, then H values (x dtype, or int8 when quantised).
// Header: int32 token, float row scale (quant), int32 ids[K] (-1: slot not for this rank), float w[K].
struct RowFormat {
  int64_t K = 0, H = 0;
  size_t elem = 0;    // bytes per value on the wire
  size_t header = 0;  // bytes, 16-aligned
  size_t stride = 0;  // bytes per row, 16-aligned
  RowFormat(int64_t k, int64_t h, size_t e) : K(k), H(h), elem(e) {
    header = (8 + 8 * size_t(K) + 15) & ~size_t(15);
    stride = (header + size_t(H) * elem + 15) & ~size_t(15);
  }
  static int32_t& token(char* row) { return *reinterpret_cast<int32_t*>(row); }
  static float& qscale(char* row) { return *reinterpret_cast<float*>(row + 4); }
  static int32_t* ids(char* row) { return reinterpret_cast<int32_t*>(row + 8); }
  float* w(char* row) const { return reinterpret_cast<float*>(row + 8 + 4 * K); }
  char* payload(char* row) const { return row + header; }
};

// Dynamic int8 of one row: xs = x (* smooth, per column, when given), then
// quantize_row_i8_dynamic (ot/quant.h: d = max|xs| / 127, q = round_half_even(xs / d); a NaN or
// Inf row gives d = NaN, q = 0); returns d.
// Bytes of one expand_x row: H int8 values (their scale is in dynamic_scales) or H of x's dtype.
inline size_t expand_row_bytes(int64_t H, DType t, bool quant_int8) { return size_t(H) * (quant_int8 ? 1 : dtype_size(t)); }
float quantize_row_int8(const void* src, DType t, int64_t n, int8_t* dst, const float* smooth = nullptr);
// Copies one row, converting to f32 when needed (combine sums).
void load_row_f32(const void* src, DType t, int64_t n, float* dst);

// Everything combine needs from dispatch, plus what is in flight during the split form.
struct DispatchState {
  Comm* comm = nullptr;
  int W = 1, me = 0;
  int64_t BS = 0, K = 0, H = 0, E = 0, L = 0, A = 0;
  DType dtype = DType::f32;
  DispatchOptions opt;
  // Sender side.
  std::vector<int32_t> slot_dest;   // [BS*K] destination rank of each slot
  std::vector<float> scales;        // [BS*K]
  std::vector<int64_t> send_rows;   // [W] deduplicated rows to each rank (0 to self)
  std::vector<int32_t> token_pos;   // [BS*W] position of token t among the rows sent to q, or -1
  std::vector<int64_t> slot_ret;    // [BS*K] per-slot combine: position among rows back from q; self: expand row
  std::vector<int64_t> slots_to;    // [W] slots sent to each rank
  std::vector<int64_t> self_j;      // [BS] index into recv of this token's own-rank entry, or -1
  // Receiver side: one entry per (received token, local slot), grouped by received token j.
  struct Recv { int32_t src = 0, tok = 0; int64_t ret = -1; };  // ret: row in the combine send block, -1 self
  std::vector<Recv> recv;
  std::vector<int64_t> ent_begin{0};
  std::vector<int64_t> ent_row;     // expand row
  std::vector<float> ent_w;
  std::vector<int64_t> recv_rows;   // [W] deduplicated rows received from each rank
  std::vector<int64_t> recv_slots;  // [W] slots received from each rank
  std::vector<int64_t> block;       // [L*W] start row of block (l, r); block[l*W+r]
  std::vector<int64_t> fill;        // [L*W] rows placed so far in each block
  std::vector<int64_t> all_bs;      // [W] tokens on each rank (all_gather)
  std::vector<int64_t> all_rows;    // [W] rows each rank contributes to the gather (all_gather)
  std::vector<uint8_t> token_active;  // [BS] 1-D x_active_mask (empty: all active)
  std::vector<PendingDispatch::Block> local_blocks;
  // In flight.
  std::vector<int32_t> special;     // [BS*K] zero/copy/const expert index (e - E) of a slot, or -1 (empty: none)
  RowFormat fmt{0, 0, 0};
  std::unique_ptr<PeerExchange> ex;  // the records (and, one-round form, the rows)
  PooledBuffer msgbuf, sendbuf, recvbuf;
  std::vector<const char*> rows_from;  // [W] first received row from each rank
  std::vector<char> pulled;            // [W] rows_from[r] is r's own window slot: every token of r, filter by destination
  std::vector<int> scount, sdispl, rcount, rdispl;
  MPI_Request req = MPI_REQUEST_NULL;
  // Node-window slots this rank reads (source's own slot, window); freed after the fan-out (or
  // when the state dies: a call that threw).
  std::vector<std::pair<int, int64_t>> held;
  size_t window_need = 0;  // one-round form: slot bytes the ranks need; the window grows after the call
  ~DispatchState();
  bool planned = false;   // receive layout known (from the agreement round)
  bool received = false;  // finish_receive ran: combine may use this state
  int64_t bytes_sent = 0;
  TensorView x_view, ids_view;  // the caller's inputs, until the own rows are placed
  void plan(const std::vector<int64_t>& cnt, DispatchResult& res);
  void place_local(DispatchResult& res);
  void finish_receive(DispatchResult& res);  // fan out the received rows (after the transfer)
  // What is wrong with the received rows (empty: nothing): a token outside its sender's batch, an
  // expert id that is not this rank's, or slots per (local expert, source) other than cnt's.
  std::string check_received_rows() const;
  std::vector<int64_t> cnt;  // [L*W] slots per (local expert l, source r), from the records
  const float* smooth_row(int l) const;
};

// Access to the pending handles' internals for the implementation files.
struct PendingAccess {
  static DispatchResult& res(PendingDispatch& p) { return p.res_; }
  static bool& done(PendingDispatch& p) { return p.done_; }
  static std::shared_ptr<PendingCombine::State>& state(PendingCombine& p) { return p.st_; }
  static int64_t& bytes(PendingCombine& p) { return p.bytes_sent_; }
};

// Internal dispatch entry (tag: a value every rank must agree on, e.g. ep_moe_ffn's chunk count).
// split: the non-blocking form (layout exchanged up front, own rows placed at once).
PendingDispatch dispatch_start_tagged(Comm& comm, const TensorView& x, const TensorView& ids, const TensorView& w,
                                      const DispatchOptions& opt, int64_t tag, bool split);

// Combine start; experts_failed makes every rank throw (a rank's local expert compute failed).
PendingCombine combine_start_impl(Comm& comm, const TensorView& y, const DispatchResult& dr, const CombineInputs& in, bool experts_failed);

// Fault injection for the tests: when set, called on each one-round dispatch message this rank
// sends, after packing ([record][rows], `bytes` in all), so a test can play a peer that sends
// malformed messages. Never set by the library.
using DispatchWireTamper = void (*)(int dest, char* msg, size_t bytes, const RowFormat& fmt);
extern DispatchWireTamper dispatch_wire_tamper;

inline int checked_int(int64_t v, const char* op, const char* what) {
  OT_CHECK(v >= 0 && v <= INT32_MAX, op, what, "a count that fits MPI's int", v);
  return int(v);
}

}  // namespace ot::ep
