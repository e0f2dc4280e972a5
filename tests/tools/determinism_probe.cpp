// Prints a hash of the output bits of a bf16 moe_ffn (prefill and decode sizes) and a bf16
// chunk_gated_delta_rule_fwd on fixed pseudo-random inputs. check_determinism.py runs it in separate
// processes and requires equal hashes: no kernel choice (and so no rounding) may depend on timing.
#include <cstdint>
#include <cstdio>
#include <vector>

#include "ot/gdn.h"
#include "ot/moe.h"
#include "ot/tensor.h"

namespace {

// Deterministic inputs: a 64-bit LCG mapped to [-scale, scale).
struct Lcg {
  uint64_t s;
  float next(float scale) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return scale * (float((s >> 40) & 0xffffff) / float(1 << 23) - 1.f);
  }
};
ot::Tensor random_tensor(ot::DType dt, const std::vector<int64_t>& shape, float scale, uint64_t seed) {
  ot::Tensor t = ot::Tensor::empty(dt, shape);
  Lcg g{seed};
  for (int64_t i = 0; i < t.numel(); ++i) ot::set_from_double(t, i, g.next(scale));
  return t;
}
// FNV-1a over the tensor's bytes.
uint64_t fnv(const ot::Tensor& t, uint64_t h = 1469598103934665603ull) {
  const auto* p = static_cast<const unsigned char*>(t.view().data);
  for (size_t i = 0; i < t.view().nbytes(); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

}  // namespace

int main() {
  using ot::DType;
  const int64_t H = 256, I = 128, E = 8;
  auto gate = random_tensor(DType::bf16, {E, H, I}, 0.1f, 1), up = random_tensor(DType::bf16, {E, H, I}, 0.1f, 2);
  auto down = random_tensor(DType::bf16, {E, I, H}, 0.1f, 3), router = random_tensor(DType::bf16, {E, H}, 0.5f, 4);
  auto experts = ot::moe::MoeExperts::from_stacked(gate, up, down, ot::moe::WeightLayout::EHI);
  auto packed_router = ot::gemm::prepack(router, ot::gemm::BLayout::NK);
  ot::moe::MoeFfnOptions opt;
  opt.k = 2;
  for (int64_t T : {1, 7, 300}) {
    auto x = random_tensor(DType::bf16, {T, H}, 1.f, 10 + uint64_t(T));
    auto r = ot::moe::moe_ffn(x, packed_router, experts, opt);
    std::printf("moe_ffn bf16 T%lld %016llx\n", (long long)T, (unsigned long long)fnv(r.y));
  }
  const int64_t T = 200, HK = 2, HV = 4, D = 64;
  auto q = random_tensor(DType::bf16, {1, T, HK, D}, 0.3f, 20), k = random_tensor(DType::bf16, {1, T, HK, D}, 0.3f, 21);
  auto v = random_tensor(DType::bf16, {1, T, HV, D}, 1.f, 22);
  auto g = random_tensor(DType::f32, {1, T, HV}, 0.05f, 23), beta = random_tensor(DType::f32, {1, T, HV}, 0.4f, 24);
  for (int64_t i = 0; i < g.numel(); ++i) {  // log gates in (-0.1, 0], betas in (0.1, 0.9)
    ot::set_from_double(g, i, ot::get_as_double(g, i) - 0.05);
    ot::set_from_double(beta, i, ot::get_as_double(beta, i) + 0.5);
  }
  ot::gdn::ChunkOptions gopt;
  gopt.output_final_state = true;
  gopt.use_qk_l2norm_in_kernel = true;
  auto o = ot::gdn::chunk_gated_delta_rule_fwd(q, k, v, g, beta, gopt);
  std::printf("chunk_gated_delta_rule_fwd bf16 T%lld %016llx %016llx\n", (long long)T, (unsigned long long)fnv(o.o),
              (unsigned long long)fnv(o.final_state));
  return 0;
}
