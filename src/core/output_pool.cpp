// Pooled output allocation: see ot/output_pool.h.
#include "ot/output_pool.h"

#include <mutex>
#include <vector>
#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace ot {

namespace {
// Outputs from this size up are pooled (a 256 KiB output is 64 page faults when fresh); at most
// kPoolBuffers of them and kPoolBytes in all are kept.
constexpr size_t kPooledMinBytes = size_t(256) << 10;
constexpr size_t kPoolBuffers = 16, kPoolBytes = size_t(512) << 20;
}  // namespace

// Large outputs come from a small pool of earlier outputs whose storage nobody else holds any
// more (a caching allocator shared by the operator families): a GDN forward at Qwen shapes writes
// 10-100 MiB of fresh memory per call and first-touch page faults were ~30 % of it at T = 4096;
// init routing spent ~85 % in faults and first writes (faults are dear in a VM). A buffer still
// referenced anywhere (a Tensor copy, a binding holding the storage) is never reused.
Tensor pooled_empty(DType dt, const std::vector<int64_t>& shape) {
  const int64_t n = checked_numel("pooled_empty", "shape", shape, dt);
  if (size_t(n) * dtype_size(dt) < kPooledMinBytes) return Tensor::empty(dt, shape);
  static std::mutex mu;
  static std::vector<Tensor> pool;  // most recent last
  {
    std::lock_guard<std::mutex> lock(mu);
    for (size_t i = 0; i < pool.size(); ++i)
      if (pool[i].dtype() == dt && pool[i].shape() == shape && pool[i].storage().use_count() == 2) {
        Tensor t = pool[i];  // only the pool held it (plus the temporary above)
        pool.erase(pool.begin() + int64_t(i));
        pool.push_back(t);
        return t;
      }
  }
  Tensor t = Tensor::empty(dt, shape);
  advise_huge_pages(t);
  std::lock_guard<std::mutex> lock(mu);
  pool.push_back(t);
  // Bounded: the most recent buffers (several outputs per call, a few shapes per model); the
  // oldest go first (a buffer still in use is then simply not pooled).
  size_t bytes = 0;
  for (const Tensor& x : pool) bytes += x.view().nbytes();
  while (pool.size() > 1 && (pool.size() > kPoolBuffers || bytes > kPoolBytes)) {
    bytes -= pool.front().view().nbytes();
    pool.erase(pool.begin());
  }
  return t;
}

// Large outputs are fresh memory every call: one fault per 4 KiB page is a visible part of a
// chunked forward (~10 % at Qwen shapes; faults are dear in a VM). Transparent huge pages, where
// the kernel offers them on request, take one fault per 2 MiB. Whole huge pages inside the
// buffer only; advice failure is harmless.
void advise_huge_pages(const Tensor& t) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t(2) << 20;
  uintptr_t a = reinterpret_cast<uintptr_t>(t.ptr<char>()), e = a + t.view().nbytes();
  uintptr_t lo = (a + kHuge - 1) & ~(kHuge - 1), hi = e & ~(kHuge - 1);
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);
#else
  (void)t;
#endif
}

}  // namespace ot
