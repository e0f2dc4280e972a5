#!/usr/bin/env bash
# Builds the `fuzz` preset (clang, libFuzzer, ASan + UBSan) and runs every target in fuzz/ for a
# bounded time from its checked-in seed corpus; fails on the first crash, leak, timeout or
# mismatch with the reference (the reproducer is left in build/fuzz/artifacts/).
# Usage: scripts/fuzz.sh [seconds per target (default 20)] [target ...]
# FUZZ_RUNS=N stops a target after N executions (or the time bound, whichever comes first).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-20}
shift || true
scripts/setup.sh fuzz
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j "$(nproc)"
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in fuzz/*.cpp; do targets+=("$(basename "$f" .cpp)"); done
fi
art=build/fuzz/artifacts
mkdir -p "$art"
# One thread per OpenMP team member, parked when idle (the targets pick 1-3 threads per input).
export OMP_WAIT_POLICY=passive
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
for t in "${targets[@]}"; do
  corpus=build/fuzz/corpus/$t
  mkdir -p "$corpus"
  # New inputs go to the build tree; the checked-in seeds are read only.
  bound=(-max_total_time="$secs")
  [ -n "${FUZZ_RUNS:-}" ] && bound+=(-runs="$FUZZ_RUNS")
  echo "== fuzz_$t ($secs s${FUZZ_RUNS:+ or $FUZZ_RUNS runs})"
  log=$art/$t.log
  # Open MPI keeps allocations until exit (tests/ep/CMakeLists.txt): no leak checks for EP targets.
  opts=$ASAN_OPTIONS
  [[ $t == ep_* ]] && opts=${opts//detect_leaks=1/detect_leaks=0}
  if ! ASAN_OPTIONS=$opts build/fuzz/fuzz/fuzz_"$t" "${bound[@]}" -max_len=4096 -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
       -artifact_prefix="$art/$t-" "$corpus" "fuzz/corpus/$t" >"$log" 2>&1; then
    tail -n 60 "$log"
    echo "fuzz_$t FAILED (log: $log, reproducer: $art/$t-*)"
    exit 1
  fi
  grep -E '^stat::number_of_executed_units|^Done' "$log" | tail -n 2
done
echo "fuzz: all targets passed"
