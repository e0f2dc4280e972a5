// The node window (see internal.h): MPI-3 shared memory between the ranks of one node.
// Segment of rank q: state words [kind][rank], one cache line each, then slots [kind][rank] of `cap`
// bytes. Push (combine): slot [k][s] of q holds rows from source s for q; its state word is 1 until
// q has read them. Pull (dispatch): slot [k][q] of q is q's own, read by several ranks; state word
// [k][s] of q is 1 until reader s has read it. Each word is set only by the writer (claim) and
// cleared only by its reader (release), so no lock is needed; the rows are published by the record
// message that follows them (MPI_Win_sync + the message's ordering).
#include <algorithm>

#include "src/ep/internal.h"

namespace ot::ep {

namespace {
constexpr size_t kLine = 64, kAlign = 4096;
size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }
}  // namespace

void NodeWindow::init(MPI_Comm wire, MPI_Comm node, bool enabled) {
  node_ = node;
  MPI_Comm_size(node, &n_);
  MPI_Comm_rank(node, &me_);
  int W = 1;
  MPI_Comm_size(wire, &W);
  // Wire rank -> node rank: translate through the groups.
  MPI_Group gw, gn;
  MPI_Comm_group(wire, &gw);
  MPI_Comm_group(node, &gn);
  std::vector<int> all(static_cast<size_t>(W));
  for (int r = 0; r < W; ++r) all[size_t(r)] = r;
  node_rank_.assign(size_t(W), MPI_UNDEFINED);
  MPI_Group_translate_ranks(gw, W, all.data(), gn, node_rank_.data());
  MPI_Group_free(&gw);
  MPI_Group_free(&gn);
  for (int& r : node_rank_)
    if (r == MPI_UNDEFINED) r = -1;
  // Every rank must agree (reserve is collective): on only when every rank asks for it.
  int on = enabled && n_ > 1, all_on = 0;
  MPI_Allreduce(&on, &all_on, 1, MPI_INT, MPI_MIN, wire);
  enabled_ = all_on != 0;
}

size_t NodeWindow::header() const { return round_up(2 * size_t(n_) * kLine, kAlign); }

int* NodeWindow::state(const Gen& g, int receiver, SlotKind k, int src) const {
  return reinterpret_cast<int*>(g.seg[size_t(receiver)] + (size_t(k) * size_t(n_) + size_t(src)) * kLine);
}
char* NodeWindow::data(const Gen& g, int receiver, SlotKind k, int src) const {
  return g.seg[size_t(receiver)] + header() + (size_t(k) * size_t(n_) + size_t(src)) * g.cap;
}

char* NodeWindow::claim(int q, SlotKind k, size_t bytes, int64_t* gen) {
  if (!enabled_ || gens_.empty() || bytes > gens_.back().cap) return nullptr;
  const int nq = node_rank_[size_t(q)];
  if (nq < 0 || nq == me_) return nullptr;
  const Gen& g = gens_.back();
  int* st = state(g, nq, k, me_);
  if (__atomic_load_n(st, __ATOMIC_ACQUIRE) != 0) return nullptr;  // the receiver has not read the last rows
  __atomic_store_n(st, 1, __ATOMIC_RELAXED);
  *gen = int64_t(gens_.size()) - 1;
  ++claims_;
  return data(g, nq, k, me_);
}

const char* NodeWindow::slot(int r, SlotKind k, int64_t gen) const {
  const Gen& g = gens_.at(size_t(gen));
  MPI_Win_sync(g.win);  // the rows were published before the record arrived
  __atomic_thread_fence(__ATOMIC_ACQUIRE);
  return data(g, me_, k, node_rank_[size_t(r)]);
}

char* NodeWindow::claim_own(SlotKind k, size_t bytes, const std::vector<int>& readers, int64_t* gen) {
  if (!enabled_ || gens_.empty() || bytes > gens_.back().cap || readers.empty()) return nullptr;
  const Gen& g = gens_.back();
  for (int s = 0; s < n_; ++s)
    if (__atomic_load_n(state(g, me_, k, s), __ATOMIC_ACQUIRE) != 0) return nullptr;  // a reader is not done
  for (int q : readers) __atomic_store_n(state(g, me_, k, node_rank_[size_t(q)]), 1, __ATOMIC_RELAXED);
  *gen = int64_t(gens_.size()) - 1;
  claims_ += int64_t(readers.size());
  return data(g, me_, k, me_);
}

const char* NodeWindow::peer_own(int r, SlotKind k, int64_t gen) const {
  const Gen& g = gens_.at(size_t(gen));
  MPI_Win_sync(g.win);
  __atomic_thread_fence(__ATOMIC_ACQUIRE);
  const int nr = node_rank_[size_t(r)];
  return data(g, nr, k, nr);
}

void NodeWindow::release_peer(int r, SlotKind k, int64_t gen) {
  const Gen& g = gens_.at(size_t(gen));
  __atomic_store_n(state(g, node_rank_[size_t(r)], k, me_), 0, __ATOMIC_RELEASE);
}

void NodeWindow::publish() const {
  __atomic_thread_fence(__ATOMIC_RELEASE);
  if (!gens_.empty()) MPI_Win_sync(gens_.back().win);
}

void NodeWindow::release(int r, SlotKind k, int64_t gen) {
  const Gen& g = gens_.at(size_t(gen));
  __atomic_store_n(state(g, me_, k, node_rank_[size_t(r)]), 0, __ATOMIC_RELEASE);
}

void NodeWindow::reserve(size_t need) {
  if (!enabled_ || need <= capacity()) return;
  Gen g;
  g.cap = round_up(need + need / 4, kAlign);  // headroom: a batch a little larger reuses it
  const size_t bytes = header() + 2 * size_t(n_) * g.cap;
  MPI_Info info;
  MPI_Info_create(&info);
  MPI_Info_set(info, "alloc_shared_noncontig", "true");
  char* base = nullptr;
  MPI_Win_allocate_shared(MPI_Aint(bytes), 1, info, node_, &base, &g.win);
  MPI_Info_free(&info);
  g.seg.resize(size_t(n_));
  for (int r = 0; r < n_; ++r) {
    MPI_Aint size = 0;
    int unit = 0;
    MPI_Win_shared_query(g.win, r, &size, &unit, &g.seg[size_t(r)]);
  }
  std::fill(base, base + header(), 0);  // states: idle (slots are touched only when used)
  MPI_Win_lock_all(MPI_MODE_NOCHECK, g.win);
  MPI_Barrier(node_);  // every state word is zero before anyone claims
  // Older windows: freed when no slot of any rank holds unread rows (calls still in flight keep them).
  int idle = 1;
  for (const Gen& o : gens_)
    for (int k = 0; k < 2; ++k)
      for (int s = 0; s < n_; ++s) idle &= __atomic_load_n(state(o, me_, SlotKind(k), s), __ATOMIC_ACQUIRE) == 0;
  int all_idle = 0;
  MPI_Allreduce(&idle, &all_idle, 1, MPI_INT, MPI_MIN, node_);
  if (all_idle) {
    for (Gen& o : gens_) {
      MPI_Win_unlock_all(o.win);
      MPI_Win_free(&o.win);
    }
    gens_.clear();
  }
  gens_.push_back(std::move(g));
}

void NodeWindow::free() {
  for (Gen& g : gens_) {
    MPI_Win_unlock_all(g.win);
    MPI_Win_free(&g.win);
  }
  gens_.clear();
}

}  // namespace ot::ep
