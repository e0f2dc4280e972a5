// Support for python/bench_overhead.py: times the library call itself, from C++, on views built
// once, so the Python-side time of torch.ops.ops_transformer.<op> minus this is the binding's
// per-call overhead (argument checks, view wrapping, output allocation, dispatch).
#include <time.h>

#include <chrono>
#include <functional>

#include "bridge.h"
#include "ops.h"
#include "ot/gemm.h"
#ifdef OT_HAVE_GDN
#include "ot/gdn.h"
#endif
#ifdef OT_HAVE_MOE
#include "ot/moe.h"
#endif

namespace ot::py {

// This thread's CPU time: on a loaded machine it leaves out the time the thread waited for a core
// (the "idle estimate"; the decode calls below run on the calling thread with OMP_NUM_THREADS=1).
static double thread_cpu_us() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e6 + double(ts.tv_nsec) * 1e-3;
}

static bool g_cpu_clock = false;

static double time_us(int64_t iters, const std::function<void()>& call) {
  call();  // warm-up
  if (g_cpu_clock) {
    const double t0 = thread_cpu_us();
    for (int64_t i = 0; i < iters; ++i) call();
    return (thread_cpu_us() - t0) / double(iters);
  }
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iters; ++i) call();
  std::chrono::duration<double, std::micro> d = std::chrono::steady_clock::now() - t0;
  return d.count() / double(iters);
}

double cpp_call_us(c10::string_view op, const std::vector<Tensor>& args, int64_t iters, bool cpu_time) {
  g_cpu_clock = cpu_time;
  const char* who = "_cpp_call_us";
  OT_CHECK(iters > 0, who, "iters", "> 0", iters);
  if (op == "matmul") {
    OT_CHECK(args.size() == 3, who, "args", "[a, b, out]", args.size());
    auto a = gemm::MatView::of(view(args[0], who, "a")), b = gemm::MatView::of(view(args[1], who, "b"));
    auto c = gemm::MutMatView::of(view(args[2], who, "out"));
    return time_us(iters, [&] { gemm::matmul(a, b, c); });
  }
#ifdef OT_HAVE_GDN
  if (op == "fused_recurrent_gated_delta_rule") {  // decode: state in, state out, l2norm in kernel
    OT_CHECK(args.size() == 6, who, "args", "[q, k, v, g, beta, initial_state]", args.size());
    gdn::RecurrentOptions o;
    o.initial_state = view(args[5], who, "initial_state");
    o.output_final_state = true;
    o.use_qk_l2norm_in_kernel = true;
    auto q = view(args[0], who, "q"), k = view(args[1], who, "k"), v = view(args[2], who, "v");
    auto g = view(args[3], who, "g"), b = view(args[4], who, "beta");
    return time_us(iters, [&] { gdn::recurrent_gated_delta_rule(q, k, v, g, b, o); });
  }
#endif
#ifdef OT_HAVE_MOE
  if (op == "moe_ffn") {  // top-k softmax router, experts in torch layout, packed once here
    OT_CHECK(args.size() == 5, who, "args", "[x, router_weight, gate, up, down] (k = 8)", args.size());
    auto router = gemm::prepack(view(args[1], who, "router_weight"), gemm::BLayout::NK);
    auto experts = moe::MoeExperts::from_stacked(view(args[2], who, "gate"), view(args[3], who, "up"),
                                                 view(args[4], who, "down"), moe::WeightLayout::torch);
    moe::MoeFfnOptions o;
    o.k = 8;
    auto x = view(args[0], who, "x");
    return time_us(iters, [&] { moe::moe_ffn(x, router, experts, o); });
  }
#endif
  throw ot::Error(who, "op", "an operator with a C++ timing entry (matmul, fused_recurrent_gated_delta_rule, moe_ffn)",
                  std::string(op));
}

}  // namespace ot::py
