// Internal tuning knobs (not the public API): named integers with production defaults that kernels
// and drivers read once per call (a relaxed atomic load, never in an inner loop), so `ot bench
// --ab <knob>=<a>,<b>` can alternate two variants call by call inside one process (this VM's
// memory speed moves 5-15% between processes a minute apart). A knob stays only while both of its
// values are real tuning choices (docs/gemm.md, "In-process A/B"); a decided experiment removes it.
#pragma once
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace ot::knobs {

class Knob {
 public:
  // Registers the knob; define each one once, at namespace scope of the file that reads it.
  Knob(const char* name, int64_t default_value, int64_t min, int64_t max, const char* doc);
  Knob(const Knob&) = delete;
  Knob& operator=(const Knob&) = delete;
  int64_t get() const { return value_.load(std::memory_order_relaxed); }
  const char* name() const { return name_; }
  const char* doc() const { return doc_; }
  int64_t default_value() const { return default_; }
  int64_t min() const { return min_; }
  int64_t max() const { return max_; }

 private:
  friend void set(const std::string& name, int64_t value);
  const char *name_, *doc_;
  int64_t default_, min_, max_;
  std::atomic<int64_t> value_;
};

// The registered knob of this name; an unknown name is an ot::Error listing the known ones.
const Knob& find(const std::string& name);
int64_t get(const std::string& name);
// Sets a knob (ot::Error for an unknown name or a value outside [min, max]).
void set(const std::string& name, int64_t value);
// Every registered knob, by name.
std::vector<const Knob*> all();

// Sets a knob for the scope, then restores the value it had (tests reaching a path at small sizes).
class ScopedKnob {
 public:
  ScopedKnob(const std::string& name, int64_t value) : name_(name), prev_(get(name)) { set(name, value); }
  ~ScopedKnob() { set(name_, prev_); }
  ScopedKnob(const ScopedKnob&) = delete;
  ScopedKnob& operator=(const ScopedKnob&) = delete;

 private:
  std::string name_;
  int64_t prev_;
};

}  // namespace ot::knobs
