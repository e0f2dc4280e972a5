#include "src/core/knobs.h"

#include <algorithm>
#include <map>
#include <mutex>

#include "ot/error.h"

namespace ot::knobs {
namespace {
// Function-local: knobs register from static initialisers of other translation units.
std::map<std::string, Knob*>& registry() {
  static std::map<std::string, Knob*> r;
  return r;
}
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::string known_names() {
  std::string s;
  for (const auto& [n, k] : registry()) s += (s.empty() ? "" : ", ") + n;
  return s.empty() ? "(none)" : s;
}
Knob* lookup(const std::string& name) {
  auto it = registry().find(name);
  if (it == registry().end()) throw Error("knobs", "knob", "one of: " + known_names(), "'" + name + "'");
  return it->second;
}
}  // namespace

Knob::Knob(const char* name, int64_t default_value, int64_t min, int64_t max, const char* doc)
    : name_(name), doc_(doc), default_(default_value), min_(min), max_(max), value_(default_value) {
  std::lock_guard<std::mutex> g(registry_mutex());
  registry()[name] = this;
}

const Knob& find(const std::string& name) {
  std::lock_guard<std::mutex> g(registry_mutex());
  return *lookup(name);
}

int64_t get(const std::string& name) { return find(name).get(); }

void set(const std::string& name, int64_t value) {
  std::lock_guard<std::mutex> g(registry_mutex());
  Knob* k = lookup(name);
  OT_CHECK(value >= k->min_ && value <= k->max_, "knobs", name, detail::cat("a value in [", k->min_, ", ", k->max_, "]"), value);
  k->value_.store(value, std::memory_order_relaxed);
}

std::vector<const Knob*> all() {
  std::lock_guard<std::mutex> g(registry_mutex());
  std::vector<const Knob*> v;
  for (const auto& [n, k] : registry()) v.push_back(k);
  return v;
}

}  // namespace ot::knobs
