#!/usr/bin/env bash
# All set-up and every test: installs packages, builds release and sanitizer (ASan+UBSan) builds,
# runs the C++ suites (CTest) on both, then the Python tests against the release build.
set -euo pipefail
cd "$(dirname "$0")"
scripts/setup.sh
scripts/build.sh release
scripts/build.sh asan
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
echo "== C++ tests (release)"
ctest --test-dir build/release --output-on-failure
echo "== C++ tests (ASan + UBSan)"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --test-dir build/asan --output-on-failure
if [ -d python/tests ] && ls python/tests/test_*.py >/dev/null 2>&1; then
  echo "== Python tests"
  OT_BUILD_DIR="$PWD/build/release" PYTHONPATH="$PWD/python" /usr/bin/python3 -m pytest -q python/tests
fi
