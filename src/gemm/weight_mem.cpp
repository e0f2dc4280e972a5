// Packed-weight memory on transparent huge pages where the kernel offers them (see internal.h).
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <utility>

#include "ot/workspace.h"
#include "src/gemm/internal.h"

namespace ot::gemm::detail {

namespace {
constexpr size_t kHuge = size_t(2) << 20;
bool huge_wanted() {
  static const bool off = std::getenv("OT_NO_HUGE_WEIGHTS") != nullptr;
  return !off;
}
}  // namespace

WeightMem::WeightMem(size_t bytes) {
  bytes = std::max<size_t>(bytes, 64);
#if defined(MADV_HUGEPAGE)
  if (bytes >= kHuge && huge_wanted()) {
    size_t whole = (bytes + kHuge - 1) / kHuge * kHuge;
    size_t len = whole - bytes <= bytes / 8 ? whole : (bytes + 4095) / 4096 * 4096;
    // Over-map by one huge page, then trim to a 2 MiB aligned start.
    void* m = mmap(nullptr, len + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m != MAP_FAILED) {
      uintptr_t a = reinterpret_cast<uintptr_t>(m), s = (a + kHuge - 1) & ~(kHuge - 1);
      if (s > a) munmap(m, s - a);
      if (a + len + kHuge > s + len) munmap(reinterpret_cast<void*>(s + len), a + len + kHuge - (s + len));
      p_ = reinterpret_cast<char*>(s);
      len_ = len;
      (void)madvise(p_, len, MADV_HUGEPAGE);  // before the first touch (the pack writes it); failure is harmless
      return;
    }
  }
#endif
  p_ = static_cast<char*>(aligned_alloc64(bytes));
}

WeightMem& WeightMem::operator=(WeightMem&& o) noexcept {
  if (this != &o) {
    release();
    p_ = std::exchange(o.p_, nullptr);
    len_ = std::exchange(o.len_, 0);
  }
  return *this;
}

WeightMem::~WeightMem() { release(); }

void WeightMem::release() {
  if (!p_) return;
  if (len_) munmap(p_, len_);
  else aligned_free(p_);
  p_ = nullptr;
}

}  // namespace ot::gemm::detail
