#include "ot/workspace.h"

#include <cstdlib>
#include <new>

#include "ot/parallel.h"

namespace ot {

static size_t round64(size_t b) { return (b + 63) & ~size_t(63); }

void* aligned_alloc64(size_t bytes) {
  void* p = std::aligned_alloc(64, round64(bytes ? bytes : 1));
  if (!p) throw std::bad_alloc();
  return p;
}
void aligned_free(void* p) { std::free(p); }

size_t WorkspacePlan::bytes(int threads) const {
  size_t total = 0;
  for (const auto& r : regions_) total += round64(r.bytes) * (r.per_thread ? size_t(threads) : 1);
  return total;
}

Workspace::Workspace(const WorkspacePlan& plan) {
  int threads = num_threads();
  size_t off = 0;
  for (const auto& r : plan.regions_) {
    size_t stride = round64(r.bytes);
    offsets_.push_back({off, stride, r.per_thread});
    off += stride * (r.per_thread ? size_t(threads) : 1);
  }
  bytes_ = off;
  mem_ = std::unique_ptr<char, void (*)(void*)>(static_cast<char*>(aligned_alloc64(off)), aligned_free);
  base_ = mem_.get();
}

}  // namespace ot
