// The one parallel-for of the library (OpenMP underneath; the header stays OpenMP-free).
#pragma once
#include <cstdint>
#include <type_traits>
#include <utility>

namespace ot {

int num_threads();             // threads a parallel region uses (OT_NUM_THREADS / OMP_NUM_THREADS)
void set_num_threads(int n);   // n <= 0 restores the default
int thread_id();               // inside a region: 0..num_threads()-1; outside: 0
bool in_parallel_region();     // true on any thread of a running parallel region

// Non-owning callable reference: no allocation per call.
template <class Sig> class FnRef;
template <class R, class... A> class FnRef<R(A...)> {
 public:
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, FnRef>>>
  FnRef(F&& f) : obj_((void*)&f), call_([](void* o, A... a) -> R { return (*(std::remove_reference_t<F>*)o)(std::forward<A>(a)...); }) {}
  R operator()(A... a) const { return call_(obj_, std::forward<A>(a)...); }

 private:
  void* obj_;
  R (*call_)(void*, A...);
};

// Static schedule: [0, n) split into one contiguous range per thread (balance211);
// fn(begin, end) is called at most once per thread. Runs inline when n is small or
// when already inside a parallel region.
void parallel_for(int64_t n, FnRef<void(int64_t, int64_t)> fn);

// Dynamic schedule for ragged work: [0, n) cut into chunks of `chunk` items handed out from an
// atomic counter; fn(begin, end) per chunk. chunk <= 0 picks about 4 chunks per thread.
void parallel_for_dynamic(int64_t n, int64_t chunk, FnRef<void(int64_t, int64_t)> fn);

// A call whose work touches fewer bytes than this (read + written) runs on the calling thread:
// starting a parallel region costs ~3-5 us on a 2-core VM, more than such work takes on one core
// (a decode step of a small model, a norm over a few tokens).
constexpr double kInlineWorkBytes = 64 * 1024;
// parallel_for / parallel_for_dynamic for a call that touches `bytes` in all: inline (fn(0, n))
// below kInlineWorkBytes.
void parallel_for_sized(int64_t n, double bytes, FnRef<void(int64_t, int64_t)> fn);
void parallel_for_dynamic_sized(int64_t n, int64_t chunk, double bytes, FnRef<void(int64_t, int64_t)> fn);

// Every thread runs fn(thread_id, num_threads) once (for per-thread scratch set-up).
void parallel_region(FnRef<void(int, int)> fn);

}  // namespace ot
