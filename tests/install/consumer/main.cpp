// Calls one MoE and one GDN operator of an installed ops_transformer and checks the results
// against values worked out here by hand. Exit 0 and "consumer: ok" when both agree.
#include <cmath>
#include <cstdio>
#include <cstring>

#include <ot/error.h>
#include <ot/gdn.h>
#include <ot/moe.h>
#include <ot/version.h>

static int failures = 0;
static void expect(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "consumer: FAILED %s\n", what);
    ++failures;
  }
}

int main() {
  std::printf("consumer: headers %s, library %s\n", OT_VERSION_STRING, ot::version());
  expect(std::strcmp(OT_VERSION_STRING, ot::version()) == 0, "header and library versions agree");

  // Router: softmax over 4 experts, top-2. Token 0 prefers experts 2 then 0; token 1 experts 3 then 1.
  float logits[2][4] = {{1.f, 0.f, 3.f, -1.f}, {0.f, 2.f, -2.f, 4.f}};
  auto g = ot::moe::moe_gating_top_k_softmax(ot::TensorView(logits, ot::DType::f32, {2, 4}), 2);
  const int32_t* idx = g.expert_idx.ptr<int32_t>();
  const float* w = g.y.ptr<float>();
  expect(idx[0] == 2 && idx[1] == 0 && idx[2] == 3 && idx[3] == 1, "router expert ids");
  const double z0 = std::exp(1.0) + 1.0 + std::exp(3.0) + std::exp(-1.0);
  expect(std::fabs(w[0] - std::exp(3.0) / z0) < 1e-6 && std::fabs(w[1] - std::exp(1.0) / z0) < 1e-6, "router weights");

  // Gated delta rule, one token from a zero state: S = beta k v^T, o = scale q^T S = scale beta (q.k) v.
  const int DK = 4, DV = 3;
  float q[DK] = {1, 2, 0, -1}, k[DK] = {0.5f, 0.5f, 0.5f, 0.5f}, v[DV] = {1, -2, 3};
  float gate = -0.5f, beta = 0.25f;
  ot::gdn::ChunkOptions opt;
  opt.scale = 0.5f;
  opt.output_final_state = true;
  auto r = ot::gdn::chunk_gated_delta_rule_fwd(ot::TensorView(q, ot::DType::f32, {1, 1, 1, DK}),
                                               ot::TensorView(k, ot::DType::f32, {1, 1, 1, DK}),
                                               ot::TensorView(v, ot::DType::f32, {1, 1, 1, DV}),
                                               ot::TensorView(&gate, ot::DType::f32, {1, 1, 1}),
                                               ot::TensorView(&beta, ot::DType::f32, {1, 1, 1}), opt);
  const double qk = 1 * 0.5 + 2 * 0.5 + 0 * 0.5 - 1 * 0.5;
  for (int j = 0; j < DV; ++j) expect(std::fabs(r.o.ptr<float>()[j] - 0.5 * 0.25 * qk * v[j]) < 1e-5, "gdn output");
  expect(std::fabs(r.final_state.ptr<float>()[0 * DV + 2] - 0.25 * 0.5 * 3) < 1e-6, "gdn final state");

  // Bad input is an ot::Error naming the argument.
  try {
    ot::moe::moe_gating_top_k_softmax(ot::TensorView(logits, ot::DType::f32, {2, 4}), 9);
    expect(false, "k > E rejected");
  } catch (const ot::Error& e) {
    expect(std::strstr(e.what(), "k") != nullptr, "error names the argument");
  }
  if (failures) return 1;
  std::printf("consumer: ok\n");
  return 0;
}
