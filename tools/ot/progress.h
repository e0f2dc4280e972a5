// A progress bar for long runs (demo, benchmarks, training): drawn on stderr only when both stdout
// and stderr are terminals (so logs, pipes and tests stay clean), and only once the run has lasted
// `delay_s` seconds, so short runs print nothing. OT_PROGRESS=0 turns it off, OT_PROGRESS=1 forces
// it on (still only on a terminal). Call from one thread.
#pragma once
#include <cstdint>
#include <string>

namespace ot::cli {

class Progress {
 public:
  Progress(std::string label, int64_t total, double delay_s = 2.0);
  ~Progress();  // clears the bar
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void tick(int64_t n = 1);                  // advance by n units
  void set(int64_t done);                    // absolute position
  void set_label(const std::string& label);  // e.g. the phase now running
  void finish();                             // erase the bar (idempotent)
  // Whether a bar can be drawn at all here (terminal output, not disabled).
  static bool enabled();

 private:
  void draw(bool force);
  std::string label_;
  int64_t total_, done_ = 0;
  double delay_s_;
  int64_t start_ns_, last_draw_ns_ = 0;
  bool on_, shown_ = false;
};

}  // namespace ot::cli
