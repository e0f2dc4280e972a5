// `ot bench demo_norms`: the demo's two norms at its default shapes (hidden 1024; 8 value heads of
// 128; prefill 763 tokens, decode 6), bf16, in GB/s of the bytes each call reads and writes, against
// the memory peak. The reference is the plain form (double sums, one thread) the demo verifies with;
// for add_rms_norm and rms_norm_bwd (the training step's forms, at the prefill shape) the library's
// fp64 reference (OT_FORCE_REF).
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench_harness.h"
#include "demo_ops.h"
#include "ot/cpu.h"
#include "ot/norm.h"
#include "ot/parallel.h"

namespace ot::cli {
namespace bench_demo_norms_local {

struct Case {
  std::string name, shape;
  double bytes;
  std::function<void()> fast, ref;
};

int run_norms(const BenchOptions& opt) {
  std::mt19937 rng(4);
  const int64_t H = 1024, HV = 8, DV = 128;
  std::vector<Case> cases;
  std::vector<Tensor> keep;
  for (int64_t T : {763, 6}) {
    const std::string t = std::to_string(T);
    Tensor x = uniform_tensor(rng, DType::bf16, {T, H}, -2, 2), y = Tensor::empty(DType::bf16, {T, H});
    Tensor w = uniform_tensor(rng, DType::f32, {H}, 0.9f, 1.1f);
    Tensor o = uniform_tensor(rng, DType::bf16, {T, HV, DV}, -2, 2), z = uniform_tensor(rng, DType::bf16, {T, HV * DV}, -3, 3);
    Tensor wd = uniform_tensor(rng, DType::f32, {DV}, 0.9f, 1.1f), wh = Tensor::empty(DType::f32, {HV * DV});
    for (int64_t i = 0; i < HV * DV; ++i) wh.ptr<float>()[i] = wd.ptr<float>()[i % DV];
    keep.insert(keep.end(), {x, y, w, o, z, wd, wh});
    const double act = double(T * H * 2);
    cases.push_back({"rms_norm-T" + t, "[" + t + ", 1024]", 2 * act, [=] { demo::rms_norm(x, w.ptr<float>(), 1e-6); },
                     [=] { demo::rms_norm_ref(x, w.ptr<float>(), 1e-6, y); }});
    if (T > 16) {
      Tensor x2 = uniform_tensor(rng, DType::bf16, {T, H}, -1, 1), dy = uniform_tensor(rng, DType::bf16, {T, H}, -1, 1);
      Tensor rstd = ot::rms_norm(x, w, 1e-6f).rstd;
      keep.insert(keep.end(), {x2, dy, rstd});
      auto forced = [](std::function<void()> f) { return [f] { cpu::ScopedForceRef r(true); f(); }; };
      std::function<void()> add = [=] { ot::add_rms_norm(x, x2, w, 1e-6f); }, bwd = [=] { ot::rms_norm_bwd(dy, x, w, rstd, 1e-6f); };
      cases.push_back({"add_rms_norm-T" + t, "[" + t + ", 1024]", 4 * act, add, forced(add)});
      cases.push_back({"rms_norm_bwd-T" + t, "[" + t + ", 1024]", 3 * act, bwd, forced(bwd)});
    }
    cases.push_back({"gated_rms_norm-T" + t, "[" + t + ", 8, 128]", 3 * act, [=] { demo::gated_rms_norm(o, z, wh, 1e-6); },
                     [=] { demo::gated_rms_norm_ref(o, z, wd.ptr<float>(), 1e-6, y); }});
  }
  for (const Case& c : cases) {
    if (!opt.selected(c.name)) continue;
    Timing tm = time_interleaved(c.fast, opt.no_ref ? std::function<void()>() : c.ref, opt.repeats > 0 ? opt.repeats : 30,
                                 opt.no_ref ? 0 : 5, true);
    BenchResult r = bandwidth_result(c.name, c.shape, "bf16", num_threads(), c.bytes, tm, c.fast);
    r.extra["bytes"] = c.bytes;
    report(opt, r);
  }
  return 0;
}

RegisterBench bench("demo_norms", "ot demo's RMSNorm and gated RMSNorm at the demo's shapes against their plain forms, GB/s",
                    [](Options&, const BenchOptions& o) { return [&o] { return run_norms(o); }; });

}  // namespace bench_demo_norms_local
}  // namespace ot::cli
