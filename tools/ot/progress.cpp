#include "progress.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace ot::cli {

static int64_t mono_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool Progress::enabled() {
  const char* env = std::getenv("OT_PROGRESS");
  if (env && env[0] == '0') return false;
  return isatty(STDOUT_FILENO) && isatty(STDERR_FILENO);
}

Progress::Progress(std::string label, int64_t total, double delay_s)
    : label_(std::move(label)), total_(std::max<int64_t>(total, 1)), delay_s_(delay_s), start_ns_(mono_ns()), on_(enabled()) {}

Progress::~Progress() { finish(); }

void Progress::tick(int64_t n) { set(done_ + n); }

void Progress::set(int64_t done) {
  done_ = std::min(done, total_);
  draw(false);
}

void Progress::set_label(const std::string& label) {
  label_ = label;
  draw(false);
}

void Progress::draw(bool force) {
  if (!on_) return;
  int64_t now = mono_ns();
  if (!shown_ && now - start_ns_ < int64_t(delay_s_ * 1e9)) return;
  if (!force && shown_ && now - last_draw_ns_ < 100'000'000) return;  // at most 10 redraws a second
  last_draw_ns_ = now;
  shown_ = true;
  constexpr int kWidth = 30;
  double frac = double(done_) / double(total_);
  int fill = int(frac * kWidth + 0.5);
  double elapsed = (now - start_ns_) / 1e9;
  char eta[32] = "";
  if (done_ > 0 && done_ < total_) std::snprintf(eta, sizeof eta, " eta %.0fs", elapsed / frac - elapsed);
  std::string bar(size_t(fill), '#');
  bar.append(size_t(kWidth - fill), '.');
  std::fprintf(stderr, "\r\033[K%s [%s] %3.0f%% %.1fs%s", label_.c_str(), bar.c_str(), 100 * frac, elapsed, eta);
  std::fflush(stderr);
}

void Progress::finish() {
  if (!shown_) return;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
  shown_ = false;
  on_ = false;
}

}  // namespace ot::cli
