// Declarations of every torch-facing operator function (defined per family in <family>_ops.cpp,
// registered with their schemas in register.cpp). Signatures use the types the schemas map to.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>
#include <c10/util/string_view.h>

#include <tuple>
#include <vector>

namespace ot::py {

using Tensor = at::Tensor;
using OptTensor = c10::optional<at::Tensor>;

// gemm_ops.cpp
Tensor matmul(const Tensor& a, const Tensor& b, double alpha, c10::optional<c10::ScalarType> out_dtype);
void set_max_isa(int64_t isa);
void set_force_ref(bool on);
std::tuple<int64_t, bool> isa_state();

// bench_ops.cpp
double cpp_call_us(c10::string_view op, const std::vector<Tensor>& args, int64_t iters);

}  // namespace ot::py
