// The NaN / Inf policy of the GDN operators (docs/robustness.md): the chunked forward and the
// recurrent form reject non-finite q, k, v, g, beta naming the tensor; the state is not inspected.
#include <gtest/gtest.h>

#include <cmath>

#include "gdn_test_util.h"
#include "ot/gdn.h"

namespace test_gdn_nan_policy {
using namespace gdn_test;
using namespace ot::gdn;

TEST(GdnNanPolicy, ChunkAndRecurrentRejectNonFiniteInputs) {
  Shape s;
  s.T = 70;  // two chunks
  for (double bad : {std::nan(""), HUGE_VAL, -HUGE_VAL})
    for (const char* arg : {"q", "k", "v", "g", "beta"}) {
      Inputs in = make_inputs(s, ot::DType::f32, 3);
      Tensor* t = std::string(arg) == "q" ? &in.q : std::string(arg) == "k" ? &in.k : std::string(arg) == "v" ? &in.v
                : std::string(arg) == "g" ? &in.g : &in.beta;
      ot::set_from_double(*t, t->numel() - 1, bad);  // the last token of the second chunk
      expect_error([&] { chunk_gated_delta_rule_fwd(in.q, in.k, in.v, in.g, in.beta); }, arg, "chunk_gated_delta_rule_fwd");
      expect_error([&] { recurrent_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta); }, arg, "recurrent_gated_delta_rule");
    }
}

TEST(GdnNanPolicy, StateIsNotInspected) {
  // A non-finite initial state is the caller's: it propagates into o and the final state.
  Shape s;
  s.T = 3;
  Inputs in = make_inputs(s, ot::DType::f32, 4);
  Tensor S0 = Tensor::zeros(ot::DType::f32, {1, s.HV, s.DK, s.DV});
  ot::set_from_double(S0, 0, std::nan(""));
  RecurrentOptions o;
  o.initial_state = S0;
  o.output_final_state = true;
  RecurrentOut r = recurrent_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, o);
  bool any_nan = false;
  for (int64_t i = 0; i < r.final_state.numel(); ++i) any_nan |= std::isnan(ot::get_as_double(r.final_state, i));
  EXPECT_TRUE(any_nan);
}

}  // namespace test_gdn_nan_policy
