#include "ot/parallel.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>

namespace ot {

static int g_threads = 0;  // 0: default

static int default_threads() {
  static const int n = [] {
    if (const char* s = std::getenv("OT_NUM_THREADS")) {
      int v = std::atoi(s);
      if (v > 0) return v;
    }
    return omp_get_max_threads();
  }();
  return n;
}

int num_threads() { return g_threads > 0 ? g_threads : default_threads(); }
void set_num_threads(int n) { g_threads = n > 0 ? n : 0; }
int thread_id() { return omp_in_parallel() ? omp_get_thread_num() : 0; }
bool in_parallel_region() { return omp_in_parallel(); }

static bool run_inline(int64_t n) { return n <= 1 || num_threads() == 1 || omp_in_parallel(); }

void parallel_for(int64_t n, FnRef<void(int64_t, int64_t)> fn) {
  if (n <= 0) return;
  if (run_inline(n)) { fn(0, n); return; }
  int nt = int(std::min<int64_t>(num_threads(), n));
#pragma omp parallel num_threads(nt)
  {
    int t = omp_get_thread_num(), T = omp_get_num_threads();
    // balance211: the first n % T threads take one extra item.
    int64_t q = n / T, r = n % T;
    int64_t b = t * q + std::min<int64_t>(t, r);
    int64_t e = b + q + (t < r ? 1 : 0);
    if (b < e) fn(b, e);
  }
}

void parallel_for_dynamic(int64_t n, int64_t chunk, FnRef<void(int64_t, int64_t)> fn) {
  if (n <= 0) return;
  int nt = num_threads();
  if (chunk <= 0) chunk = std::max<int64_t>(1, n / (4 * int64_t(nt)));
  if (run_inline(n) || chunk >= n) {
    for (int64_t b = 0; b < n; b += chunk) fn(b, std::min(n, b + chunk));
    return;
  }
  std::atomic<int64_t> next{0};
#pragma omp parallel num_threads(nt)
  {
    for (;;) {
      int64_t b = next.fetch_add(chunk, std::memory_order_relaxed);
      if (b >= n) break;
      fn(b, std::min(n, b + chunk));
    }
  }
}

void parallel_for_sized(int64_t n, double bytes, FnRef<void(int64_t, int64_t)> fn) {
  if (n > 0 && bytes < kInlineWorkBytes) return fn(0, n);
  parallel_for(n, fn);
}

void parallel_for_dynamic_sized(int64_t n, int64_t chunk, double bytes, FnRef<void(int64_t, int64_t)> fn) {
  if (n > 0 && bytes < kInlineWorkBytes) return fn(0, n);
  parallel_for_dynamic(n, chunk, fn);
}

void parallel_region(FnRef<void(int, int)> fn) {
  if (num_threads() == 1 || omp_in_parallel()) { fn(0, 1); return; }
#pragma omp parallel num_threads(num_threads())
  fn(omp_get_thread_num(), omp_get_num_threads());
}

}  // namespace ot
