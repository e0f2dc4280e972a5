// Configuration of `ot demo`: the model (a Qwen3-Next / Qwen3.5-like stack of decoder blocks, each a
// Gated DeltaNet mixer and a MoE FFN, both behind RMSNorm with residuals), the run (prefill lengths,
// decode steps) and the verification subset. Built-in default sized for a short run on 2 cores;
// `--config FILE` reads JSON with the same keys (missing keys keep the default). A bad value or an
// unknown key is an ot::Error naming the field, e.g. "model.gdn.value_heads".
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ot/gemm_quant.h"
#include "ot/quant_weights.h"
#include "ot/tensor.h"

namespace ot::demo {

struct GdnConfig {
  int64_t key_heads = 4;        // HK
  int64_t value_heads = 8;      // HV (multiple of HK)
  int64_t key_head_dim = 128;   // DK
  int64_t value_head_dim = 128; // DV
};

struct MoeConfig {
  int64_t experts = 32;             // E
  int64_t top_k = 4;                // K
  int64_t intermediate = 256;       // I of each routed expert
  int64_t shared_intermediate = 256;  // I of the shared expert (0: none; Qwen3-Next: equal to I)
  bool norm_topk_prob = true;       // Qwen3: renormalise the K routing weights
  // Routed experts' weights: "float" (model.dtype), or quantised once at load (weight-only;
  // activations stay in model.dtype): "int8" (per output channel), "int4" (group 64), "int4-g32",
  // "int4-g64", "int4-g128", "w8a8". Symmetric.
  std::string expert_weights = "float";
  // With quantised routed experts, the shared expert in their format too (ignored with float
  // ones). Off: the shared expert stays in model.dtype (on the Zen 5 machine an int8 shared expert
  // made the prefill layer ~7% slower and decode no faster; W8A8 within noise).
  bool quantise_shared_expert = false;
  bool quantised() const { return expert_weights != "float"; }
};

// The quantised format that MoeConfig::expert_weights names; group_size -1: not a quantised format.
struct ExpertFormat {
  WeightFormat format = WeightFormat::int8;
  int64_t group_size = -1;  // 0: per output channel (int8)
  gemm::ActivationQuant activations = gemm::ActivationQuant::none;  // w8a8: int8 per token
};
ExpertFormat expert_format(const MoeConfig& m);

struct ModelConfig {
  int64_t hidden = 1024;  // H
  int64_t layers = 4;     // decoder blocks (GDN mixer + MoE FFN each)
  int64_t vocab = 4096;
  double rms_norm_eps = 1e-6;
  DType dtype = DType::bf16;  // weights and activations (states fp32)
  GdnConfig gdn;
  MoeConfig moe;
};

struct RunConfig {
  std::vector<int64_t> prefill_lengths = {384, 200, 97, 64, 17, 1};  // one prompt per sequence
  int64_t decode_steps = 24;
  uint64_t seed = 1;
  int threads = 0;  // 0: all
};

struct VerifyConfig {
  bool enabled = true;
  // The subset re-run through the reference path (op by op, on identical inputs).
  std::vector<int64_t> prefill_lengths = {70, 1, 5};
  int64_t decode_steps = 2;
  int64_t layers = 1;  // first layers checked
  double tol_bf16 = 2e-2, tol_f16 = 1e-2, tol_f32 = 1e-4;  // max normalised error
};

struct DemoConfig {
  ModelConfig model;
  RunConfig run;
  VerifyConfig verify;
  double tolerance() const;  // for model.dtype
};

// The config file's name of a model dtype ("bf16", "fp16", "fp32").
const char* dtype_key(DType t);
// Parses and validates (ot::Error with op "ot demo --config", arg = the field path).
DemoConfig config_from_json(const nlohmann::json& j);
DemoConfig load_config(const std::string& path);
nlohmann::json config_to_json(const DemoConfig& c);
// Checks cross-field rules; called by config_from_json and for the built-in default.
void validate(const DemoConfig& c);

}  // namespace ot::demo
