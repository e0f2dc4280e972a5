#include "demo_config.h"

#include <fstream>
#include <set>

#include "ot/error.h"

namespace ot::demo {

namespace demo_config_local {

constexpr const char* kOp = "ot demo --config";

// Reads one JSON object, remembering which keys were consumed so unknown keys (typos) are errors.
class Obj {
 public:
  Obj(const nlohmann::json& j, std::string path) : j_(j), path_(std::move(path)) {
    OT_CHECK(j.is_object(), kOp, path_.empty() ? "(top level)" : path_, "a JSON object", j.type_name());
  }
  std::string field(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
  const nlohmann::json* get(const std::string& key) {
    seen_.insert(key);
    auto it = j_.find(key);
    return it == j_.end() ? nullptr : &*it;
  }
  void integer(const std::string& key, int64_t& out, int64_t lo, int64_t hi) {
    ranged(key, out, lo, hi, &nlohmann::json::is_number_integer, "an integer");
  }
  void integer(const std::string& key, int& out, int lo, int hi) {
    int64_t x = out;
    integer(key, x, lo, hi);
    out = int(x);
  }
  void number(const std::string& key, double& out, double lo, double hi) {
    ranged(key, out, lo, hi, &nlohmann::json::is_number, "a number");
  }
  void boolean(const std::string& key, bool& out) {
    if (auto* v = get(key)) {
      OT_CHECK(v->is_boolean(), kOp, field(key), "true or false", v->dump());
      out = v->get<bool>();
    }
  }
  void text(const std::string& key, std::string& out) {
    if (auto* v = get(key)) {
      OT_CHECK(v->is_string(), kOp, field(key), "a string", v->dump());
      out = v->get<std::string>();
    }
  }
  void lengths(const std::string& key, std::vector<int64_t>& out, int64_t max_len) {
    if (auto* v = get(key)) {
      OT_CHECK(v->is_array() && !v->empty(), kOp, field(key), "a non-empty array of sequence lengths", v->dump());
      std::vector<int64_t> r;
      for (size_t i = 0; i < v->size(); ++i) {
        const auto& e = (*v)[i];
        std::string f = field(key) + "[" + std::to_string(i) + "]";
        OT_CHECK(e.is_number_integer(), kOp, f, "an integer", e.dump());
        OT_CHECK(e.get<int64_t>() >= 1 && e.get<int64_t>() <= max_len, kOp, f, detail::cat("a length in [1, ", max_len, "]"), e.dump());
        r.push_back(e.get<int64_t>());
      }
      out = r;
    }
  }
  Obj child(const std::string& key) {
    static const nlohmann::json empty = nlohmann::json::object();
    const nlohmann::json* v = get(key);
    return Obj(v ? *v : empty, field(key));
  }
  // Every key of the object must have been read.
  void finish() const {
    for (auto it = j_.begin(); it != j_.end(); ++it)
      OT_CHECK(seen_.count(it.key()), kOp, field(it.key()), "a known field (see `ot demo --print-config`)", "unknown field");
  }

 private:
  // key, when present, must pass `is` (the JSON type, named by `what`) and lie in [lo, hi].
  template <class T>
  void ranged(const std::string& key, T& out, T lo, T hi, bool (nlohmann::json::*is)() const noexcept, const char* what) {
    if (auto* v = get(key)) {
      OT_CHECK(((*v).*is)(), kOp, field(key), what, v->dump());
      T x = v->get<T>();
      OT_CHECK(x >= lo && x <= hi, kOp, field(key), detail::cat(what, " in [", lo, ", ", hi, "]"), x);
      out = x;
    }
  }
  const nlohmann::json& j_;
  std::string path_;
  std::set<std::string> seen_;
};

DType parse_dtype(Obj& o, const std::string& key, DType def) {
  const nlohmann::json* v = o.get(key);
  if (!v) return def;
  std::string s = v->is_string() ? v->get<std::string>() : "";
  if (s == "bf16") return DType::bf16;
  if (s == "fp16" || s == "f16") return DType::f16;
  if (s == "fp32" || s == "f32") return DType::f32;
  throw Error(kOp, o.field(key), "\"bf16\", \"fp16\" or \"fp32\"", v->dump());
}

}  // namespace demo_config_local

const char* dtype_key(DType t) { return t == DType::bf16 ? "bf16" : t == DType::f16 ? "fp16" : "fp32"; }

ExpertFormat expert_format(const MoeConfig& m) {
  const std::string& s = m.expert_weights;
  if (s == "int8") return {WeightFormat::int8, 0};
  if (s == "w8a8") return {WeightFormat::int8, 0, gemm::ActivationQuant::int8_per_token};
  if (s == "int4" || s == "int4-g64") return {WeightFormat::int4, 64};
  if (s == "int4-g32") return {WeightFormat::int4, 32};
  if (s == "int4-g128") return {WeightFormat::int4, 128};
  return {};
}

double DemoConfig::tolerance() const {
  return model.dtype == DType::bf16 ? verify.tol_bf16 : model.dtype == DType::f16 ? verify.tol_f16 : verify.tol_f32;
}

void validate(const DemoConfig& c) {
  using namespace demo_config_local;
  const auto& m = c.model;
  OT_CHECK(m.gdn.value_heads % m.gdn.key_heads == 0, kOp, "model.gdn.value_heads", detail::cat("a multiple of model.gdn.key_heads (", m.gdn.key_heads, ")"),
           m.gdn.value_heads);
  OT_CHECK(m.moe.top_k <= m.moe.experts, kOp, "model.moe.top_k", detail::cat("at most model.moe.experts (", m.moe.experts, ")"), m.moe.top_k);
  int64_t total = 0;
  for (int64_t l : c.run.prefill_lengths) total += l;
  OT_CHECK(total <= (int64_t(1) << 20), kOp, "run.prefill_lengths", "at most 2^20 tokens in total", total);
  OT_CHECK(m.moe.expert_weights == "float" || expert_format(m.moe).group_size >= 0, kOp, "model.moe.expert_weights", "float, int8, w8a8, int4, int4-g32, int4-g64 or int4-g128",
           m.moe.expert_weights);
  if (m.moe.quantised()) {
    const int64_t gs = expert_format(m.moe).group_size;
    OT_CHECK(gs == 0 || (m.hidden % gs == 0 && m.moe.intermediate % gs == 0), kOp, "model.moe.expert_weights",
             detail::cat("a group size dividing model.hidden (", m.hidden, ") and model.moe.intermediate (", m.moe.intermediate, ")"),
             m.moe.expert_weights);
  }
  if (m.moe.quantised() && m.moe.quantise_shared_expert && m.moe.shared_intermediate > 0) {
    const int64_t gs = expert_format(m.moe).group_size;
    OT_CHECK(gs == 0 || m.moe.shared_intermediate % gs == 0, kOp, "model.moe.quantise_shared_expert",
             detail::cat("a group size dividing model.moe.shared_intermediate (", m.moe.shared_intermediate, ")"), m.moe.expert_weights);
  }
  OT_CHECK(c.verify.layers <= m.layers, kOp, "verify.layers", detail::cat("at most model.layers (", m.layers, ")"), c.verify.layers);
}

DemoConfig config_from_json(const nlohmann::json& j) {
  using namespace demo_config_local;
  DemoConfig c;
  Obj top(j, "");
  {
    Obj m = top.child("model");
    m.integer("hidden", c.model.hidden, 8, 65536);
    m.integer("layers", c.model.layers, 1, 256);
    m.integer("vocab", c.model.vocab, 2, 1 << 20);
    m.number("rms_norm_eps", c.model.rms_norm_eps, 0, 1);
    c.model.dtype = parse_dtype(m, "dtype", c.model.dtype);
    Obj g = m.child("gdn");
    g.integer("key_heads", c.model.gdn.key_heads, 1, 256);
    g.integer("value_heads", c.model.gdn.value_heads, 1, 1024);
    g.integer("key_head_dim", c.model.gdn.key_head_dim, 1, 256);
    g.integer("value_head_dim", c.model.gdn.value_head_dim, 1, 256);
    g.finish();
    Obj e = m.child("moe");
    e.integer("experts", c.model.moe.experts, 1, 4096);
    e.integer("top_k", c.model.moe.top_k, 1, 1024);
    e.integer("intermediate", c.model.moe.intermediate, 1, 1 << 17);
    e.integer("shared_intermediate", c.model.moe.shared_intermediate, 0, 1 << 17);
    e.boolean("norm_topk_prob", c.model.moe.norm_topk_prob);
    e.text("expert_weights", c.model.moe.expert_weights);
    e.boolean("quantise_shared_expert", c.model.moe.quantise_shared_expert);
    e.finish();
    m.finish();
  }
  {
    Obj r = top.child("run");
    r.lengths("prefill_lengths", c.run.prefill_lengths, 1 << 20);
    r.integer("decode_steps", c.run.decode_steps, 0, 100000);
    int64_t seed = int64_t(c.run.seed);
    r.integer("seed", seed, 0, INT64_MAX);
    c.run.seed = uint64_t(seed);
    r.integer("threads", c.run.threads, 0, 4096);
    r.finish();
  }
  {
    Obj v = top.child("verify");
    v.boolean("enabled", c.verify.enabled);
    v.lengths("prefill_lengths", c.verify.prefill_lengths, 1 << 16);
    v.integer("decode_steps", c.verify.decode_steps, 0, 1000);
    v.integer("layers", c.verify.layers, 1, 256);
    Obj t = v.child("tolerance");
    t.number("bf16", c.verify.tol_bf16, 0, 1);
    t.number("fp16", c.verify.tol_f16, 0, 1);
    t.number("fp32", c.verify.tol_f32, 0, 1);
    t.finish();
    v.finish();
  }
  top.finish();
  validate(c);
  return c;
}

DemoConfig load_config(const std::string& path) {
  using namespace demo_config_local;
  std::ifstream f(path);
  OT_CHECK(f.good(), kOp, "FILE", "a readable JSON file", path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(kOp, "FILE", "valid JSON", detail::cat(path, ": ", e.what()));
  }
  return config_from_json(j);
}

nlohmann::json config_to_json(const DemoConfig& c) {
  const auto& m = c.model;
  nlohmann::json j;
  j["model"] = {{"hidden", m.hidden},
                {"layers", m.layers},
                {"vocab", m.vocab},
                {"rms_norm_eps", m.rms_norm_eps},
                {"dtype", dtype_key(m.dtype)},
                {"gdn",
                 {{"key_heads", m.gdn.key_heads},
                  {"value_heads", m.gdn.value_heads},
                  {"key_head_dim", m.gdn.key_head_dim},
                  {"value_head_dim", m.gdn.value_head_dim}}},
                {"moe",
                 {{"experts", m.moe.experts},
                  {"top_k", m.moe.top_k},
                  {"intermediate", m.moe.intermediate},
                  {"shared_intermediate", m.moe.shared_intermediate},
                  {"norm_topk_prob", m.moe.norm_topk_prob},
                  {"expert_weights", m.moe.expert_weights},
                  {"quantise_shared_expert", m.moe.quantise_shared_expert}}}};
  j["run"] = {{"prefill_lengths", c.run.prefill_lengths}, {"decode_steps", c.run.decode_steps}, {"seed", c.run.seed},
              {"threads", c.run.threads}};
  j["verify"] = {{"enabled", c.verify.enabled},
                 {"prefill_lengths", c.verify.prefill_lengths},
                 {"decode_steps", c.verify.decode_steps},
                 {"layers", c.verify.layers},
                 {"tolerance", {{"bf16", c.verify.tol_bf16}, {"fp16", c.verify.tol_f16}, {"fp32", c.verify.tol_f32}}}};
  return j;
}

}  // namespace ot::demo
