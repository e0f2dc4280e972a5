// The one bridge between at::Tensor and the library: views without copies for inputs, zero-copy
// wrapping of library-owned outputs, and ot::Error -> c10::Error (Python RuntimeError naming the
// argument). Light torch headers only: every binding TU includes this.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <c10/util/Optional.h>

#include <utility>
#include <vector>

#include "ot/error.h"
#include "ot/tensor.h"

namespace ot::py {

ot::DType to_ot(c10::ScalarType t, const char* op, const char* arg);
c10::ScalarType to_torch(ot::DType t);

// View of a CPU tensor (no copy). Checks device, dtype and rank; the message names op and arg.
ot::TensorView view(const at::Tensor& t, const char* op, const char* arg);
// Optional input: an undefined view when absent.
ot::TensorView view(const c10::optional<at::Tensor>& t, const char* op, const char* arg);
// Library-owned output wrapped zero-copy; the torch tensor keeps the storage alive.
at::Tensor wrap(const ot::Tensor& t);
c10::optional<at::Tensor> wrap_opt(const ot::Tensor& t);  // nullopt when undefined
// Fresh contiguous CPU tensor to be written through view().
at::Tensor empty(const std::vector<int64_t>& shape, c10::ScalarType dtype);
inline at::Tensor empty(const std::vector<int64_t>& shape, ot::DType dtype) { return empty(shape, to_torch(dtype)); }

[[noreturn]] void rethrow(const ot::Error& e);

// Runs f, turning ot::Error into c10::Error (for constructors and methods of custom classes).
template <class F> auto guard(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const ot::Error& e) {
    rethrow(e);
  }
}

// Guarded<&fn>::call has fn's signature and turns ot::Error into c10::Error.
template <auto F> struct Guarded;
template <class R, class... A, R (*F)(A...)>
struct Guarded<F> {
  static R call(A... a) {
    try {
      return F(std::forward<A>(a)...);
    } catch (const ot::Error& e) {
      rethrow(e);
    }
  }
};

}  // namespace ot::py

#define OT_OP(fn) (&::ot::py::Guarded<&fn>::call)
