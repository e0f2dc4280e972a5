#!/usr/bin/env bash
# All set-up and every test: installs packages, builds release and sanitizer (ASan+UBSan) builds,
# runs the C++ suites (CTest) on both, checks the installed forms (CMake package, pkg-config, pip,
# .deb), then the Python tests on the package pip-installed from the release build.
set -euo pipefail
cd "$(dirname "$0")"
# Each stage's wall time, printed as it ends and summed up at the end (where ./test.sh spends it).
stage_times=()
last=$SECONDS
stage_done() { stage_times+=("$(printf '%5d s  %s' $((SECONDS - last)) "$1")"); last=$SECONDS; }
trap 'echo "== Time per stage"; printf "%s\n" "${stage_times[@]}"; echo "$SECONDS s in all"' EXIT
scripts/setup.sh
stage_done "set-up (packages)"
scripts/build.sh release
stage_done "release build"
scripts/build.sh asan
stage_done "ASan + UBSan build"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
# Two test processes at a time (the long families run as shards); OpenMP threads sleep instead of
# spinning when they wait, so the two do not take each other's cores. Timed tests reserve all slots.
jobs=$(nproc)
echo "== C++ tests (release)"
OMP_WAIT_POLICY=PASSIVE ctest --test-dir build/release --output-on-failure -j "$jobs"
stage_done "C++ tests (release)"
echo "== C++ tests (ASan + UBSan)"
OMP_WAIT_POLICY=PASSIVE ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --test-dir build/asan --output-on-failure -j "$jobs"
stage_done "C++ tests (ASan + UBSan)"
echo "== Install checks"
scripts/check_install.sh build/release
stage_done "install checks"
echo "== Python tests (the package as pip installs it, into build/venv)"
[ -x build/venv/bin/python ] || /usr/bin/python3 -m venv --system-site-packages build/venv
OT_BUILD_DIR="$PWD/build/release" build/venv/bin/pip install -q --no-build-isolation --no-deps --no-index ./python
build/venv/bin/python -m pytest -q python/tests
stage_done "Python tests"
