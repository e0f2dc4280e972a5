// Shared pieces of the fuzz targets: decoding shapes, values and indices from the fuzz input,
// tensors in guarded buffers, and the two accepted outcomes of a call (an ot::Error naming an
// argument, or results equal to the reference). Any other outcome aborts, which libFuzzer reports.
#pragma once
#include <sanitizer/asan_interface.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <typeinfo>
#include <string>
#include <vector>

#include "ot/cpu.h"
#include "ot/error.h"
#include "ot/parallel.h"
#include "ot/tensor.h"

namespace fz {

[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "FUZZ FAILURE: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}
#define FZ_ASSERT(cond, ...)                                          \
  do {                                                                \
    if (!(cond)) ::fz::fail(::ot::detail::cat(#cond, ": ", __VA_ARGS__)); \
  } while (0)

// The fuzz input as a stream of choices; past its end every choice reads 0 (the smallest case).
class Input {
 public:
  Input(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  uint8_t byte() { return i_ < n_ ? p_[i_++] : 0; }
  uint16_t u16() { return uint16_t(byte() | (byte() << 8)); }
  bool flag() { return byte() & 1; }
  // Uniform-ish in [lo, hi].
  int64_t range(int64_t lo, int64_t hi) {
    if (hi <= lo) return lo;
    uint64_t span = uint64_t(hi - lo) + 1;
    uint64_t r = span <= 256 ? byte() : span <= 65536 ? u16() : (uint64_t(u16()) << 16 | u16());
    return lo + int64_t(r % span);
  }
  template <class T> T pick(std::initializer_list<T> xs) { return xs.begin()[range(0, int64_t(xs.size()) - 1)]; }
  // An integer argument that is mostly in [lo, hi] but sometimes just outside or extreme, so the
  // validation of each argument is exercised too.
  int64_t arg(int64_t lo, int64_t hi) {
    uint8_t m = byte();
    if (m < 232) return range(lo, hi);
    switch (m % 6) {
      case 0: return lo == INT64_MIN ? lo : lo - 1;  // (saturated: a bound may itself come from arg())
      case 1: return hi == INT64_MAX ? hi : hi + 1;
      case 2: return -1;
      case 3: return 0;
      case 4: return INT64_MAX;
      default: return int64_t(1) << 40;
    }
  }
  // A finite value on a grid (multiples of 1/8 in [-4, 4]) so that ties are exact and distinct
  // values are far apart compared with rounding: the fast path and the reference then agree on
  // every discrete choice (top-k, capacity order).
  double grid(int den = 8, double lo = -4, double hi = 4) {
    int n = int((hi - lo) * den) + 1;
    return lo + double((n <= 256 ? byte() : u16()) % n) / den;
  }
  size_t left() const { return n_ - i_; }

 private:
  const uint8_t* p_;
  size_t n_, i_ = 0;
};

// A tensor in its own heap block with poisoned guard regions on both sides, so any access just
// outside it is reported by ASan at once; the pattern in the guards is checked as well.
class Buf {
 public:
  static constexpr size_t kGuard = 64;
  Buf(ot::DType t, const std::vector<int64_t>& shape, int64_t row_pad = 0) {
    view_ = ot::TensorView(nullptr, t, shape);
    // Optional padding of the leading-dim stride (a view into a wider buffer): strided inputs.
    if (row_pad > 0 && view_.ndim >= 2) {
      int64_t s = 1;
      for (int d = view_.ndim - 1; d >= 0; --d) {
        view_.strides[d] = s;
        s *= view_.sizes[d] + (d == view_.ndim - 1 ? row_pad : 0);
      }
    }
    int64_t span = 0;  // elements from the first to past the last
    bool empty = false;
    for (int d = 0; d < view_.ndim; ++d) empty |= view_.sizes[d] == 0;
    if (!empty) {
      span = 1;
      for (int d = 0; d < view_.ndim; ++d) span += (view_.sizes[d] - 1) * view_.strides[d];
    }
    bytes_ = size_t(span) * ot::dtype_size(t);
    mem_.reset(new uint8_t[bytes_ + 2 * kGuard]);
    std::memset(mem_.get(), 0xA5, bytes_ + 2 * kGuard);
    view_.data = mem_.get() + kGuard;
    ASAN_POISON_MEMORY_REGION(mem_.get(), kGuard);
    ASAN_POISON_MEMORY_REGION(mem_.get() + kGuard + bytes_, kGuard);
  }
  ~Buf() { ASAN_UNPOISON_MEMORY_REGION(mem_.get(), bytes_ + 2 * kGuard); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  const ot::TensorView& view() const { return view_; }
  operator const ot::TensorView&() const { return view_; }
  size_t bytes() const { return bytes_; }
  uint8_t* data() const { return mem_.get() + kGuard; }
  void check_guards(const char* name) const {
    ASAN_UNPOISON_MEMORY_REGION(mem_.get(), kGuard);
    ASAN_UNPOISON_MEMORY_REGION(mem_.get() + kGuard + bytes_, kGuard);
    for (size_t i = 0; i < kGuard; ++i)
      FZ_ASSERT(mem_[i] == 0xA5 && mem_[kGuard + bytes_ + i] == 0xA5, name, ": guard byte ", i, " overwritten");
    ASAN_POISON_MEMORY_REGION(mem_.get(), kGuard);
    ASAN_POISON_MEMORY_REGION(mem_.get() + kGuard + bytes_, kGuard);
  }
  std::vector<uint8_t> snapshot() const { return {data(), data() + bytes_}; }
  // Element i (row-major over the shape) from a double.
  void set(int64_t i, double x) { ot::set_from_double(view_, i, x); }
  double get(int64_t i) const { return ot::get_as_double(view_, i); }
  int64_t numel() const { return view_.numel(); }

 private:
  std::unique_ptr<uint8_t[]> mem_;
  ot::TensorView view_;
  size_t bytes_ = 0;
};

// Every tensor a call gets: inputs must come back unchanged, and nothing is written into a guard.
class Arena {
 public:
  Buf& add(const char* name, ot::DType t, const std::vector<int64_t>& shape, int64_t row_pad = 0) {
    bufs_.push_back({name, std::make_unique<Buf>(t, shape, row_pad), {}});
    return *bufs_.back().buf;
  }
  // Values on the grid (float dtypes) for every element.
  Buf& values(Input& in, const char* name, ot::DType t, const std::vector<int64_t>& shape, int64_t row_pad = 0, double scale = 1.0) {
    Buf& b = add(name, t, shape, row_pad);
    for (int64_t i = 0; i < b.numel(); ++i) b.set(i, in.grid() * scale);
    return b;
  }
  // Call after filling: records the inputs' bytes.
  void seal() {
    for (auto& e : bufs_) e.before = e.buf->snapshot();
  }
  // After the call: guards intact everywhere, inputs unchanged (except those named in `written`).
  void check(const std::vector<const Buf*>& written = {}) const {
    for (auto& e : bufs_) {
      e.buf->check_guards(e.name);
      bool w = false;
      for (const Buf* b : written) w |= b == e.buf.get();
      if (!w) FZ_ASSERT(e.buf->snapshot() == e.before, e.name, ": an input was modified");
    }
  }

 private:
  struct Entry { const char* name; std::unique_ptr<Buf> buf; std::vector<uint8_t> before; };
  std::vector<Entry> bufs_;
};

inline std::map<std::string, long>* counts_ptr() {
  static auto* m = new std::map<std::string, long>;
  return m;
}

inline bool is_int(ot::DType t) { return !ot::is_float(t); }

// a == b elementwise: same shape and dtype, integers exactly, floats within atol + rtol * |b|
// (both NaN counts as equal).
inline void expect_close(const char* what, const ot::TensorView& a, const ot::TensorView& b, double rtol = 0, double atol = 0) {
  FZ_ASSERT(a.shape() == b.shape(), what, ": shape ", a.shape_str(), " vs reference ", b.shape_str());
  FZ_ASSERT(a.dtype == b.dtype, what, ": dtype ", ot::dtype_name(a.dtype), " vs reference ", ot::dtype_name(b.dtype));
  for (int64_t i = 0, n = a.numel(); i < n; ++i) {
    double x = ot::get_as_double(a, i), y = ot::get_as_double(b, i);
    if (std::isnan(x) && std::isnan(y)) continue;
    bool ok = is_int(a.dtype) ? std::fabs(x - y) <= atol : (x == y || std::fabs(x - y) <= atol + rtol * std::fabs(y));
    FZ_ASSERT(ok, what, ": element ", i, " is ", x, ", reference ", y, " (shape ", a.shape_str(), ")");
  }
}
inline void expect_close(const char* what, const ot::Tensor& a, const ot::Tensor& b, double rtol = 0, double atol = 0) {
  FZ_ASSERT(a.defined() == b.defined(), what, ": defined ", a.defined(), " vs reference ", b.defined());
  if (a.defined()) expect_close(what, a.view(), b.view(), rtol, atol);
}
// Tolerances of a result in dtype t computed in fp32 against an fp64 reference: fp32 results
// within a few ulps (scaled by the magnitude `mag` of the terms summed), bf16/fp16 within one ulp
// of their own rounding.
inline double rtol_of(ot::DType t) { return t == ot::DType::bf16 ? 1.6e-2 : t == ot::DType::f16 ? 2e-3 : 1e-5; }

// FZ_STATS=1: at exit, how many calls of each operator succeeded and which errors the rest got
// (to see that a target reaches the operator's work and not only its validation).
inline void count_outcome(const char* op, const std::string& err) {
  static const bool on = std::getenv("FZ_STATS") != nullptr;
  if (!on) return;
  static const bool registered = [] {
    std::atexit([] {
      for (auto& [k, n] : *counts_ptr()) std::fprintf(stderr, "%8ld  %s\n", n, k.c_str());
    });
    return true;
  }();
  (void)registered;
  std::string key = std::string(op) + " -> " + (err.empty() ? "ok" : err.substr(0, err.find(": expected")));
  ++(*counts_ptr())[key];
}

// The two accepted outcomes of calling `fast` and then `ref` on the same arguments: both throw an
// ot::Error naming an operator and an argument (the reference shares the validation, so they
// agree), or neither throws and `compare` is run. Anything else thrown is a failure.
template <class Fast, class Ref, class Cmp> bool run_both(const char* op, Fast fast, Ref ref, Cmp compare) {
  auto outcome = [&](auto& f, auto& res, std::string& err) {
    try {
      res.emplace(f());
      return true;
    } catch (const ot::Error& e) {
      FZ_ASSERT(!e.op().empty() && !e.arg().empty() && !e.expected().empty(), op, ": an ot::Error without op/arg/expected: ", e.what());
      err = e.what();
      return false;
    } catch (const std::exception& e) {
      fail(ot::detail::cat(op, ": not an ot::Error but ", typeid(e).name(), ": ", e.what()));
    }
  };
  std::optional<decltype(fast())> a;
  std::optional<decltype(ref())> b;
  std::string ea, eb;
  bool oka = outcome(fast, a, ea);
  bool okb = outcome(ref, b, eb);
  count_outcome(op, oka ? "" : ea);
  FZ_ASSERT(oka == okb, op, ": fast ", oka ? "succeeded" : "threw", " but the reference ", okb ? "succeeded" : "threw", " (", ea, eb, ")");
  if (oka) compare(*a, *b);
  return oka;
}

// Threads of the call, from the input (1-3: the parallel splits depend on it).
inline void pick_threads(Input& in) { ot::set_num_threads(int(in.range(1, 3))); }

// run_both against the same call under OT_FORCE_REF (the reference behind the same entry point).
template <class Call, class Cmp> bool run_vs_forced_ref(const char* op, Call call, Cmp compare) {
  return run_both(op, call, [&] {
    ot::cpu::ScopedForceRef force(true);
    return call();
  }, compare);
}

}  // namespace fz

// The libFuzzer entry point of a target: `OT_FUZZ_TARGET(in, ar) { ... }` runs the body on the
// input's choices (the thread count first) with a fresh arena of guarded tensors.
#define OT_FUZZ_TARGET(in, ar)                                                   \
  static void ot_fuzz_body(fz::Input& in, fz::Arena& ar);                        \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {      \
    fz::Input input(data, size);                                                 \
    fz::pick_threads(input);                                                     \
    fz::Arena arena;                                                             \
    ot_fuzz_body(input, arena);                                                  \
    return 0;                                                                    \
  }                                                                              \
  static void ot_fuzz_body(fz::Input& in, fz::Arena& ar)

namespace fz {

}  // namespace fz
