// PROVISIONAL: the peak measurement lands with the matrix engine (`ot peak`).
#include "bench_harness.h"

namespace ot::cli {
const MachinePeak& machine_peak() {
  static MachinePeak p;
  return p;
}
double matrix_peak_gflops(const std::string&, int) { return 0; }
double memory_peak_gbps(int) { return 0; }
}  // namespace ot::cli
