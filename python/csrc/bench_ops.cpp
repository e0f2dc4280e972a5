// Support for python/bench_overhead.py: times the library call itself, from C++, on views built
// once, so the Python-side time of torch.ops.ops_transformer.<op> minus this is the binding's
// per-call overhead (argument checks, view wrapping, output allocation, dispatch).
#include <chrono>
#include <functional>

#include "bridge.h"
#include "ops.h"
#include "ot/gemm.h"

namespace ot::py {

static double time_us(int64_t iters, const std::function<void()>& call) {
  call();  // warm-up
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iters; ++i) call();
  std::chrono::duration<double, std::micro> d = std::chrono::steady_clock::now() - t0;
  return d.count() / double(iters);
}

double cpp_call_us(c10::string_view op, const std::vector<Tensor>& args, int64_t iters) {
  const char* who = "_cpp_call_us";
  OT_CHECK(iters > 0, who, "iters", "> 0", iters);
  if (op == "matmul") {
    OT_CHECK(args.size() == 3, who, "args", "[a, b, out]", args.size());
    auto a = gemm::MatView::of(view(args[0], who, "a")), b = gemm::MatView::of(view(args[1], who, "b"));
    auto c = gemm::MutMatView::of(view(args[2], who, "out"));
    return time_us(iters, [&] { gemm::matmul(a, b, c); });
  }
  throw ot::Error(who, "op", "an operator with a C++ timing entry (matmul)", std::string(op));
}

}  // namespace ot::py
