// Seeded normal random tensors, the inputs of the MoE tests. The engine and the real type are
// parameters so each helper header keeps its own stream (the tests' data do not change).
#pragma once
#include <random>
#include <vector>

#include "ot/tensor.h"

namespace ot::test {

template <class Engine, class Real>
Tensor normal_tensor(DType t, const std::vector<int64_t>& shape, typename Engine::result_type seed, Real scale) {
  Tensor r = Tensor::empty(t, shape);
  Engine g(seed);
  std::normal_distribution<Real> d(Real(0), scale);
  for (int64_t i = 0; i < r.numel(); ++i) set_from_double(r, i, d(g));
  return r;
}

}  // namespace ot::test
