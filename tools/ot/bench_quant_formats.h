// The --weights list of the quantised benchmarks (`ot bench grouped_matmul`, `ot bench moe_ffn`):
// bf16, int8 (per output channel), w8a8 (int8 per channel, activations int8 per token), int4 /
// int4-g32 / int4-g64 / int4-g128 (int4: group 64).
#pragma once
#include <string>
#include <vector>

#include "ot/error.h"
#include "ot/gemm_quant.h"
#include "ot/quant_weights.h"

namespace ot::cli {

struct WeightsFormat {
  std::string name;  // bf16 | int8 | w8a8 | int4-gNN
  WeightFormat f = WeightFormat::int8;
  int64_t gs = 0;
  gemm::ActivationQuant aq = gemm::ActivationQuant::none;
  bool bf16() const { return name == "bf16"; }
};

inline std::vector<WeightsFormat> parse_weight_formats(const char* who, const std::string& s) {
  std::vector<WeightsFormat> v;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    const std::string t = s.substr(i, j - i);
    if (t == "bf16") v.push_back({t});
    else if (t == "int8") v.push_back({t, WeightFormat::int8, 0});
    else if (t == "w8a8") v.push_back({t, WeightFormat::int8, 0, gemm::ActivationQuant::int8_per_token});
    else if (t == "int4") v.push_back({"int4-g64", WeightFormat::int4, 64});
    else if (t == "int4-g32" || t == "int4-g64" || t == "int4-g128") v.push_back({t, WeightFormat::int4, std::stoll(t.substr(6))});
    else throw ot::Error(who, "--weights", "bf16, int8, w8a8, int4 (group 64), int4-g32, int4-g64 or int4-g128", t);
    i = j + 1;
  }
  return v;
}

}  // namespace ot::cli
