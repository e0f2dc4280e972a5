// The communicator wrapper, its buffer and tensor pools, the peer exchange and row helpers.
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "ot/numeric.h"
#include "ot/parallel.h"
#include "ot/quant.h"
#include "src/ep/internal.h"

namespace ot::ep {

const char* dispatcher_name(Dispatcher d) { return d == Dispatcher::all_to_all ? "all_to_all" : "all_gather"; }

std::unique_ptr<Buffer> BufferPool::acquire(size_t bytes) {
  // Smallest free buffer that fits, else grow the largest one (keeps the pool small).
  size_t best = free_.size();
  for (size_t i = 0; i < free_.size(); ++i)
    if (free_[i]->cap >= bytes && (best == free_.size() || free_[i]->cap < free_[best]->cap)) best = i;
  std::unique_ptr<Buffer> b;
  if (best < free_.size()) {
    b = std::move(free_[best]);
    free_.erase(free_.begin() + std::ptrdiff_t(best));
    return b;
  }
  if (!free_.empty()) {
    b = std::move(free_.back());
    free_.pop_back();
  } else {
    b = std::make_unique<Buffer>();
  }
  b->mem = make_aligned<char>(bytes);
  b->cap = bytes;
  return b;
}

void BufferPool::release(std::unique_ptr<Buffer> b) {
  if (b) free_.push_back(std::move(b));
}

MPI_Datatype Comm::Impl::row_type(int64_t bytes) {
  auto it = row_types.find(bytes);
  if (it != row_types.end()) return it->second;
  MPI_Datatype t;
  MPI_Type_contiguous(checked_int(bytes, "ep", "row bytes"), MPI_BYTE, &t);
  MPI_Type_commit(&t);
  row_types[bytes] = t;
  return t;
}

void Comm::Impl::untrack(MPI_Request* r) { inflight.erase(std::remove(inflight.begin(), inflight.end(), r), inflight.end()); }

// This process's share of its node's cores: the cores it may run on, divided among the ranks of
// the node communicator whose CPU sets overlap its own (ranks bound to disjoint cores keep theirs).
static int node_core_share(MPI_Comm node) {
  cpu_set_t mine;
  CPU_ZERO(&mine);
  if (sched_getaffinity(0, sizeof(mine), &mine) != 0) return 1;
  int n = 1;
  MPI_Comm_size(node, &n);
  std::vector<cpu_set_t> all(static_cast<size_t>(n));
  MPI_Allgather(&mine, int(sizeof(mine)), MPI_BYTE, all.data(), int(sizeof(mine)), MPI_BYTE, node);
  int sharing = 0;
  for (cpu_set_t& s : all) {
    cpu_set_t both;
    CPU_AND(&both, &s, &mine);
    sharing += CPU_COUNT(&both) > 0;
  }
  return std::max(1, CPU_COUNT(&mine) / std::max(1, sharing));
}

// Whether ot's thread count was chosen (environment, or set to something other than its default,
// which is the process's CPU count when neither variable is set).
static bool threads_chosen() {
  for (const char* v : {"OT_NUM_THREADS", "OMP_NUM_THREADS"})
    if (const char* s = std::getenv(v); s && std::atoi(s) > 0) return true;
  cpu_set_t mine;
  CPU_ZERO(&mine);
  if (sched_getaffinity(0, sizeof(mine), &mine) != 0) return true;
  return ot::num_threads() != CPU_COUNT(&mine);
}

Comm::Comm(MPI_Comm comm, int64_t num_experts, const CommOptions& opt) : comm_(comm), impl_(std::make_unique<Impl>()) {
  int init = 0;
  MPI_Initialized(&init);
  OT_CHECK(init, "ep::Comm", "MPI", "MPI_Init called before creating the communicator", "not initialised");
  OT_CHECK(opt.threads >= -1, "ep::Comm", "CommOptions::threads", "-1 (share the node's cores), 0 (leave) or > 0", opt.threads);
  OT_CHECK(opt.shared_expert_ranks >= 0, "ep::Comm", "CommOptions::shared_expert_ranks", ">= 0", opt.shared_expert_ranks);
  MPI_Comm_size(comm_, &world_);
  MPI_Comm_rank(comm_, &rank_);
  // Before any collective: bad arguments throw on every rank alike, holding nothing.
  placement_ = opt.shared_expert_ranks > 0 ? Placement::shared_ranks(num_experts, world_, opt.shared_expert_ranks)
                                           : Placement::contiguous(num_experts, world_);
  MPI_Comm_dup(comm_, &impl_->wire);
  MPI_Comm_split_type(impl_->wire, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &impl_->node);
  MPI_Comm_size(impl_->node, &node_size_);
  node_threads_ = node_core_share(impl_->node);
  if (opt.threads > 0) ot::set_num_threads(opt.threads);
  else if (opt.threads == -1 && !threads_chosen()) ot::set_num_threads(node_threads_);
  impl_->timeout_s = opt.timeout_s;
  if (const char* t = std::getenv("OT_EP_TIMEOUT_S"); t && *t) impl_->timeout_s = std::atof(t);
  const char* env = std::getenv("OT_EP_NODE_WINDOW");
  impl_->window.init(impl_->wire, impl_->node, opt.node_window && !(env && std::string(env) == "0"));
}

Comm::~Comm() {
  int fin = 0;
  MPI_Finalized(&fin);
  if (fin) return;
  for (auto& [b, t] : impl_->row_types) MPI_Type_free(&t);
  impl_->window.free();
  MPI_Comm_free(&impl_->node);
  MPI_Comm_free(&impl_->wire);
}

bool Comm::node_window() const { return impl_->window.enabled(); }
int64_t Comm::window_sends() const { return impl_->window.claims(); }

void Comm::set_placement(Placement p) {
  OT_CHECK(p.world_size() == world_, "ep::Comm::set_placement", "placement", "a placement over the communicator's ranks", p.world_size());
  placement_ = std::move(p);
}

void Comm::progress() {
  for (MPI_Request* r : impl_->inflight) {
    int flag = 0;
    if (*r != MPI_REQUEST_NULL) MPI_Test(r, &flag, MPI_STATUS_IGNORE);
  }
  for (PeerExchange* e : std::vector<PeerExchange*>(impl_->exchanges)) e->test();
}

Tensor TensorPool::get(DType t, const std::vector<int64_t>& shape) {
  TensorView v(nullptr, t, shape);
  const size_t need = (std::max<size_t>(v.nbytes(), 1) + 63) & ~size_t(63);
  Block* best = nullptr;
  Block* free_small = nullptr;
  for (Block& b : blocks_) {
    if (b.mem.use_count() != 1) continue;  // still referred to by a caller's tensor
    if (b.cap >= need && (!best || b.cap < best->cap)) best = &b;
    if (b.cap < need && (!free_small || b.cap < free_small->cap)) free_small = &b;
  }
  if (!best) {
    Block nb{std::shared_ptr<void>(aligned_alloc64(need + need / 8), aligned_free), need + need / 8};
    if (free_small) *free_small = std::move(nb), best = free_small;  // a free block too small: replace it
    else if (blocks_.size() < 16) blocks_.push_back(std::move(nb)), best = &blocks_.back();
    else return Tensor::empty(t, shape);
  }
  v.data = best->mem.get();
  return Tensor::from_storage(best->mem, v);
}

void PeerExchange::start(Comm& comm, int tag, const char* sendbuf, const std::vector<size_t>& off, const std::vector<size_t>& len) {
  comm_ = &comm;
  tag_ = tag;
  W_ = comm.ep_world_size();
  me_ = comm.ep_rank_id();
  req_.assign(size_t(2 * W_), MPI_REQUEST_NULL);
  posted_.assign(size_t(W_), 0);
  posted_[size_t(me_)] = 1;
  in_.clear();
  in_.resize(size_t(W_));
  in_size_.assign(size_t(W_), 0);
  MPI_Comm c = comm.impl().wire;
  for (int q = 0; q < W_; ++q)
    if (q != me_)
      MPI_Isend(sendbuf + off[size_t(q)], checked_int(int64_t(len[size_t(q)]), "ep", "message bytes"), MPI_BYTE, q, tag, c,
                &req_[size_t(q)]);
  active_ = true;
  comm.impl().exchanges.push_back(this);
  post_arrived(false);
}

// Exchanges on the same tag may be in flight together (pipelined combines): per source, messages
// must be matched in the order the exchanges were started, so each exchange probes a source only
// once every earlier one has posted its receive from it. Each probe posts the receive at once.
bool PeerExchange::post_arrived(bool block) {
  std::vector<char> blocked(size_t(W_), 0);
  for (PeerExchange* e : comm_->impl().exchanges) {
    if (e->tag_ != tag_) continue;
    e->probe(block, blocked);
    if (e == this) break;
  }
  return std::all_of(posted_.begin(), posted_.end(), [](char p) { return p != 0; });
}

void PeerExchange::probe(bool block, std::vector<char>& blocked) {
  MPI_Comm c = comm_->impl().wire;
  for (int r = 0; r < W_; ++r) {
    if (posted_[size_t(r)] || blocked[size_t(r)]) continue;
    MPI_Message msg;
    MPI_Status status;
    int flag = 1;
    if (block) MPI_Mprobe(r, tag_, c, &msg, &status);
    else MPI_Improbe(r, tag_, c, &flag, &msg, &status);
    if (!flag) continue;
    int n = 0;
    MPI_Get_count(&status, MPI_BYTE, &n);
    in_size_[size_t(r)] = size_t(n);
    in_[size_t(r)] = PooledBuffer(comm_->impl().pool, std::max<size_t>(size_t(n), 64));
    MPI_Imrecv(in_[size_t(r)].data(), n, MPI_BYTE, &msg, &req_[size_t(W_ + r)]);
    posted_[size_t(r)] = 1;
  }
  for (int r = 0; r < W_; ++r)
    if (!posted_[size_t(r)]) blocked[size_t(r)] = 1;
}

bool PeerExchange::test() {
  if (!active_) return true;
  if (!post_arrived(false)) return false;
  int flag = 0;
  MPI_Testall(int(req_.size()), req_.data(), &flag, MPI_STATUSES_IGNORE);
  return flag != 0;
}

void PeerExchange::wait() {
  if (!active_) return;
  const double limit = comm_->impl().timeout_s;
  if (!comm_->impl().broken.empty()) abandon(0);  // an exchange before this one timed out: do not wait again
  if (limit <= 0) {
    post_arrived(true);
    MPI_Waitall(int(req_.size()), req_.data(), MPI_STATUSES_IGNORE);
  } else {  // poll as MPI_Waitall does, looking at the clock every 64 rounds
    const auto t0 = std::chrono::steady_clock::now();
    for (unsigned spin = 1; !test(); ++spin) {
      if (spin % 64) continue;
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (waited > limit) abandon(waited);
      sched_yield();  // ranks may share cores
    }
  }
  finish();
}

void PeerExchange::finish() {
  active_ = false;
  auto& ex = comm_->impl().exchanges;
  ex.erase(std::remove(ex.begin(), ex.end(), this), ex.end());
}

void PeerExchange::abandon(double waited_s) {
  std::string missing;
  for (int r = 0; r < W_; ++r)
    if (r != me_ && (!posted_[size_t(r)] || req_[size_t(W_ + r)] != MPI_REQUEST_NULL))
      missing += detail::cat(missing.empty() ? "" : ", ", "rank ", r);
  // MPI keeps the transfers it has started; their receive buffers stay alive with the Comm.
  for (MPI_Request& q : req_)
    if (q != MPI_REQUEST_NULL) MPI_Request_free(&q);
  Comm::Impl& im = comm_->impl();
  for (PooledBuffer& b : in_) im.abandoned.push_back(std::move(b));
  finish();
  const char* op = tag_op(tag_);
  if (im.broken.empty()) im.broken = detail::cat(op, " waited ", waited_s, " s for ", missing);
  throw Error(op, "peer", "a message from every rank within CommOptions::timeout_s",
              detail::cat("nothing from ", missing, " after ", waited_s, " s"));
}

const char* tag_op(int tag) { return tag == kTagDispatch ? "moe_distribute_dispatch" : "moe_distribute_combine"; }

void wait_row_collective(Comm& comm, MPI_Request* req, std::shared_ptr<void> keep, const char* op) {
  Comm::Impl& im = comm.impl();
  const double limit = im.timeout_s;
  if (*req == MPI_REQUEST_NULL || (limit <= 0 && im.broken.empty())) {  // done (progress() may finish it), or unbounded
    MPI_Wait(req, MPI_STATUS_IGNORE);
    im.untrack(req);
    return;
  }
  double waited = 0;
  if (im.broken.empty()) {  // poll as MPI_Wait does, looking at the clock every 64 rounds
    const auto t0 = std::chrono::steady_clock::now();
    for (unsigned spin = 1;; ++spin) {
      int flag = 0;
      MPI_Test(req, &flag, MPI_STATUS_IGNORE);
      if (flag) {
        im.untrack(req);
        return;
      }
      if (spin % 64) continue;
      waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (waited > limit) break;
      sched_yield();  // ranks may share cores
    }
  }
  im.untrack(req);
  static auto* left_to_mpi = new std::vector<std::shared_ptr<void>>;  // never freed: MPI may still write these buffers
  left_to_mpi->push_back(std::move(keep));
  if (im.broken.empty()) im.broken = detail::cat(op, " waited ", waited, " s in a row collective");
  throw Error(op, "peer", "every rank in the row collective within CommOptions::timeout_s",
              detail::cat("the collective still incomplete after ", waited,
                          " s: a rank did not enter it (it rejected a record, or stopped); ", im.broken));
}

void check_not_broken(Comm& comm, const char* op) {
  OT_CHECK(comm.impl().broken.empty(), op, "comm", "a communicator whose exchanges all completed (none timed out)", comm.impl().broken);
}

void PeerExchange::release() {
  for (auto& b : in_) b.reset();
}

PeerExchange::~PeerExchange() {
  if (!active_) return;
  try {
    wait();
  } catch (const Error&) {  // timed out: abandoned, the Comm says so
  }
}

void load_row_f32(const void* src, DType t, int64_t n, float* dst) {
  if (t == DType::f32) std::memcpy(dst, src, size_t(n) * 4);
  else convert_to_f32(src, t, dst, n);
}

float quantize_row_int8(const void* src, DType t, int64_t n, int8_t* dst, const float* smooth) {
  thread_local std::vector<float> tmp;  // per row in the packing loops: grows once per thread
  const float* v;
  if (t == DType::f32 && !smooth) {
    v = static_cast<const float*>(src);
  } else {
    if (tmp.size() < size_t(n)) tmp.resize(size_t(n));
    load_row_f32(src, t, n, tmp.data());
    if (smooth)  // spec 9.2: xs = fp32(x) * scales[e], quantised per (token, expert)
      for (int64_t i = 0; i < n; ++i) tmp[size_t(i)] *= smooth[i];
    v = tmp.data();
  }
  return quantize_row_i8_dynamic(v, n, dst);  // ot/quant.h: the NaN / Inf rule
}

}  // namespace ot::ep
