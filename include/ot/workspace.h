// Scratch memory planned from one description: add typed regions to a plan (sizes only), allocate
// once, then get typed pointers back from the same slots. No byte arithmetic at call sites.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace ot {

template <class T> struct Slot { size_t index; size_t count; };

class WorkspacePlan {
 public:
  // Reserve `count` elements of T (64-byte aligned). `per_thread` multiplies by the thread count;
  // get(slot, tid) then returns thread tid's part.
  template <class T> Slot<T> add(size_t count, bool per_thread = false) {
    regions_.push_back({count * sizeof(T), per_thread});
    return Slot<T>{regions_.size() - 1, count};
  }
  size_t bytes(int threads) const;

 private:
  friend class Workspace;
  struct Region { size_t bytes; bool per_thread; };
  std::vector<Region> regions_;
};

class Workspace {
 public:
  explicit Workspace(const WorkspacePlan& plan);  // allocates for ot::num_threads() threads
  template <class T> T* get(Slot<T> s, int tid = 0) const {
    const auto& r = offsets_[s.index];
    return reinterpret_cast<T*>(base_ + r.offset + (r.per_thread ? size_t(tid) * r.stride : 0));
  }
  size_t bytes() const { return bytes_; }

 private:
  struct Off { size_t offset, stride; bool per_thread; };
  std::vector<Off> offsets_;
  std::unique_ptr<char, void (*)(void*)> mem_{nullptr, nullptr};
  char* base_ = nullptr;
  size_t bytes_ = 0;
};

// 64-byte-aligned allocation helpers (std::free to release).
void* aligned_alloc64(size_t bytes);
template <class T> struct AlignedDeleter { void operator()(T* p) const; };
template <class T> using AlignedPtr = std::unique_ptr<T[], AlignedDeleter<T>>;
template <class T> AlignedPtr<T> make_aligned(size_t count) {
  return AlignedPtr<T>(static_cast<T*>(aligned_alloc64(count * sizeof(T) + 1)));
}
void aligned_free(void* p);
template <class T> void AlignedDeleter<T>::operator()(T* p) const { aligned_free(p); }

}  // namespace ot
