// adamw_step and multi_tensor_l2_norm (ot/optim.h): every tensor of the lists cut into fixed chunks of elements,
// the chunks spread over the threads. Each element's update is independent, and the norm's chunk
// sums are added in chunk order, so results do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "ot/cpu.h"
#include "ot/error.h"
#include "ot/optim.h"
#include "ot/parallel.h"
#include "ot/trace.h"
#include "src/core/kernel_list.h"
#include "src/optim/adamw_kernels.h"

namespace ot::optim {
namespace {

constexpr int64_t kChunk = 16384;  // elements a job (64 KiB of each fp32 tensor)

const cpu::KernelEntry<detail::AdamWRows, cpu::AnyPlan> kAdamWKernels[] = {
    {cpu::Isa::avx512, nullptr, detail::adamw_rows_avx512, "avx512"},
    {cpu::Isa::avx2, nullptr, detail::adamw_rows_avx2, "avx2"},
    {cpu::Isa::scalar, nullptr, detail::adamw_rows_generic, "generic"},
};

struct Chunk {
  int32_t t;
  int64_t begin, end;
};
std::vector<Chunk> chunks_of(const std::vector<TensorView>& ts) {
  std::vector<Chunk> c;
  for (size_t t = 0; t < ts.size(); ++t)
    for (int64_t b = 0; b < ts[t].numel(); b += kChunk) c.push_back({int32_t(t), b, std::min(ts[t].numel(), b + kChunk)});
  return c;
}

void expect_list(const std::vector<TensorView>& ts, const std::vector<TensorView>* like, const char* op, const char* arg) {
  if (like) OT_CHECK(ts.size() == like->size(), op, arg, ::ot::detail::cat(like->size(), " tensors (one per parameter)"), ts.size());
  for (size_t i = 0; i < ts.size(); ++i) {
    const TensorView& t = ts[i];
    OT_CHECK(t.defined() && t.dtype == DType::f32 && t.is_contiguous(), op, arg, "contiguous fp32 tensors",
             ::ot::detail::cat("tensor ", i, ": ", t.defined() ? t.shape_str() : "undefined"));
    if (like) OT_CHECK(t.shape() == (*like)[i].shape(), op, arg, ::ot::detail::cat("tensor ", i, " shaped ", (*like)[i].shape_str()), t.shape_str());
  }
}

}  // namespace

void adamw_step(const std::vector<TensorView>& params, const std::vector<TensorView>& grads, const std::vector<TensorView>& exp_avg,
                const std::vector<TensorView>& exp_avg_sq, const AdamW& c) {
  const char* op = "adamw_step";
  trace::OpScope scope(op);
  expect_list(params, nullptr, op, "params");
  expect_list(grads, &params, op, "grads");
  expect_list(exp_avg, &params, op, "exp_avg");
  expect_list(exp_avg_sq, &params, op, "exp_avg_sq");
  OT_CHECK(c.step >= 1, op, "step", "a step count >= 1", c.step);
  for (auto [v, name] : {std::pair{c.lr, "lr"}, {c.beta1, "beta1"}, {c.beta2, "beta2"}, {c.eps, "eps"}, {c.weight_decay, "weight_decay"},
                         {c.grad_scale, "grad_scale"}})
    OT_CHECK(std::isfinite(v) && v >= 0.f, op, name, "a finite value >= 0", v);
  OT_CHECK(c.beta1 < 1.f && c.beta2 < 1.f, op, "betas", "each in [0, 1)", ::ot::detail::cat(c.beta1, ", ", c.beta2));
  if (cpu::force_ref()) return ref::adamw_step(params, grads, exp_avg, exp_avg_sq, c);
  const std::vector<Chunk> work = chunks_of(params);
  double bytes = 0;
  for (const TensorView& p : params) bytes += 7.0 * double(p.nbytes());
  scope.bytes(bytes);
  const detail::AdamWScalars k = detail::adamw_scalars(c);
  const auto& kernel = cpu::select_kernel(op, kAdamWKernels);
  if (scope.active()) scope.kernel(kernel.name);
  parallel_for_sized(int64_t(work.size()), bytes, [&](int64_t w0, int64_t w1) {
    for (int64_t w = w0; w < w1; ++w) {
      const Chunk& ch = work[size_t(w)];
      const size_t t = size_t(ch.t);
      kernel.fn(k, static_cast<float*>(params[t].data) + ch.begin, static_cast<const float*>(grads[t].data) + ch.begin,
                static_cast<float*>(exp_avg[t].data) + ch.begin, static_cast<float*>(exp_avg_sq[t].data) + ch.begin, ch.end - ch.begin);
    }
  });
}

double multi_tensor_l2_norm(const std::vector<TensorView>& tensors) {
  const char* op = "multi_tensor_l2_norm";
  trace::OpScope scope(op);
  expect_list(tensors, nullptr, op, "tensors");
  if (cpu::force_ref()) return ref::multi_tensor_l2_norm(tensors);
  const std::vector<Chunk> work = chunks_of(tensors);
  std::vector<double> partial(work.size(), 0.0);
  double bytes = 0;
  for (const TensorView& t : tensors) bytes += double(t.nbytes());
  parallel_for_sized(int64_t(work.size()), bytes, [&](int64_t w0, int64_t w1) {
    for (int64_t w = w0; w < w1; ++w) {
      const Chunk& k = work[size_t(w)];
      const float* x = static_cast<const float*>(tensors[size_t(k.t)].data);
      double lanes[8] = {};
      int64_t i = k.begin;
      for (; i + 8 <= k.end; i += 8)
        for (int l = 0; l < 8; ++l) lanes[l] += double(x[i + l]) * double(x[i + l]);
      for (int l = 0; i < k.end; ++i, ++l) lanes[l] += double(x[i]) * double(x[i]);
      partial[size_t(w)] = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    }
  });
  double s = 0;
  for (double v : partial) s += v;
  return std::sqrt(s);
}

}  // namespace ot::optim
